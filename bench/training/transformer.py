#!/usr/bin/env python3
"""Writes the benchmark's transformer encoder as a TorchScript file.

A small vision transformer for 28x28 images, built from PyTorch's own layers
and scripted as a user would (torch.jit.script(m).save(path)): the flat
[batch, 784] input is cut into 16 patches of 7x7, each embedded to 64 wide
with a learned position, then 2 nn.TransformerEncoderLayer (4 heads,
feed-forward 128, dropout 0.1, pre-LayerNorm), a final LayerNorm, the mean
over the patches and a Linear to 10 classes. The initial weights come from
--seed, so both sides of a comparison start from the same file.

  python3 transformer.py --seed 1 --out transformer-1.pt   # prints its parameter count
"""
import argparse

import torch
import torch.nn as nn


class PatchEncoder(nn.Module):
    def __init__(self, side: int = 28, patch: int = 7, width: int = 64, heads: int = 4,
                 ff: int = 128, layers: int = 2, classes: int = 10, dropout: float = 0.1):
        super().__init__()
        self.side = side
        self.patch = patch
        self.grid = side // patch
        self.embed = nn.Linear(patch * patch, width)
        self.position = nn.Parameter(torch.randn(1, self.grid * self.grid, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=ff, dropout=dropout,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        # [b, 784] -> [b, grid*grid, patch*patch], patches in row-major order.
        x = x.view(b, self.grid, self.patch, self.grid, self.patch).permute(0, 1, 3, 2, 4)
        x = x.reshape(b, self.grid * self.grid, self.patch * self.patch)
        h = self.encoder(self.embed(x) + self.position)
        return self.head(self.norm(h).mean(dim=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    m = torch.jit.script(PatchEncoder())
    m.save(args.out)
    print(sum(p.numel() for p in m.parameters()))


if __name__ == "__main__":
    main()
