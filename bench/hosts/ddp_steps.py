#!/usr/bin/env python3
"""Runs the DDP peer (ddp_fashion_mnist.py) for a bounded number of steps.

Over a slow link a full epoch of DDP on a large model takes many minutes, so
the cross-host benchmark times a few of its steps instead: this runs the
peer's own training loop (its model, optimizer, DistributedDataParallel
and all-reduce, one rank per process) on the first STEPS x batch x world
training samples, one epoch, and evaluates on 100 test samples, so the
epoch line's elapsed_s is STEPS steps and an evaluation too small to matter.
Every rank then prints {"tx_bytes_steps": N}: what its host's --iface sent
from the end of the start-up (DDP's broadcast of the initial weights
included) to the end of the run, read from the kernel's counter.

  python3 ddp_steps.py --peer ddp_fashion_mnist.py --steps 12 -- --rank R --world W ...
"""
import argparse
import importlib.util
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", required=True, help="the DDP peer script")
    ap.add_argument("--steps", type=int, required=True, help="training steps of every rank")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="the peer's own arguments, after --")
    args = ap.parse_args()
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    spec = importlib.util.spec_from_file_location("ddp_peer", args.peer)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    # The peer's own parser reads the batch and world it will use.
    sys.argv = [args.peer] + rest
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--batch", type=int, default=64)
    probe.add_argument("--world", type=int, default=0)
    probe.add_argument("--iface", default="")
    known, _ = probe.parse_known_args(rest)
    if known.world < 1:
        sys.exit("ddp_steps.py: the peer's --world is required (one rank per process)")
    if not known.iface:
        sys.exit("ddp_steps.py: the peer's --iface is required (its byte counter is read)")
    counter = f"/sys/class/net/{known.iface}/statistics/tx_bytes"
    load = peer.load
    start = []

    def bounded(split):
        # The peer loads its data after building the model, DDP and the
        # optimizer, just before its first step.
        if split == "train":
            start.append(tx(counter))
        x, y = load(split)
        n = args.steps * known.batch * known.world if split == "train" else 100
        return x[:n].clone(), y[:n].clone()

    peer.load = bounded
    peer.main()
    print(json.dumps({"tx_bytes_steps": tx(counter) - start[0]}), flush=True)


def tx(path):
    with open(path) as f:
        return int(f.read())


if __name__ == "__main__":
    main()
