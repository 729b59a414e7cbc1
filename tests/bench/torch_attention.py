#!/usr/bin/python3
"""PyTorch eager attention on CPU, forward + backward, the baseline for `scripts/bench.py vs-torch`.

Plain matmul, softmax and autograd (no fused kernel), float32, threads = --threads. Prints one
JSON object: median forward and backward seconds over --iters after one warm-up.
"""
import argparse
import math

import torch
from bench_timing import print_result, time_forward_backward


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

    def forward():
        s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(D))
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), v)

    fwd, bwd = time_forward_backward(forward, (q, k, v), dout, a.iters)
    print_result(fwd, bwd, B, S, H, D, a.causal, threads=a.threads, torch=torch.__version__)


if __name__ == "__main__":
    main()
