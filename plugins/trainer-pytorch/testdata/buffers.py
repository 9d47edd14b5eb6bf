# A model with buffers (batch norm's running statistics, an int64 step
# counter) and a weight that is not contiguous (a transposed view).
import torch
from torch import nn

batch_size = 16


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(8)
        self.w = nn.Parameter(torch.randn(4, 8).t())  # [8, 4], not contiguous
        self.shift = nn.Parameter(torch.zeros(4, dtype=torch.float64))

    def forward(self, x):
        return self.norm(x) @ self.w + self.shift.float()


def data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(128, 8, generator=g)
    return (x, x[:, :4].argmax(1)), None


def model(cfg):
    return Net()


def optimizer(params, cfg):
    return torch.optim.SGD(params, lr=0.1)


loss = nn.CrossEntropyLoss()
