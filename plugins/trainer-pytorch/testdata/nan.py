# A trainer file whose loss turns NaN.
import torch

batch_size = 4


def data(cfg):
    return (torch.randn(8, 2), torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])), None


def model(cfg):
    return torch.nn.Linear(2, 2)


def optimizer(params, cfg):
    return torch.optim.SGD(params, lr=0.1)


def loss(out, y):
    return torch.nn.functional.cross_entropy(out, y) * float("nan")
