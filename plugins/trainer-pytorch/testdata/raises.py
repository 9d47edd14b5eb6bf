# A trainer file whose model raises: Configure names this line.
import torch

batch_size = 4


def data(cfg):
    return (torch.zeros(8, 2), torch.zeros(8, dtype=torch.int64)), None


def model(cfg):
    raise ValueError("no model today")


def optimizer(params, cfg):
    return torch.optim.SGD(params, lr=0.1)


def loss(out, y):
    return torch.nn.functional.cross_entropy(out, y)
