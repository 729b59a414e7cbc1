#!/usr/bin/python3
"""Gradients through LSE, attention sinks, soft-capping and cu_seqlens under mpirun, against float64
autograd.

    PYTHONPATH=build/python mpirun -np N python3 tests/python/lse_sinks_test.py

Every rank builds the whole q, k, v, sinks and the loss's weights from one seed and computes the
reference: float64 autograd over the whole sequence (mask materialised, the sink as one more
column of each row's softmax that attends to no value, scores soft-capped as C tanh(s / C); no code
shared with ringattn), of a loss
that uses both outputs, sum(W_o * O) + sum(W_lse * LSE). It runs ringattn.attention_lse on its shard
with the same loss on its rows and compares O, LSE, q.grad, k.grad, v.grad and sinks.grad (the
whole gradient, on every rank). Tolerances relative to max |ref|: f64 1e-10, f32 3e-4; bf16 and f16
compute in f32 on the rounded inputs, and their gradients come back rounded to the inputs' dtype
(half an ulp on top). Then: cu_seqlens gives bit for bit what the same doc_lens gives, a loss on
LSE alone reaches q and k, sinks tied with scores of 2^53 keep sinks.grad's digits, and a rank whose loss skips LSE still meets the ranks whose loss uses it.
Exit 0 only when every case passes on every rank.
"""

import math
import sys
import traceback

import torch

import ringattn
from mpi_checks import COMM, N, RANK, agreed, rel_error, visible

TOL = {torch.float64: 1e-10, torch.float32: 3e-4, torch.bfloat16: 3e-4, torch.float16: 3e-4}
TOL_GRAD = {**TOL, torch.bfloat16: 2.0 ** -8 + 3e-4, torch.float16: 2.0 ** -11 + 3e-4}


def reference(q, k, v, sinks, causal, window, doc_lens, softcap=None):
    """O [B, S, H, D], LSE [B, H, S] of whole float64 tensors; sinks [H] or None; scores soft-capped
    as C tanh(s / C) before the mask when softcap is C."""
    B, S, H, D = q.shape
    G = H // k.shape[2]
    kk, vv = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, kk) / math.sqrt(D)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~visible(S, causal, window, doc_lens), float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, H, 1, 1).expand(B, H, S, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., :S]
    return torch.einsum("bhij,bjhd->bihd", p, vv), torch.logsumexp(s, dim=-1)


def run_case(name, *, S, B=1, H=4, HKV=2, D=8, dtype=torch.float64, layout="contiguous", causal=False,
             window=None, doc_lens=None, strategy="ring", ulysses_degree=None, sinks=True, lse_weight=1.0,
             softcap=None, logit_scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    full = [torch.randn(B, S, h, D, generator=g, dtype=torch.float64).to(dtype).double() for h in (H, HKV, HKV)]
    full[0] = (full[0] * logit_scale).to(dtype).double()  # large logits: scores where tanh bends
    w_o = torch.randn(B, S, H, D, generator=g, dtype=torch.float64).to(dtype).double()  # dO is stored in dtype
    w_lse = torch.randn(B, H, S, generator=g, dtype=torch.float64) * lse_weight
    sink_values = torch.randn(H, generator=g, dtype=torch.float64) * 1.5
    if H > 2:
        sink_values[0] = float("-inf")  # a head without a sink
    qf, kf, vf = (t.clone().requires_grad_(True) for t in full)
    sf = sink_values.clone().requires_grad_(True) if sinks else None
    o_ref, lse_ref = reference(qf, kf, vf, sf, causal, window, doc_lens, softcap)
    ((o_ref * w_o).sum() + (lse_ref * w_lse).sum()).backward()

    pos = torch.from_numpy(ringattn.positions(S, N, RANK, layout))
    q, k, v = (t[:, pos].detach().to(dtype).requires_grad_(True) for t in (qf, kf, vf))
    s = sink_values.clone().to(torch.float32 if dtype != torch.float64 else dtype).requires_grad_(True) \
        if sinks else None
    o, lse = ringattn.attention_lse(q, k, v, seq_len=S, causal=causal, window=window, doc_lens=doc_lens,
                                    layout=layout, sinks=s, strategy=strategy, ulysses_degree=ulysses_degree,
                                    softcap=softcap,
                                    timeout=60, out_dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    ((o.double() * w_o[:, pos]).sum() + (lse.double() * w_lse[:, :, pos]).sum()).backward()
    errs = {"o": rel_error(o, o_ref[:, pos].detach()), "lse": rel_error(lse, lse_ref[:, :, pos].detach()),
            "dq": rel_error(q.grad, qf.grad[:, pos]), "dk": rel_error(k.grad, kf.grad[:, pos]),
            "dv": rel_error(v.grad, vf.grad[:, pos])}
    if sinks:
        errs["dsinks"] = rel_error(s.grad, sf.grad)
    ok = all(e <= (TOL if n in ("o", "lse") else TOL_GRAD)[dtype] for n, e in errs.items())
    # Every rank holds the whole sink gradient, bit for bit the same.
    if sinks:
        grads = COMM.allgather(s.grad.tolist())
        ok &= all(gr == grads[0] for gr in grads)
    return agreed(name, ok, " ".join(f"{n} {e:.1e}" for n, e in errs.items()))


def cu_seqlens_case():
    """cu_seqlens (an int32 tensor, an int64 tensor, a list) gives what doc_lens gives, bit for bit."""
    S, doc_lens = 41, [10, 0, 13, 18]
    cu = [0, 10, 10, 23, 41]
    g = torch.Generator().manual_seed(5)
    pos = torch.from_numpy(ringattn.positions(S, N, RANK, "striped"))
    q, k, v = (torch.randn(1, S, h, 8, generator=g)[:, pos].requires_grad_(True) for h in (4, 2, 2))
    outs = []
    for docs in (dict(doc_lens=doc_lens), dict(cu_seqlens=torch.tensor(cu, dtype=torch.int32)),
                 dict(cu_seqlens=torch.tensor(cu, dtype=torch.int64)), dict(cu_seqlens=cu)):
        for t in (q, k, v):
            t.grad = None
        o, lse = ringattn.attention_lse(q, k, v, seq_len=S, causal=True, layout="striped", **docs)
        (o.sum() + lse.sum()).backward()
        outs.append([o.detach(), lse.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()])
    same = all(torch.equal(a, b) for other in outs[1:] for a, b in zip(outs[0], other))
    return agreed("cu_seqlens equals doc_lens bit for bit", same)


def mixed_lse_case():
    """One rank's loss uses LSE, the others' do not (their grad_lse is None): every strategy meets."""
    ok = True
    for strategy, U in (("ring", None), ("ulysses", None), ("allgather", None)):
        if strategy == "ulysses" and 4 % N != 0:
            continue
        S = 23
        g = torch.Generator().manual_seed(9)
        qf, kf, vf = (torch.randn(1, S, h, 8, generator=g, dtype=torch.float64).requires_grad_(True)
                      for h in (4, 2, 2))
        o_ref, lse_ref = reference(qf, kf, vf, None, True, None, None)
        pos = torch.from_numpy(ringattn.positions(S, N, RANK, "contiguous"))
        # the reference loss: every rank's O, and rank 0's LSE rows only
        mask0 = torch.zeros(S, dtype=torch.float64)
        mask0[torch.from_numpy(ringattn.positions(S, N, 0, "contiguous"))] = 1
        (o_ref.sum() + (lse_ref * mask0).sum()).backward()
        q, k, v = (t[:, pos].detach().requires_grad_(True) for t in (qf, kf, vf))
        o, lse = ringattn.attention_lse(q, k, v, seq_len=S, causal=True, layout="contiguous", strategy=strategy,
                                        timeout=60)
        loss = o.sum() + (lse.sum() if RANK == 0 else 0)
        loss.backward()
        e = max(rel_error(q.grad, qf.grad[:, pos]), rel_error(k.grad, kf.grad[:, pos]))
        ok &= agreed(f"LSE in one rank's loss only, {strategy}", e <= 1e-10, f"{e:.1e}")
    return ok


def large_sink_case():
    """Sinks tied with the largest scores at 2^26 and 2^53 (f64) and 2^10 (f32): sinks.grad keeps its
    digits. Its P_sink comes from the forward's row statistics, 2^(sink log2 e - m) / l, exactly 1/2
    at a tie of two; e^(sink - LSE) loses the sink's magnitude times LSE's rounding (relative errors
    of 1e-7, 2e7 and 5e-4 in these three cases). A power-of-two scale and small integer q, k make every score exact, in the kernels'
    log2 units too, so the ties are ties there as well."""
    ok = True
    for dtype, scale, tol in ((torch.float64, 2.0 ** 26, 1e-10), (torch.float64, 2.0 ** 53, 1e-10),
                              (torch.float32, 2.0 ** 10, 3e-6)):
        for strategy in ("ring", "allgather"):
            S, H, D = 16, 2, 8
            g = torch.Generator().manual_seed(11)
            # small integers: the scores are exact multiples of the scale, and ties with the sink exact
            qf, kf = (torch.randint(-2, 3, (1, S, H, D), generator=g).double() for _ in range(2))
            vf = torch.randn(1, S, H, D, generator=g, dtype=torch.float64)
            w_o = torch.randn(1, S, H, D, generator=g, dtype=torch.float64).to(dtype).double()
            scores = torch.einsum("bihd,bjhd->bhij", qf, kf)
            sinks = torch.tensor([float(scores[0, 0, 0].max()) * scale, float(scores[0, 1, 3].max()) * scale],
                                 dtype=torch.float64)
            sf = sinks.clone().requires_grad_(True)
            s = torch.cat([scores * scale, sf.view(1, H, 1, 1).expand(1, H, S, 1)], dim=-1)
            o_ref = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1)[..., :S], vf)
            (o_ref * w_o).sum().backward()
            pos = torch.from_numpy(ringattn.positions(S, N, RANK, "contiguous"))
            q, k, v = (t[:, pos].to(dtype).requires_grad_(True) for t in (qf, kf, vf))
            sr = sinks.to(dtype).requires_grad_(True)
            o = ringattn.attention(q, k, v, seq_len=S, layout="contiguous", scale=scale, sinks=sr, strategy=strategy,
                                   timeout=60)
            (o.double() * w_o[:, pos]).sum().backward()
            e = rel_error(sr.grad, sf.grad)
            ok &= agreed(f"{str(dtype)[6:]} {strategy} sinks tied with scores at 2^{math.log2(scale):.0f}: sinks.grad",
                         e <= tol,
                         f"{e:.1e}")
    return ok


def refusals():
    """Bad cu_seqlens and sinks raise InputError naming them, on every rank."""
    ok = True
    q = torch.zeros(1, len(ringattn.positions(16, N, RANK, "contiguous")), 4, 8, dtype=torch.float64)
    k = torch.zeros(1, q.shape[1], 2, 8, dtype=torch.float64)
    cases = [("cu_seqlens not from 0", dict(cu_seqlens=[1, 16]), "cu_seqlens: starts at 1"),
             ("cu_seqlens decreasing", dict(cu_seqlens=[0, 9, 4, 16]), "cu_seqlens: offset 4 follows 9"),
             ("cu_seqlens short of S", dict(cu_seqlens=[0, 10]), "cu_seqlens: ends at 10 but S is 16"),
             ("cu_seqlens and doc_lens", dict(cu_seqlens=[0, 16], doc_lens=[16]), "cu_seqlens: given with doc_lens"),
             ("sinks of the wrong length", dict(sinks=torch.zeros(3)), "sinks: 3 values for H = 4"),
             ("sinks of no values", dict(sinks=torch.zeros(0)), "sinks: no values"),
             ("a NaN sink", dict(sinks=torch.tensor([0.0, float("nan"), 0.0, 0.0])), "sinks: nan for head 1"),
             ("negative softcap", dict(softcap=-1.0), "softcap: -1 is not a cap")]
    for what, kw, needle in cases:
        try:
            ringattn.attention(q, k, k, seq_len=16, layout="contiguous", **kw)
            msg = "(accepted)"
        except ringattn.InputError as e:
            msg = str(e)
        ok &= agreed(f"refused: {what}", needle in msg, msg[:70])
    return ok


def main():
    ok = True
    cases = [
        ("f64 ring causal zigzag GQA, O+LSE loss, sinks", dict(S=37, causal=True, layout="zigzag")),
        ("f64 ring window striped, O+LSE loss, no sinks", dict(S=33, window=5, layout="striped", sinks=False)),
        ("f64 ring documents, sinks", dict(S=40, B=2, causal=True, doc_lens=[7, 0, 13, 20])),
        ("f64 ring LSE-only loss (O weight kept), sinks", dict(S=29, lse_weight=5.0)),
        ("f32 ring causal zigzag, sinks", dict(S=45, causal=True, layout="zigzag", dtype=torch.float32)),
        ("bf16 ring causal, sinks", dict(S=33, causal=True, dtype=torch.bfloat16)),
        ("f16 ring window, sinks", dict(S=33, window=6, dtype=torch.float16, layout="striped")),
        ("f64 allgather causal GQA, sinks", dict(S=37, causal=True, strategy="allgather")),
        ("f32 allgather documents, sinks", dict(S=40, doc_lens=[15, 25], strategy="allgather",
                                                dtype=torch.float32)),
    ]
    cases += [("f64 ring softcap 5 causal zigzag, O+LSE loss, sinks", dict(S=37, causal=True, layout="zigzag",
                                                                          softcap=5.0, logit_scale=6.0)),
              ("f32 allgather softcap 5 window, sinks", dict(S=33, window=6, softcap=5.0, logit_scale=6.0,
                                                             strategy="allgather", dtype=torch.float32))]
    if 4 % N == 0:
        cases += [("f64 ulysses softcap 5 documents, sinks", dict(S=40, doc_lens=[15, 25], softcap=5.0,
                                                                  logit_scale=6.0, strategy="ulysses")),("f64 ulysses causal GQA, sinks", dict(S=37, causal=True, strategy="ulysses")),
                  ("f32 ulysses window zigzag, sinks", dict(S=41, window=7, layout="zigzag", strategy="ulysses",
                                                            dtype=torch.float32))]
    if 4 % N == 0 and N > 1:  # S = N - 1: the last rank holds no position, yet joins dLSE's all-to-all
        cases += [("f64 ulysses, a rank without positions, O+LSE loss, sinks", dict(S=N - 1, strategy="ulysses"))]
    if N == 4:
        cases += [("f64 usp U=2 documents striped, sinks", dict(S=40, causal=True, doc_lens=[7, 0, 13, 20],
                                                                layout="striped", strategy="usp",
                                                                ulysses_degree=2)),
                  ("f64 usp U=2, a rank without positions, O+LSE loss", dict(S=3, strategy="usp", ulysses_degree=2,
                                                                              sinks=False))]
    for i, (name, kw) in enumerate(cases):
        try:
            ok &= run_case(name, seed=i, **kw)
        except Exception:
            traceback.print_exc()
            ok &= agreed(name, False, "raised")
    for case in (cu_seqlens_case, mixed_lse_case, large_sink_case, refusals):
        try:
            ok &= case()
        except Exception:
            traceback.print_exc()
            ok &= agreed(case.__name__, False, "raised")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
