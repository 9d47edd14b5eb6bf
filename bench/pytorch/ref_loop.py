# The plain PyTorch loop bench/pytorch compares trainer-pytorch with: the
# trainer file's own model, optimizer, data and loss, trained in this one
# process as a user would without cohort (a shuffle per epoch, index_select
# batches, the same batch size and threads). Prints one JSON line with the
# seconds of each epoch.
#   ref_loop.py TRAINER_FILE EPOCHS THREADS
import importlib.util
import json
import sys
import time

import torch


class Cfg:
    rank, world_size, local_ranks, seed, args = 0, 1, 1, 1, {}


def main():
    path, epochs, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    spec = importlib.util.spec_from_file_location("user_trainer", path)
    user = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(user)
    cfg = Cfg()
    torch.manual_seed(cfg.seed)
    model = user.model(cfg)
    (x, y), _ = user.data(cfg)
    opt = user.optimizer([p for p in model.parameters() if p.requires_grad], cfg)
    bs, n = getattr(user, "batch_size", 64), x.shape[0]
    g = torch.Generator().manual_seed(cfg.seed)
    seconds = []
    for _ in range(epochs):
        start = time.perf_counter()
        order = torch.randperm(n, generator=g)
        for b in range(0, n, bs):
            idx = order[b:b + bs]
            xb, yb = x.index_select(0, idx), y.index_select(0, idx)
            opt.zero_grad()
            loss = user.loss(model(xb), yb)
            loss.backward()
            opt.step()
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"epoch_s": seconds}))


main()
