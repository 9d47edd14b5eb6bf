# A model with a buffer of a dtype the arena does not hold.
import torch
from torch import nn

batch_size = 4


class Net(nn.Linear):
    def __init__(self):
        super().__init__(2, 2)
        self.register_buffer("mask", torch.ones(2, dtype=torch.uint8))


def data(cfg):
    return (torch.randn(8, 2), torch.tensor([0, 1] * 4)), None


def model(cfg):
    return Net()


def optimizer(params, cfg):
    return torch.optim.SGD(params, lr=0.1)


loss = nn.CrossEntropyLoss()
