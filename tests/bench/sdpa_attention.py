#!/usr/bin/python3
"""PyTorch 2.x scaled_dot_product_attention on CPU, forward + backward, the baseline of
`scripts/bench.py vs-sdpa` (scripts/bench_sdpa.sh runs it in a Debian 13 chroot).

torch.nn.functional.scaled_dot_product_attention (PyTorch picks its CPU kernel: the fused
flash-attention one for these shapes), float32 or bfloat16, B=1, threads = --threads. Prints one
JSON object: median forward and backward seconds over --iters after one warm-up, the backend
flags and the torch version. Needs torch >= 2.1 (SDPA's CPU backward).
"""
import argparse

import torch
import torch.nn.functional as F
from bench_timing import print_result, time_forward_backward


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dt = torch.float32 if a.dtype == "f32" else torch.bfloat16
    S, H, D = a.seq, a.heads, a.head_dim
    q, k, v = (torch.randn(1, H, S, D, dtype=dt, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, H, S, D, dtype=dt)
    fwd, bwd = time_forward_backward(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=a.causal),
                                     (q, k, v), dout, a.iters)
    print_result(fwd, bwd, 1, S, H, D, a.causal, threads=torch.get_num_threads(), torch=torch.__version__,
                 dtype=a.dtype)


if __name__ == "__main__":
    main()
