# A small trainer file for the tests: a two-layer net on synthetic data
# that every rank makes alike from the run's seed.
import torch
from torch import nn

batch_size = 32


def data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    w = torch.randn(16, 4, generator=g)
    x = torch.randn(640, 16, generator=g)
    y = (x @ w).argmax(1)
    return (x[:512], y[:512]), (x[512:], y[512:])


def model(cfg):
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def optimizer(params, cfg):
    if cfg.args.get("optimizer") == "adamw":
        return torch.optim.AdamW(params, lr=cfg.args.get("lr", 0.01))
    return torch.optim.SGD(params, lr=cfg.args.get("lr", 0.1), momentum=0.9)


loss = nn.CrossEntropyLoss()
