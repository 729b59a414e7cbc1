"""What the Python tests under mpirun share: the attention mask of the float64 references, the
error measure, and a verdict agreed by every rank.

The tests import it from their own directory: `python3 tests/python/X_test.py` puts that
directory first on sys.path, under mpirun too.
"""

import math

import torch
from mpi4py import MPI

COMM = MPI.COMM_WORLD
RANK, N = COMM.rank, COMM.size


def visible(S, causal, window, doc_lens):
    """[S, S] bool: query i sees key j (causal, a sliding window of `window` keys, documents)."""
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    m = torch.ones(S, S, dtype=torch.bool)
    if causal or window:
        m &= j <= i
    if window:
        m &= j > i - window
    if doc_lens:
        doc = torch.repeat_interleave(torch.arange(len(doc_lens)), torch.tensor(doc_lens))
        m &= doc[:, None] == doc[None, :]
    return m


def rel_error(x, ref):
    """max |x - ref| relative to max |ref|; inf when x holds a NaN or an infinity."""
    peak = ref.abs().max().item() if ref.numel() else 0.0
    if x.numel() == 0:
        return 0.0
    err = (x.double() - ref).abs().max().item()
    return err / max(peak, 1e-300) if math.isfinite(err) else math.inf


def agreed(name, ok, detail=""):
    """ok on every rank; rank 0 prints the verdict, with every rank's detail when it is BAD."""
    all_ok = COMM.allreduce(int(bool(ok)), op=MPI.MIN) == 1
    details = COMM.gather(detail, root=0)
    if RANK == 0:
        print(f"{'ok ' if all_ok else 'BAD'} N={N} {name:<58} {details[0] if all_ok else details}", flush=True)
    return all_ok
