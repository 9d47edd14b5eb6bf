"""Evaluates exported models (a cohort run's OUT/model/trainer/model.pt) on the
Fashion-MNIST test split with PyTorch alone, as a user would: prints each
model's accuracy in percent, one a line. Inputs are scaled as the trainer
scales them (pixels / 255), shaped [N, 1, 28, 28]: the MLP flattens them.

    python3 eval_exported.py /usr/share/datasets/fashion-mnist OUT/model/trainer/model.pt"""
import gzip
import sys

import numpy as np
import torch


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main(data_dir, model_paths):
    images = idx(f"{data_dir}/t10k-images-idx3-ubyte.gz")
    labels = idx(f"{data_dir}/t10k-labels-idx1-ubyte.gz")
    x = torch.from_numpy(images.astype(np.float32) / 255).reshape(len(images), 1, 28, 28)
    for path in model_paths:
        model = torch.jit.load(path)
        model.eval()
        with torch.no_grad():
            pred = model(x).argmax(1).numpy()
        print(f"{100 * (pred == labels).mean():.2f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
