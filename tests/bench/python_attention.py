#!/usr/bin/python3
"""Forward + backward of ringattn.attention on this rank's shard, timed (a benchmark, not a test).

    PYTHONPATH=build/python mpirun -np 2 python3 tests/bench/python_attention.py --seq 8192 \
        --heads 8 --head-dim 64 --iters 3 --warmup 1

One iteration: a barrier, then o = ringattn.attention(q, k, v, ...) and o.backward(dout), the
whole call as a training step makes it (plan agreement, loading the shard, both passes, the
gradients into q.grad, k.grad, v.grad). The time of an iteration is the slowest rank's; rank 0
prints the median over --iters after --warmup as JSON {"forward_backward_s": ..., "iters": [...]}.
"""

import argparse
import json
import statistics
import time

import torch
from mpi4py import MPI

import ringattn


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--layout", default="contiguous")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    L = len(ringattn.positions(a.seq, comm.size, comm.rank, a.layout))
    g = torch.Generator().manual_seed(comm.rank)
    q, k, v, dout = (torch.randn(a.batch, L, a.heads, a.head_dim, generator=g) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    times = []
    for it in range(a.warmup + a.iters):
        for t in (q, k, v):
            t.grad = None
        comm.Barrier()
        t0 = time.perf_counter()
        o = ringattn.attention(q, k, v, seq_len=a.seq, causal=a.causal, layout=a.layout, comm=comm)
        o.backward(dout)
        dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if it >= a.warmup:
            times.append(dt)
    if comm.rank == 0:
        print(json.dumps({"forward_backward_s": statistics.median(times), "iters": times}))


if __name__ == "__main__":
    main()
