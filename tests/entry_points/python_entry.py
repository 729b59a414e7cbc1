"""One attention call through the Python package, for entry_points_test.py (under mpirun).

The options come as key=value arguments named as cpp_entry.cpp takes them; the shape becomes the
tensors' (q [B, L, H, D], k, v [B, L, HKV, D], L from ringattn.positions under the same layout
rule). Rank 0 prints "accepted" or "error: MSG"; the exit code is 0 or 2.
"""
import sys

import torch
from mpi4py import MPI

import ringattn

DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}


def main():
    comm = MPI.COMM_WORLD
    a = dict(seq="16", batch="1", heads="4", kv_heads="4", head_dim="8", dtype="f32", causal="0")
    for arg in sys.argv[1:]:
        key, value = arg.split("=", 1)
        a[key] = value
    ints = lambda key: [int(x) for x in a[key].split(",")] if key in a else None
    num = lambda key, conv: conv(a[key]) if key in a else None
    S, B, H, HKV, D = (int(a[k]) for k in ("seq", "batch", "heads", "kv_heads", "head_dim"))
    causal = a["causal"] == "1"
    window = num("window", int)
    try:  # this rank's L under the layout the call resolves; any valid L when the layout is refused
        L = len(ringattn.positions(S, comm.size, comm.rank, a.get("layout", "auto"), ints("partition"),
                                   causal=causal, window=window))
    except (ValueError, TypeError):
        L = max(S // comm.size, 0)
    dtype = DTYPES.get(a["dtype"], torch.float32)
    q = torch.zeros(max(B, 0), L, max(H, 0), max(D, 0), dtype=dtype)
    k = torch.zeros(max(B, 0), L, max(HKV, 0), max(D, 0), dtype=dtype)
    try:
        ringattn.attention(q, k, k.clone(), seq_len=S, causal=causal, window=window,
                           doc_lens=ints("doc_lens"), layout=a.get("layout", "auto"),
                           partition=ints("partition"), scale=num("scale", float), rope=num("rope", float),
                           strategy=a.get("strategy", "ring"), ulysses_degree=num("ulysses_degree", int),
                           softcap=num("softcap", float), cu_seqlens=ints("cu_seqlens"),
                           precision=a.get("precision", "f32"),
                           sinks=torch.tensor([float(x) for x in a["sinks"].split(",")], dtype=torch.float64)
                           if "sinks" in a else None, comm=comm)
    except ValueError as e:
        if comm.rank == 0:
            print(f"error: {e}", flush=True)
        return 2
    if comm.rank == 0:
        print("accepted", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
