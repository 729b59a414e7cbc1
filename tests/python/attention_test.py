#!/usr/bin/python3
"""ringattn.attention under mpirun against a whole-sequence PyTorch autograd reference.

    PYTHONPATH=build/python mpirun -np N python3 tests/python/attention_test.py [-k NAME]

Every rank builds the whole q, k, v, dO from one seed, computes the reference (float64 autograd
over the whole sequence, mask materialised, no code shared with ringattn) and slices it to its
own positions; it runs ringattn.attention on its shard and compares O, LSE, dq, dk, dv.
Tolerances relative to max |ref|: f64 1e-10, f32 3e-4. bf16 and f16 inputs give O in their own
dtype: it must be the float32 O (out_dtype=torch.float32, checked at 3e-4) rounded once, bit for
bit as torch's .to() rounds it, and within one ulp of torch's rounding of the float64 reference;
its backward takes the 16-bit gradient autograd gives it. Inside torch.autocast("cpu"), float32
inputs must give what the same inputs cast to bfloat16 by hand give. Then the bad arguments: each must raise
ringattn.InputError with the same message on every rank, and the next call must still work.
Exit 0 only when every case passes on every rank.
"""

import argparse
import math
import sys
import traceback

import torch
from mpi4py import MPI

import ringattn
from ringattn import _ringattn
from mpi_checks import rel_error, visible

TOL = {torch.float64: 1e-10, torch.float32: 3e-4, torch.bfloat16: 3e-4, torch.float16: 3e-4}
# 16-bit storage computes in float32 (O, LSE at float32's tolerance, against the reference on the
# rounded inputs); q.grad, k.grad, v.grad come back in the inputs' dtype, rounded once: half an ulp
# (at most bf16 2^-8, f16 2^-11 of the value) on top.
TOL_GRAD = {**TOL, torch.bfloat16: 2.0 ** -8 + 3e-4, torch.float16: 2.0 ** -11 + 3e-4}
ACCUM = {torch.float64: torch.float64}  # otherwise float32
MANTISSA = {torch.bfloat16: (7, -126), torch.float16: (10, -14)}  # fraction bits, smallest normal exponent
COMM = MPI.COMM_WORLD
RANK, N = COMM.rank, COMM.size


# ---- the reference ----------------------------------------------------------------------------

def rope_ref(x, theta):
    """Rotate-half RoPE of x [B, S, heads, D] at positions 0..S-1."""
    B, S, Hx, D = x.shape
    half = D // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / D)
    ang = torch.arange(S, dtype=torch.float64)[:, None] * inv[None, :]  # [S, D/2]
    cos, sin = torch.cos(ang)[None, :, None, :], torch.sin(ang)[None, :, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def reference(q, k, v, causal=False, window=None, doc_lens=None, scale=None, rope=None):
    """O [B, S, H, D], LSE [B, H, S] of whole float64 tensors (autograd-able)."""
    B, S, H, D = q.shape
    G = H // k.shape[2]
    if rope is not None:
        q, k = rope_ref(q, rope), rope_ref(k, rope)
    kk, vv = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
    sc = (1.0 / math.sqrt(D)) if scale is None else scale
    s = torch.einsum("bihd,bjhd->bhij", q, kk) * sc
    s = s.masked_fill(~visible(S, causal, window, doc_lens), float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bhij,bjhd->bihd", p, vv), torch.logsumexp(s, dim=-1)


# ---- one case ---------------------------------------------------------------------------------

def ulps(x, ref):
    """max |x - r| in units of r's ulp, r = ref rounded by torch to x's 16-bit dtype."""
    if x.numel() == 0:
        return 0.0
    bits, emin = MANTISSA[x.dtype]
    r = ref.to(x.dtype).double()
    _, e = torch.frexp(r)  # r = m 2^e, 0.5 <= |m| < 1: r's exponent is e - 1 (zero: e = 0)
    ulp = torch.ldexp(torch.ones_like(r), (torch.clamp(e - 1, min=emin) - bits).double())
    return ((x.double() - r).abs() / ulp).max().item()


def run_case(name, *, S, B=1, H=2, HKV=None, D=8, dtype=torch.float64, layout="contiguous",
             partition=None, causal=False, window=None, doc_lens=None, scale=None, rope=None,
             strategy="ring", ulysses_degree=None, comm=COMM, noncontiguous=False, seed=0, expect_reuse=None,
             hold_plan_on=None, layout_in_call=True, out_dtype=None):
    HKV = HKV or H
    g = torch.Generator().manual_seed(seed)
    full = [torch.randn(B, S, h, D, generator=g, dtype=torch.float64).to(dtype).double()
            for h in (H, HKV, HKV, H)]
    qf, kf, vf = (t.clone().requires_grad_(True) for t in full[:3])
    dof = full[3]
    o_ref, lse_ref = reference(qf, kf, vf, causal, window, doc_lens, scale, rope)
    (o_ref * dof).sum().backward()

    pos = torch.from_numpy(ringattn.positions(S, comm.size, comm.rank, layout, partition))
    def mine(t):
        return t[:, pos].detach().to(dtype)
    if noncontiguous:  # [B, L, heads, D] views of [B, heads, L, D] storage
        def mine(t):  # noqa: F811
            return t[:, pos].detach().to(dtype).transpose(1, 2).contiguous().transpose(1, 2)
    q, k, v = (mine(t).requires_grad_(True) for t in (qf, kf, vf))
    if noncontiguous:
        assert not q.is_contiguous()
    args = dict(seq_len=S, causal=causal, window=window, doc_lens=doc_lens, layout=layout,
                partition=partition, scale=scale, rope=rope, strategy=strategy, ulysses_degree=ulysses_degree,
                comm=comm)
    if out_dtype is not None:
        args["out_dtype"] = out_dtype
    if not layout_in_call:  # attention()'s default layout must be the one the positions came from
        del args["layout"]
    busy = None
    if hold_plan_on is not None:  # the same call first, its plan kept busy on one rank only
        o_busy = ringattn.attention(q, k, v, **args)
        busy = o_busy if comm.rank == hold_plan_on else None
        del o_busy
    reused = _ringattn.plans_reused()
    o, lse = ringattn.attention_lse(q, k, v, **args)
    reused = _ringattn.plans_reused() - reused
    assert o.dtype == (out_dtype or dtype) and o.shape == q.shape, (o.dtype, o.shape)
    assert lse.dtype == ACCUM.get(dtype, torch.float32), lse.dtype
    o32 = None
    if o.dtype in MANTISSA:  # the same call's float32 O, to check the one rounding against
        o32 = ringattn.attention(*(t.detach() for t in (q, k, v)), **dict(args, out_dtype=torch.float32))
    (o * mine(dof)).sum().backward()  # the gradient arrives in O's dtype
    errs = {
        "o": rel_error(o.detach() if o32 is None else o32, o_ref.detach()[:, pos]),
        "lse": rel_error(lse, lse_ref.detach()[:, :, pos]),
        "dq": rel_error(q.grad, qf.grad[:, pos]),
        "dk": rel_error(k.grad, kf.grad[:, pos]),
        "dv": rel_error(v.grad, vf.grad[:, pos]),
    }
    worst = max(e / (TOL[dtype] if n in ("o", "lse") else TOL_GRAD[dtype]) for n, e in errs.items())
    o_ulps = None
    if o32 is not None:  # O rounded once from float32, and within one ulp of the reference's rounding
        same_bits = torch.equal(o.detach().view(torch.int16), o32.to(o.dtype).view(torch.int16))
        o_ulps = comm.allreduce(ulps(o.detach(), o_ref.detach()[:, pos]) if same_bits else math.inf, op=MPI.MAX)
        worst = max(worst, o_ulps)
    worst = comm.allreduce(worst, op=MPI.MAX)  # in units of the tolerance
    ok = worst <= 1
    if expect_reuse is not None:  # every rank reused the kept plan, or none did
        reuse_ok = comm.allreduce(int((reused > 0) == expect_reuse), op=MPI.MIN) == 1
        name += f" (plan reused: {'yes' if reused else 'no'}, expected {'yes' if expect_reuse else 'no'})"
        ok = ok and reuse_ok
    del busy
    if comm.rank == 0:
        if strategy != "ring":
            name = f"{strategy}{f' U={ulysses_degree}' if ulysses_degree else ''}: {name}"
        print(f"{'ok ' if ok else 'BAD'} N={comm.size} {name:<46} max rel error {worst:.3g} x tol "
              f"({TOL[dtype]:.0e}; gradients {TOL_GRAD[dtype]:.1e})"
              + ("" if o_ulps is None else f"; {str(o.dtype)[6:]} O {o_ulps:.3g} ulp"), flush=True)
    return ok


def cases():
    """(name, kwargs): every layout x mask family, GQA, f32 and f64, RoPE, empty shards."""
    out = []
    for dtype, tag in ((torch.float64, "f64"), (torch.float32, "f32")):
        for layout in ("contiguous", "striped", "zigzag"):
            out += [
                (f"{layout} full gqa h4kv2 b2 {tag}",
                 dict(S=23, B=2, H=4, HKV=2, D=8, layout=layout, dtype=dtype)),
                (f"{layout} causal gqa h4kv1 {tag}",
                 dict(S=29, H=4, HKV=1, D=8, layout=layout, causal=True, dtype=dtype)),
                (f"{layout} window 5 {tag}",
                 dict(S=31, H=2, D=8, layout=layout, window=5, dtype=dtype)),
                (f"{layout} documents causal {tag}",
                 dict(S=27, H=2, HKV=1, D=8, layout=layout, causal=True, doc_lens=[9, 0, 11, 7],
                      dtype=dtype)),
                (f"{layout} documents full rope {tag}",
                 dict(S=24, H=2, D=8, layout=layout, doc_lens=[10, 14], rope=10000.0, dtype=dtype)),
            ]
        out += [
            (f"contiguous causal S=2 (empty shards at N=3) {tag}",
             dict(S=2, H=2, D=4, causal=True, dtype=dtype)),
            (f"partition, scale 0.3, non-contiguous {tag}",
             dict(S=19, H=2, D=8, causal=True, scale=0.3, dtype=dtype, noncontiguous=True,
                  partition=[19 - 5 * (N - 1)] + [5] * (N - 1))),
        ]
    # 16-bit storage. No RoPE here: the ranks round the rotated q, k to the storage type, and a
    # reference rotating with other last bits of cos/sin flips some of those roundings by an ulp.
    for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float16, "f16")):
        for layout in ("contiguous", "striped", "zigzag"):
            out += [
                (f"{layout} causal gqa h4kv2 b2 {tag}",
                 dict(S=26, B=2, H=4, HKV=2, D=8, layout=layout, causal=True, dtype=dtype)),
                (f"{layout} documents window 4 {tag}",
                 dict(S=22, H=2, D=8, layout=layout, window=4, doc_lens=[12, 10], dtype=dtype)),
            ]
        out.append((f"zigzag causal {tag} out_dtype float32",
                    dict(S=26, B=2, H=4, HKV=2, D=8, layout="zigzag", causal=True, dtype=dtype,
                         out_dtype=torch.float32)))
    out.append(("contiguous causal f32 out_dtype float64",
                dict(S=21, H=2, D=8, causal=True, dtype=torch.float32, out_dtype=torch.float64)))
    return out


def other_strategies():
    """The head-parallel strategies at this N, with usp's U: ulysses everywhere (U = N), usp where
    N = U x R has a ring of R >= 2 groups of U = 2."""
    out = [("ulysses", None)]
    if N >= 4 and N % 2 == 0:
        out.append(("usp", 2))
    return out


def run_strategy_case(strategy, U, name, kw):
    """A case under a head-parallel strategy; a shape the strategy refuses (InputError on every
    rank) is reported as skipped, a wrong result fails."""
    try:
        return run_case(name, seed=len(name), strategy=strategy, ulysses_degree=U, **kw)
    except ringattn.InputError as e:
        if RANK == 0:
            print(f"--  N={N} {strategy}: {name:<37} skipped: {e}", flush=True)
        return True


def autocast_case():
    """Inside torch.autocast("cpu", dtype=torch.bfloat16), float32 q, k, v are cast first, as
    scaled_dot_product_attention's are: O is bfloat16 and bit for bit the O of q, k, v cast by hand,
    and the gradients reach the float32 tensors in float32, bit for bit that call's bfloat16
    gradients widened. float16 tensors are cast too, float64 tensors are not, and ranks that differ in
    autocast raise."""
    S, H, D = 20, 2, 8
    pos = torch.from_numpy(ringattn.positions(S, N, RANK, "zigzag"))
    g = torch.Generator().manual_seed(7)
    q, k, v, do = (torch.randn(1, S, H, D, generator=g)[:, pos] for _ in range(4))
    args = dict(seq_len=S, causal=True, layout="zigzag")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = ringattn.attention(*leaves, **args)
    (o * do.to(o.dtype)).sum().backward()
    by_hand = [t.to(torch.bfloat16).requires_grad_(True) for t in (q, k, v)]
    o_hand = ringattn.attention(*by_hand, **args)
    (o_hand * do.to(o_hand.dtype)).sum().backward()
    ok = o.dtype == torch.bfloat16 and torch.equal(o, o_hand) and all(
        a.grad.dtype == torch.float32 and torch.equal(a.grad, b.grad.float()) for a, b in zip(leaves, by_hand))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # float16 is cast as float32 is, float64 is not
        ok = ok and ringattn.attention(*(t.double() for t in (q, k, v)), **args).dtype == torch.float64
        ok = ok and torch.equal(ringattn.attention(*(t.half() for t in (q, k, v)), **args),
                                ringattn.attention(*(t.half().bfloat16() for t in (q, k, v)), **args))
    ok = COMM.allreduce(int(ok), op=MPI.MIN) == 1
    if RANK == 0:
        print(f"{'ok ' if ok else 'BAD'} N={N} autocast bf16: O and gradients as for q, k, v cast by hand", flush=True)
    if N > 1:
        def one_rank_in_autocast():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=RANK == 0):
                ringattn.attention(q, k, v, **args)
        ok = expect_raise("autocast on rank 0 only", one_rank_in_autocast, "ranks disagree on the dtype") and ok
    return ok


# ---- bad arguments ----------------------------------------------------------------------------

def expect_raise(name, fn, needle):
    """fn() must raise ringattn.InputError on every rank with one message containing `needle`."""
    msg = None
    try:
        fn()
    except ringattn.InputError as e:
        msg = str(e)
    except Exception as e:  # anything else is a failure, but must not hang the others
        msg = f"(not InputError) {type(e).__name__}: {e}"
    msgs = COMM.allgather(msg)
    ok = all(m is not None and not m.startswith("(not") for m in msgs) and len(set(msgs)) == 1 \
        and needle in msgs[0] and "\n" not in msgs[0]
    if RANK == 0:
        print(f"{'ok ' if ok else 'BAD'} N={N} raises: {name:<38} {msgs[0]!r}"
              + ("" if ok else f" (every rank: {msgs})"), flush=True)
    return ok


def bad_argument_cases():
    S, H, D = 12, 4, 8
    pos = ringattn.positions(S, N, RANK, "contiguous")
    L = len(pos)
    def t(L_, h, dtype=torch.float64):
        return torch.randn(1, L_, h, D, dtype=dtype)
    last = N - 1
    out = [
        ("wrong shard length (last rank)",
         lambda: ringattn.attention(t(L + (RANK == last), H), t(L + (RANK == last), H),
                                    t(L + (RANK == last), H), seq_len=S),
         "positions"),
        ("mismatched dtypes (rank 0)",
         lambda: ringattn.attention(t(L, H), t(L, H, torch.float32 if RANK == 0 else torch.float64),
                                    t(L, H), seq_len=S),
         "differs from q's"),
        ("H % HKV != 0",
         lambda: ringattn.attention(t(L, H), t(L, 3), t(L, 3), seq_len=S),
         "H % HKV == 0"),
        ("unknown layout",
         lambda: ringattn.attention(t(L, H), t(L, H), t(L, H), seq_len=S, layout="diagonal"),
         "unknown layout"),
        ("window not >= 1 (last rank)",
         lambda: ringattn.attention(t(L, H), t(L, H), t(L, H), seq_len=S,
                                    window=0 if RANK == last else None),
         "window"),
        # a plan reused from an earlier call with the other arguments the same still checks these
        ("window=0 after a call without one",
         lambda: [ringattn.attention(t(L, H), t(L, H), t(L, H), seq_len=S, window=w) for w in (None, 0)],
         "window: 0 is not a window"),
        ("ulysses_degree=0 after a call without one",
         lambda: [ringattn.attention(t(L, H), t(L, H), t(L, H), seq_len=S, ulysses_degree=u) for u in (None, 0)],
         "ulysses_degree: 0 is not >= 1"),
        ("kv_head_group=0 after a call without one",
         lambda: [ringattn.attention(t(L, H), t(L, H), t(L, H), seq_len=S, kv_head_group=g) for g in (None, 0)],
         "kv_head_group: only applies with strategy allgather"),
        ("positions with window 0",
         lambda: ringattn.positions(S, N, RANK, causal=True, window=0),
         "window: 0 is not a window"),
        ("positions with layout auto and no mask",
         lambda: ringattn.positions(S, N, RANK),
         "depends on the mask"),
        ("bf16 with rope",
         lambda: ringattn.attention(*(t(L, H, torch.bfloat16),) * 3, seq_len=S, rope=10000.0),
         "rope: not supported with dtype bf16"),
        ("out_dtype not a float dtype (last rank)",
         lambda: ringattn.attention(t(L, H), t(L, H), t(L, H), seq_len=S,
                                    out_dtype=torch.int32 if RANK == last else None),
         "out_dtype: torch.int32 is not supported"),
        ("integer tensors",
         lambda: ringattn.attention(*(torch.zeros(1, L, H, D, dtype=torch.int64),) * 3, seq_len=S),
         "not supported"),
    ]
    if N > 1:
        out.append(("ranks disagree on causal",
                    lambda: ringattn.attention(t(L, H), t(L, H), t(L, H), seq_len=S,
                                               causal=(RANK == 0)),
                    "ranks disagree on causal"))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-k", default="", help="only cases whose name contains this")
    a = p.parse_args()
    torch.set_num_threads(1)
    failed = 0
    for name, kw in cases():
        if a.k in name:
            try:
                failed += not run_case(name, seed=len(name), **kw)
            except Exception:
                traceback.print_exc()
                COMM.Abort(1)  # a half-run case leaves peers in a collective
    # Head-parallel strategies, once built in: the cases whose heads spread over the ranks.
    for strategy, U in other_strategies():
        for name, kw in cases():
            heads = (kw["H"], kw.get("HKV", kw["H"])) if U is None else (kw["H"],)  # usp replicates kv heads
            if a.k in name and all(h % (U or N) == 0 for h in heads):
                failed += not run_strategy_case(strategy, U, name, kw)
    # A sub-communicator (every other rank): the same call inside it.
    if N > 1 and "sub" in (a.k or "sub"):
        sub = COMM.Split(RANK % 2, RANK)
        failed += not run_case(f"sub-communicator of {sub.size} causal zigzag f64", S=21, H=2, D=8,
                               causal=True, layout="zigzag", comm=sub)
        sub.Free()
    # A plan is reused by the next identical call, on every rank or on none.
    same = dict(S=20, B=2, H=4, HKV=2, D=8, causal=True, layout="zigzag", rope=500.0)
    failed += not run_case("reuse: a first call", **same)
    failed += not run_case("reuse: the same call again", expect_reuse=True, **same)
    if N > 1:
        failed += not run_case("reuse: rank 0's plan still busy", expect_reuse=False, hold_plan_on=0, **same)
    # Positions sharded zigzag, attention() given no layout: its default (auto) is zigzag when causal.
    failed += not run_case("zigzag positions, default layout, causal", S=23, B=2, H=4, HKV=2, D=8, causal=True,
                           layout="zigzag", layout_in_call=False)
    failed += not run_case("contiguous positions, default layout, windowed", S=19, H=2, D=8, causal=True,
                           window=5, layout="contiguous", layout_in_call=False)
    if a.k in "autocast":
        failed += not autocast_case()
    for name, fn, needle in bad_argument_cases():
        if a.k in name or a.k == "":
            failed += not expect_raise(name, fn, needle)
    # The bad calls left nothing behind: a good call still works.
    failed += not run_case("after the bad arguments", S=16, H=2, D=8, causal=True)
    failed = COMM.allreduce(failed, op=MPI.SUM)
    if RANK == 0:
        print("all cases passed" if failed == 0 else f"{failed} failures (summed over ranks)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
