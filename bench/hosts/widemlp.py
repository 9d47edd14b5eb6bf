#!/usr/bin/env python3
"""Writes the cross-host benchmark's wide MLP as a TorchScript file.

A model large enough that moving its gradients costs more than computing
them on these links: 784 -> 2048 -> ReLU -> 2048 -> ReLU -> 10, 5,824,522
parameters (23.3 MB as float32), built from nn.Linear and scripted as a user
would (torch.jit.script(m).save(path)). Its initial weights come from --seed,
so both sides of a comparison start from the same file.

  python3 widemlp.py --seed 1 --out wide-1.pt   # prints its parameter count
"""
import argparse

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    w = args.width
    m = torch.jit.script(nn.Sequential(nn.Linear(784, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10)))
    m.save(args.out)
    print(sum(p.numel() for p in m.parameters()))


if __name__ == "__main__":
    main()
