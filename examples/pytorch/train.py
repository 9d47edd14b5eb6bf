# cohort's default model, an MLP (784-256-10, SGD with momentum) on
# Fashion-MNIST, as plain PyTorch: `trainer "pytorch"` trains what this file
# defines. cfg carries the rank, the run's seed and the block's args.
import torch
from torch import nn

from cohort_plugin.data import load_idx

batch_size = 64


def data(cfg):
    d = cfg.args.get("data", "/usr/share/datasets/fashion-mnist")

    def split(name):
        x = load_idx(f"{d}/{name}-images-idx3-ubyte.gz").flatten(1).float().div(255)
        return x, load_idx(f"{d}/{name}-labels-idx1-ubyte.gz").long()

    return split("train"), split("t10k")


def model(cfg):
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))


def optimizer(params, cfg):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


loss = nn.CrossEntropyLoss()
