#!/usr/bin/python3
"""ringattn.KVCache under mpirun against PyTorch float64 causal attention over all positions.

    PYTHONPATH=build/python mpirun -np N python3 tests/python/kv_cache_test.py

Every rank builds the whole q, k, v of S0 + K T positions from one seed; it prefills its shard of
the prompt (the positions KVCache.positions lists) and decodes K steps of T tokens (the same on
every rank). The prompt's O and LSE of its positions, and every step's O and LSE, must equal the
rows of dense causal (windowed) attention computed here in float64: f64 within 1e-10, f32 3e-4 of
max |ref| (a bf16 cache's O asked for in float32 with out_dtype); every rank's decode O must be bit
for bit the same. A bf16 cache returns O in bf16 by default: the float32 O rounded once, bit for
bit as torch's .to() rounds it. The merge by all-gather (merge="gather") is held to the same.
Then the bad calls: T = 0, a step whose q differs on one rank, a merge that is not one, a cache over
its capacity, a dtype that is not the cache's (on every rank, or on one), a prompt shard of the wrong
length on one rank, another merge on one rank, a call one rank cannot bind (an extra positional
argument, an unknown keyword, a missing argument, to the constructor or to a call), a prompt q of
3 dimensions on one rank, each the same error on every rank (none left waiting for a peer).
Keys holding -inf that leave a row only -inf scores give that row a NaN softmax, as torch's.
"""
import sys

import torch
from mpi4py import MPI

import ringattn

COMM = MPI.COMM_WORLD
RANK, N = COMM.rank, COMM.size


def reference(q, k, v, window):
    B, S, H, D = q.shape
    G = H // k.shape[2]
    k, v = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) / D ** 0.5
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    vis = j <= i
    if window:
        vis &= j > i - window
    s = s.masked_fill(~vis, float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, -1), v), torch.logsumexp(s, -1)


def case(name, dtype, S0, T, K, B=2, H=4, HKV=2, D=8, window=None, layout="auto", merge="allreduce"):
    S = S0 + K * T
    g = torch.Generator().manual_seed(S0 * 7 + T)
    q, k, v = (torch.randn(B, S, h, D, generator=g, dtype=torch.float64).to(dtype) for h in (H, HKV, HKV))
    o_ref, lse_ref = reference(q.double(), k.double(), v.double(), window)
    cache = ringattn.KVCache(B, H, HKV, D, dtype=dtype, layout=layout, window=window, capacity=S, merge=merge,
                             out_dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    pos = cache.positions(S0)
    o, lse = cache.prefill(q[:, pos], k[:, pos], v[:, pos], return_lse=True)
    tol = 1e-10 if dtype == torch.float64 else 3e-4
    peak = o_ref.abs().max().item()
    err = (o.double() - o_ref[:, pos]).abs().max().item() / peak
    err = max(err, (lse.double() - lse_ref[:, :, pos]).abs().max().item() / lse_ref.abs().max().item())
    same = True
    for j in range(K):
        sl = slice(S0 + j * T, S0 + (j + 1) * T)
        od, ld = cache.decode(q[:, sl], k[:, sl], v[:, sl], return_lse=True)
        err = max(err, (od.double() - o_ref[:, sl]).abs().max().item() / peak)
        err = max(err, (ld.double() - lse_ref[:, :, sl]).abs().max().item() / lse_ref.abs().max().item())
        every = COMM.allgather(od.numpy().tobytes())
        same = same and all(x == every[0] for x in every)
    ok = COMM.allreduce(int(err <= tol and same and cache.length == S), op=MPI.MIN) == 1
    if RANK == 0:
        print(f"{'ok ' if ok else 'BAD'} N={N} {name}: max rel err {err:.2e} (tol {tol:.0e}), identical on every "
              f"rank: {same}", flush=True)
    return ok


def loaded(name, dtype=torch.float32, S0=23, T=2, K=3, B=1, H=4, HKV=2, D=8):
    """A prompt's K/V loaded without attending, then decode steps: the same rows of causal attention."""
    S = S0 + K * T
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(B, S, h, D, generator=g, dtype=torch.float64).to(dtype) for h in (H, HKV, HKV))
    o_ref, _ = reference(q.double(), k.double(), v.double(), None)
    cache = ringattn.KVCache(B, H, HKV, D, dtype=dtype)
    pos = cache.positions(S0)
    cache.load(k[:, pos], v[:, pos])
    err = 0.0
    for j in range(K):
        sl = slice(S0 + j * T, S0 + (j + 1) * T)
        od = cache.decode(q[:, sl], k[:, sl], v[:, sl])
        err = max(err, (od.double() - o_ref[:, sl]).abs().max().item() / o_ref.abs().max().item())
    ok = COMM.allreduce(int(err <= 3e-4 and cache.length == S), op=MPI.MIN) == 1
    if RANK == 0:
        print(f"{'ok ' if ok else 'BAD'} N={N} {name}: max rel err {err:.2e} (tol 3e-04)", flush=True)
    return ok


def rounding(name, dtype, S0=19, T=3, B=1, H=2, HKV=1, D=8):
    """O of a 16-bit cache in its dtype (the default) is the float32 O rounded once."""
    g = torch.Generator().manual_seed(S0)
    q, k, v = (torch.randn(B, S0 + T, h, D, generator=g).to(dtype) for h in (H, HKV, HKV))
    outs = []
    for out_dtype in (None, torch.float32):
        cache = ringattn.KVCache(B, H, HKV, D, dtype=dtype, out_dtype=out_dtype)
        pos = cache.positions(S0)
        outs += [cache.prefill(q[:, pos], k[:, pos], v[:, pos]), cache.decode(q[:, S0:], k[:, S0:], v[:, S0:])]
    ok = all(o.dtype == dtype for o in outs[:2]) and all(o.dtype == torch.float32 for o in outs[2:]) \
        and all(torch.equal(a.view(torch.int16), b.to(dtype).view(torch.int16)) for a, b in zip(outs[:2], outs[2:]))
    ok = COMM.allreduce(int(ok), op=MPI.MIN) == 1
    if RANK == 0:
        print(f"{'ok ' if ok else 'BAD'} N={N} {name}: prefill and decode O in {dtype}, the float32 O rounded once",
              flush=True)
    return ok


def infinite_keys(name, dtype, S0=6, T=2, K=2, B=1, H=2, HKV=1, D=8):
    """Keys holding -inf where every query is positive (a prompt key and a decoded one), window 1: each
    of their rows sees that key alone, so its only score is -inf and its softmax NaN (O and LSE), as
    torch's; every other row is finite and right."""
    S = S0 + K * T
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(B, S, h, D, generator=g, dtype=torch.float64) for h in (H, HKV, HKV))
    for pos, d in ((2, 5), (S0 + 1, 3)):
        k[0, pos, 0, d] = -float("inf")
        q[0, :, :, d] = q[0, :, :, d].abs() + 0.1
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    o_ref, lse_ref = reference(q.double(), k.double(), v.double(), 1)
    cache = ringattn.KVCache(B, H, HKV, D, dtype=dtype, window=1, capacity=S)
    pos = cache.positions(S0)
    o, lse = cache.prefill(q[:, pos], k[:, pos], v[:, pos], return_lse=True)
    outs = [(o, lse, o_ref[:, pos], lse_ref[:, :, pos])]
    for j in range(K):
        sl = slice(S0 + j * T, S0 + (j + 1) * T)
        od, ld = cache.decode(q[:, sl], k[:, sl], v[:, sl], return_lse=True)
        outs.append((od, ld, o_ref[:, sl], lse_ref[:, :, sl]))
    same, err, nan_rows = True, 0.0, 0
    for step, (x, lx, r, lr) in enumerate(outs):
        x, lx = x.double(), lx.double()
        same = same and torch.equal(torch.isfinite(x), torch.isfinite(r)) and torch.equal(torch.isfinite(lx),
                                                                                         torch.isfinite(lr))
        same = same and bool((lx[lr == -float("inf")] == -float("inf")).all())  # LSE -inf, as torch's
        if step == 0 or RANK == 0:  # the prompt's rows are this rank's; a step's are every rank's
            nan_rows += int((~torch.isfinite(lr)).sum())
        f = torch.isfinite(r)
        err = max(err, (x[f] - r[f]).abs().max().item() if f.any() else 0.0)
    planted = COMM.allreduce(nan_rows) == 2 * H  # both planted rows, every head, on some rank
    ok = COMM.allreduce(int(same and err <= 1e-10 and planted), op=MPI.MIN) == 1
    if RANK == 0:
        print(f"{'ok ' if ok else 'BAD'} N={N} {name}: NaN exactly where torch's, max err {err:.2e} (tol 1e-10)",
              flush=True)
    return ok


def raises(name, fn, needle):
    try:
        fn()
        msg = None
    except ValueError as e:
        msg = str(e)
    msgs = COMM.allgather(msg)
    ok = all(m is not None and needle in m for m in msgs) and len(set(msgs)) == 1
    if RANK == 0:
        print(f"{'ok ' if ok else 'BAD'} N={N} raises: {name}: {msgs[0]!r}", flush=True)
    return ok


def prompt_len_on_one_rank(x, kv):
    """prefill with prompt_len given on the last rank only: every rank still joins the same
    collectives, and O is bit for bit the one of prompt_len given everywhere."""
    outs = []
    for given in (lambda: True, lambda: RANK == N - 1):
        c = ringattn.KVCache(1, 2, 1, 8, dtype=torch.float64, timeout=30)
        outs.append(c.prefill(x, kv, kv, **({"prompt_len": 10} if given() else {})))
    ok = COMM.allreduce(int(torch.equal(outs[0], outs[1])), op=MPI.MIN) == 1
    if RANK == 0:
        print(f"{'ok ' if ok else 'BAD'} N={N} prompt_len given on the last rank only: the same O", flush=True)
    return ok


def main():
    torch.set_num_threads(1)
    good = [case("f64 GQA, T=4, zigzag", torch.float64, 37, 4, 3),
            case("f32 window 6, T=1, striped", torch.float32, 29, 1, 5, window=6, layout="striped"),
            case("bf16, T=2, contiguous", torch.bfloat16, 24, 2, 2, layout="contiguous"),
            case("f64 merged by gather, T=2", torch.float64, 21, 2, 3, merge="gather"),
            loaded("f32 prompt loaded, then decoded"),
            rounding("bf16 O", torch.bfloat16), rounding("f16 O", torch.float16),
            infinite_keys("-inf keys, window 1", torch.float64)]
    cache = ringattn.KVCache(1, 2, 1, 8, dtype=torch.float64, capacity=12)
    pos = cache.positions(10)
    x = torch.randn(1, 10, 2, 8, dtype=torch.float64)
    kv = torch.randn(1, 10, 1, 8, dtype=torch.float64)
    cache.prefill(x[:, pos], kv[:, pos], kv[:, pos])
    t = lambda n, h, dt=torch.float64: torch.ones(1, n, h, 8, dtype=dt)
    good += [raises("T = 0", lambda: cache.decode(t(0, 2), t(0, 1), t(0, 1)), "T = 0"),
             raises("q differs on one rank", lambda: cache.decode(t(1, 2) * (2 if RANK == N - 1 else 1), t(1, 1),
                                                                  t(1, 1)), "different q, k or v")
             if N > 1 else True,
             raises("merge", lambda: ringattn.KVCache(1, 2, 1, 8, merge="tree"), "merge: 'tree' is not a merge"),
             # the cache's own arguments named, not attention()'s
             raises("batch 0", lambda: ringattn.KVCache(0, 2, 1, 8), "batch: 0 is not a positive size"),
             raises("heads over kv_heads", lambda: ringattn.KVCache(1, 3, 2, 8), "kv_heads: H=3"),
             raises("prompt_len 0", lambda: cache.positions(0), "prompt_len: 0 is not a positive size"),
             raises("over capacity", lambda: cache.decode(t(3, 2), t(3, 1), t(3, 1)), "capacity"),
             raises("another dtype", lambda: cache.decode(t(1, 2, torch.float32), t(1, 1, torch.float32),
                                                          t(1, 1, torch.float32)), "dtype"),
             raises("another dtype on one rank", lambda: cache.decode(
                 t(1, 2, torch.float32 if RANK == N - 1 else torch.float64), t(1, 1), t(1, 1)),
                 f"q: rank {N - 1} gave a float32 tensor on cpu"),
             raises("a dtype given as a string", lambda: ringattn.KVCache(1, 2, 1, 8, dtype="float32"),
                    "dtype: 'float32' is a str (expected a torch.dtype"),
             raises("a prompt shard of the wrong length on one rank", lambda: ringattn.KVCache(
                 1, 2, 1, 8, dtype=torch.float64).prefill(*(t(len(pos) + (RANK == N - 1), h) for h in (2, 1, 1)),
                                                          prompt_len=10), "expected [1, "),
             raises("a bad dtype on one rank", lambda: ringattn.KVCache(
                 1, 2, 1, 8, dtype=torch.int32 if RANK == N - 1 else torch.float64), "dtype"),
             raises("an unhashable dtype on one rank", lambda: ringattn.KVCache(
                 1, 2, 1, 8, dtype=[torch.float64] if RANK == N - 1 else torch.float64), "dtype"),
             # a call one rank cannot bind raises on every rank, as attention()'s does, not a TypeError there alone
             raises("a keyword named self on the last rank", lambda: cache.decode(
                 t(1, 2), t(1, 1), t(1, 1), **({"self": 1} if RANK == N - 1 else {})),
                 "KVCache.decode: multiple values for argument 'self'"),
             raises("a positional return_lse on the last rank", lambda: cache.decode(
                 t(1, 2), t(1, 1), t(1, 1), *((True,) if RANK == N - 1 else ())),
                 "KVCache.decode: too many positional arguments"),
             raises("an unknown keyword to prefill on the last rank", lambda: ringattn.KVCache(
                 1, 2, 1, 8, dtype=torch.float64, timeout=30).prefill(
                     *(t(len(pos), h) for h in (2, 1, 1)), **({"prompt": 10} if RANK == N - 1 else {})),
                 "KVCache.prefill: got an unexpected keyword argument 'prompt'"),
             raises("load without v on the last rank", lambda: ringattn.KVCache(
                 1, 2, 1, 8, dtype=torch.float64, timeout=30).load(
                     *(t(len(pos), 1) for _ in range(1 if RANK == N - 1 else 2)), prompt_len=10),
                 "KVCache.load: missing a required argument: 'v'"),
             raises("KVCache() without head_dim on the last rank", lambda: ringattn.KVCache(
                 1, 2, 1, *(() if RANK == N - 1 else (8,)), timeout=30),
                 "ringattn.KVCache(): missing a required argument: 'head_dim'"),
             raises("timeout=10**400 on the last rank", lambda: ringattn.KVCache(
                 1, 2, 1, 8, timeout=10**400 if RANK == N - 1 else 30), "timeout: 1000"),
             # without prompt_len, the prompt's length is counted only once every rank's q can be read
             raises("a prompt q of 3 dimensions on the last rank", lambda: ringattn.KVCache(
                 1, 2, 1, 8, dtype=torch.float64, timeout=30).prefill(
                     *(t(len(pos), h)[0] if RANK == N - 1 and h == 2 else t(len(pos), h) for h in (2, 1, 1))),
                 ", 2, 8] (expected 4 dimensions: [batch, positions, heads, head_dim])"),
             prompt_len_on_one_rank(x[:, pos], kv[:, pos]),
             raises("another merge on one rank", lambda: ringattn.KVCache(
                 1, 2, 1, 8, dtype=torch.float64, merge="gather" if RANK == N - 1 else "allreduce").prefill(
                     *(t(len(pos), h) for h in (2, 1, 1)), prompt_len=10), "ranks disagree on merge")
             if N > 1 else True]
    ok = all(good)
    if RANK == 0:
        print("all cases passed" if ok else "failures")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
