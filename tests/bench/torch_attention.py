#!/usr/bin/python3
"""PyTorch eager attention on CPU, forward + backward, the baseline for `scripts/bench.py vs-torch`.

Plain matmul, softmax and autograd (no fused kernel), float32, threads = --threads. Prints one
JSON object: median forward and backward seconds over --iters after one warm-up.
"""
import argparse
import json
import math
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    B, S, H, D = a.batch, a.seq, a.heads, a.head_dim
    q = torch.randn(B, H, S, D, requires_grad=True)
    k = torch.randn(B, H, S, D, requires_grad=True)
    v = torch.randn(B, H, S, D, requires_grad=True)
    dout = torch.randn(B, H, S, D)
    mask = torch.ones(S, S, dtype=torch.bool).tril() if a.causal else None
    fwd, bwd = [], []
    for it in range(a.iters + 1):
        for t in (q, k, v):
            t.grad = None
        t0 = time.perf_counter()
        s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(D))
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        o = torch.matmul(torch.softmax(s, dim=-1), v)
        t1 = time.perf_counter()
        o.backward(dout)
        t2 = time.perf_counter()
        if it > 0:  # the first iteration warms up
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
        del s, o
    flops = 4.0 * B * S * S * H * D * (0.5 if a.causal else 1.0)
    print(json.dumps({"forward_s": statistics.median(fwd), "backward_s": statistics.median(bwd),
                      "flops_forward": flops, "flops_backward": 2.5 * flops, "threads": a.threads,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
