#!/usr/bin/python3
"""NaN and Inf inputs through the Python package under mpirun, against PyTorch float64 autograd.

    PYTHONPATH=BUILD/python /usr/bin/python3 tests/torch/nonfinite_check.py --mpirun mpiexec --np 1,2,3,4

The driver runs `mpirun -np N python3 nonfinite_check.py --worker` for every N (each run bounded by
--timeout, its whole process group killed when it overruns). Every rank of a worker builds the whole
q, k, v, dO from one seed, puts one NaN or Inf into q, k, v or dO, computes the reference over the
whole sequence and compares its own positions of O, LSE, dq, dk, dv with ringattn.attention_lse
(ring; ulysses where the H = 6 heads split over N; usp at N = 4; float64 and bfloat16; contiguous
and zigzag; causal or not):

- the pattern: every element is non-finite exactly where the reference's is, and of the same kind
  (NaN, +inf or -inf), except the LSE of a row with a +inf score, NaN where torch.logsumexp gives
  +inf (its O is NaN in both);
- the values: the finite elements within the usual tolerance, relative to max |ref| over the finite
  reference elements (float64 1e-10; bf16 computes in float32 on the rounded inputs: O, LSE 3e-4,
  the gradients, rounded once to bf16, 2^-8 + 3e-4, as tests/python/attention_test.py).

Then attention sinks (one logit per head, one of them -inf) through the ring and the all-gather:
a query holding -inf whose every score is -inf has a NaN softmax without a sink, and gives its
whole weight to a finite one (O = 0, LSE = the sink); a NaN query stays NaN with one.

The reference is PyTorch's float64 autograd of softmax(scale q k^T) v with each query row's softmax
taken over the keys it may see (the keys it may not see are not in its sums): an output is non-finite
exactly when it depends, through a visible (query, key) pair, on a non-finite input. Without a mask
this is the dense computation itself, and the worker checks that the two agree element for element.
With a mask, the dense form softmax(q k^T + mask) v also multiplies the zero weights of invisible
pairs by the non-finite values (0 * NaN = NaN), so its pattern depends on how the mask is written
(masked_fill and an additive -inf mask differ); the worker checks that it contains the reference's.
"""

import argparse
import itertools
import math
import os
import signal
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from harness import MPI_ENV  # noqa: E402


# ---- the driver ---------------------------------------------------------------------------------

def drive(args):
    failed = []
    for n in args.np:
        cmd = [args.mpirun, "-np", str(n), "--oversubscribe", args.python, HERE, "--worker"]
        t0 = time.time()
        proc = subprocess.Popen(cmd, env=dict(os.environ, **MPI_ENV), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=args.timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            rc = None
        sys.stdout.write(out)
        status = "timed out" if rc is None else f"exit {rc}"
        print(f"N={n}: {status} after {time.time() - t0:.1f} s", flush=True)
        if rc != 0:
            failed.append(n)
    print("nonfinite_check: " + (f"FAILED at N = {failed}" if failed else "passed"), flush=True)
    return 1 if failed else 0


# ---- the worker ---------------------------------------------------------------------------------

def worker():
    import torch
    from mpi4py import MPI

    import ringattn

    comm = MPI.COMM_WORLD
    rank, N = comm.rank, comm.size
    B, S, H, HKV, D = 2, 19, 6, 2, 8
    G = H // HKV
    scale = 1.0 / math.sqrt(D)
    CAPS = (None, 1.5)  # without and with soft-capping (scores are about N(0, 1))
    TOL = {torch.float64: 1e-10, torch.bfloat16: 3e-4}
    TOL_GRAD = {torch.float64: 1e-10, torch.bfloat16: 2.0 ** -8 + 3e-4}
    # (tensor, index [b, position, head, d], value): positions hit the first, middle and last shards
    PLANT = {
        "q nan": ("q", (1, 11, 3, 2), math.nan),
        "k nan": ("k", (0, 7, 1, 5), math.nan),
        "v nan": ("v", (1, 7, 0, 1), math.nan),
        "dout nan": ("dout", (0, 4, 4, 7), math.nan),
        "dout +inf": ("dout", (1, 8, 2, 6), math.inf),  # dk NaN wherever row 8 sees the key, dv +-inf
        "q +inf": ("q", (0, 5, 1, 0), math.inf),
        "k +inf": ("k", (1, 9, 0, 3), math.inf),  # some rows see +inf scores, others -inf ones
        "k nan at 0": ("k", (1, 0, 1, 0), math.nan),  # every row sees key 0
        "q nan at S-1": ("q", (0, S - 1, 5, 4), math.nan),
        # every query of kv head 1 positive in d = 6: key 0's score is -inf for all of them, so the
        # causal row 0, which sees key 0 alone, has only -inf scores and a NaN softmax (finite q)
        "k -inf at 0": ("k", (0, 0, 1, 6), -math.inf),
    }
    # With attention sinks (one logit per query head; head 1's is -inf, no sink): a query holding -inf
    # where every key of its kv head is positive has only -inf scores. Its softmax is NaN without a
    # sink (head 1), and all the sink's with one (head 2): O = 0, LSE = the sink.
    SINKS = [0.5, -math.inf, 1.0, 0.0, 2.0, -1.0]
    SINK_PLANT = {
        "q -inf, sink": ("q", (1, 12, 2, 3), -math.inf),
        "q -inf, sink, kv 1": ("q", (0, 3, 4, 5), -math.inf),  # head 4, kv head 1 (the all-gather's group 1)
        "q -inf, -inf sink": ("q", (0, 6, 1, 3), -math.inf),
        "q nan, sink": ("q", (1, 11, 3, 2), math.nan),
    }

    def visible(causal):
        i = torch.arange(S)[:, None]
        j = torch.arange(S)[None, :]
        return (j <= i) if causal else torch.ones(S, S, dtype=torch.bool)

    def inputs(dtype, plant):
        g = torch.Generator().manual_seed(2024)
        t = {name: torch.randn(B, S, h, D, generator=g, dtype=torch.float64)
             for name, h in (("q", H), ("k", HKV), ("v", HKV), ("dout", H))}
        name, idx, val = PLANT[plant] if plant in PLANT else SINK_PLANT[plant]
        t[name][idx] = val
        if plant in SINK_PLANT and val == -math.inf:  # every key of the query's kv head positive in d
            t["k"][idx[0], :, idx[2] // G, idx[3]] = t["k"][idx[0], :, idx[2] // G, idx[3]].abs() + 0.1
        if name == "k" and val == -math.inf:  # every query of the key's kv head positive in d
            heads = slice(idx[2] * G, (idx[2] + 1) * G)
            t["q"][idx[0], :, heads, idx[3]] = t["q"][idx[0], :, heads, idx[3]].abs() + 0.1
        return {n: x.to(dtype).double() for n, x in t.items()}  # the values ringattn sees

    def capped(s, cap):  # soft-capping, s -> cap tanh(s / cap): it takes an infinite score to +-cap
        return s if cap is None else cap * torch.tanh(s / cap)

    def cap_tag(cap):
        return "" if cap is None else f"softcap={cap:g}"

    def per_row_reference(t, causal, cap, sinks=None):
        """Each row's softmax over its visible keys only (autograd float64), and its head's sink."""
        q, k, v = (t[n].clone().requires_grad_(True) for n in ("q", "k", "v"))
        kk, vv = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
        vis = visible(causal)
        o_rows, lse_rows = [], []
        for i in range(S):
            idx = vis[i].nonzero().flatten()
            s = capped(torch.einsum("bhd,bjhd->bhj", q[:, i], kk[:, idx]) * scale, cap)
            if sinks is not None:  # the sink's logit is one more column of the row's softmax
                s = torch.cat([s, torch.tensor(sinks, dtype=s.dtype).expand(B, H)[:, :, None]], dim=-1)
            p = torch.softmax(s, dim=-1)
            o_rows.append(torch.einsum("bhj,bjhd->bhd", p[:, :, :len(idx)], vv[:, idx]))
            lse_rows.append(torch.logsumexp(s, dim=-1))
        o, lse = torch.stack(o_rows, dim=1), torch.stack(lse_rows, dim=2)
        torch.autograd.backward(o, t["dout"])
        return {"o": o.detach(), "lse": lse.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}

    def dense_reference(t, causal, cap):
        """softmax(scale q k^T masked_fill -inf) v over the whole [S, S] score matrix."""
        q, k, v = (t[n].clone().requires_grad_(True) for n in ("q", "k", "v"))
        kk, vv = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
        s = capped(torch.einsum("bihd,bjhd->bhij", q, kk) * scale, cap)
        s = s.masked_fill(~visible(causal), float("-inf"))
        o = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), vv)
        torch.autograd.backward(o, t["dout"])
        return {"o": o.detach(), "lse": torch.logsumexp(s, dim=-1).detach(), "dq": q.grad, "dk": k.grad,
                "dv": v.grad}

    ok_all = True

    def report(ok, line):
        nonlocal ok_all
        ok_all &= ok
        if rank == 0:
            print(f"{'ok ' if ok else 'BAD'} N={N} {line}", flush=True)

    # The references, once per (dtype, mask, cap, planted value); rank 0 checks them against the dense form.
    refs = {}
    for dtype, causal, cap, plant in itertools.product((torch.float64, torch.bfloat16), (False, True), CAPS, PLANT):
        t = inputs(dtype, plant)
        ref = per_row_reference(t, causal, cap)
        refs[dtype, causal, cap, plant] = (t, ref)
        if rank != 0 or N != 1:
            continue
        dense = dense_reference(t, causal, cap)
        notes = []
        for n in ref:
            rf, df = torch.isfinite(ref[n]), torch.isfinite(dense[n])
            if not causal:  # no mask: the same computation, the same pattern and values
                same = torch.equal(rf, df) and torch.allclose(ref[n][rf], dense[n][rf], rtol=0, atol=1e-12)
                if not same:
                    notes.append(f"{n} differs from the dense autograd")
            elif bool((~rf & df).any()):  # with a mask, dense must contain the reference's pattern
                notes.append(f"{n}: the dense autograd is finite where the reference is not")
        has_nonfinite = any(not bool(torch.isfinite(ref[n]).all()) for n in ref)
        has_finite = any(bool(torch.isfinite(ref[n]).any()) for n in ("o", "dq"))
        if not (has_nonfinite and has_finite):
            notes.append("the planted value leaves nothing (or everything) non-finite")
        report(not notes, f"reference {plant:12s} {'causal' if causal else 'full':6s} {cap_tag(cap):10s} "
                          f"{str(dtype)[6:]:8s} against the dense form" + (": " + "; ".join(notes) if notes else ""))

    def compare(strategy, U, dtype, layout, causal, cap, plant, t, ref, sinks=None):
        pos = torch.from_numpy(ringattn.positions(S, N, rank, layout))
        q, k, v = (t[n][:, pos].to(dtype).requires_grad_(True) for n in ("q", "k", "v"))
        o, lse = ringattn.attention_lse(q, k, v, seq_len=S, causal=causal, layout=layout,
                                        strategy=strategy, ulysses_degree=U, comm=comm, softcap=cap,
                                        sinks=None if sinks is None else torch.tensor(sinks, dtype=torch.float64),
                                        out_dtype=torch.float32 if dtype == torch.bfloat16 else None)
        torch.autograd.backward(o, t["dout"][:, pos].to(o.dtype))
        ours = {"o": o.detach(), "lse": lse.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
        mine = {"o": ref["o"][:, pos], "lse": ref["lse"][:, :, pos], "dq": ref["dq"][:, pos],
                "dk": ref["dk"][:, pos], "dv": ref["dv"][:, pos]}
        bad = []
        for n in ours:
            x, r = ours[n].double(), mine[n]
            xf, rf = torch.isfinite(x), torch.isfinite(r)
            missed, extra = int((xf & ~rf).sum()), int((~xf & rf).sum())
            # a row whose scores are all -inf: LSE -inf, torch.logsumexp's (NaN or +inf elsewhere)
            not_neg_inf = int(((r == -math.inf) & (x != -math.inf)).sum()) if n == "lse" else 0
            if not_neg_inf:
                bad.append(f"lse: {not_neg_inf} not -inf where the reference's is")
            # NaN where the reference has NaN, and each infinity with its sign; except the documented
            # LSE of a row with a +inf score: NaN (its O is NaN), where torch.logsumexp gives +inf
            other = (torch.isnan(x) != torch.isnan(r)) | ((x != r) & torch.isinf(r))
            if n == "lse":
                other &= ~((r == math.inf) & torch.isnan(x))
            kind = int(other.sum())
            if not (missed or extra) and kind:
                bad.append(f"{n}: {kind} non-finite elements of another kind than the reference's (NaN, +inf, -inf)")
            if missed or extra:
                zeros = int(((x == 0) & ~rf).sum())
                bad.append(f"{n}: {missed} finite where the reference is not ({zeros} of them 0), "
                           f"{extra} non-finite where it is finite")
                continue
            ref_fin = r[rf]
            peak = float(ref_fin.abs().max()) if ref_fin.numel() else 0.0
            err = float((x[rf] - ref_fin).abs().max()) if ref_fin.numel() else 0.0
            tol = TOL[dtype] if n in ("o", "lse") else TOL_GRAD[dtype]
            if err > tol * max(peak, 1e-300):
                bad.append(f"{n}: finite error {err / max(peak, 1e-300):.3g} > {tol:.1e}")
        bad_all = comm.allgather(bad)
        ok = not any(bad_all)
        first = next((b for b in bad_all if b), [])
        tag = f"{strategy}{f' U={U}' if U else ''}"
        report(ok, f"{tag:9s} {str(dtype)[6:]:8s} {layout:10s} {'causal' if causal else 'full':6s} "
                   f"{cap_tag(cap):10s} {plant:12s}" + ("" if ok else "  " + "; ".join(first)))

    # ulysses splits the H heads over the N ranks; usp (groups of U = 2 joined by a ring) from N = 4
    strategies = [("ring", None)] + ([("ulysses", None)] if H % N == 0 else []) + ([("usp", 2)] if N == 4 else [])
    for strategy, U in strategies:
        for dtype, layout, causal, cap, plant in itertools.product(
                (torch.float64, torch.bfloat16), ("contiguous", "zigzag"), (False, True), CAPS, PLANT):
            t, ref = refs[dtype, causal, cap, plant]
            compare(strategy, U, dtype, layout, causal, cap, plant, t, ref)
    # sinks, through the ring and the all-gather (each hands the kernels its heads' sinks)
    for strategy, dtype, layout, causal, plant in itertools.product(
            ("ring", "allgather"), (torch.float64, torch.bfloat16), ("contiguous", "zigzag"), (False, True),
            SINK_PLANT):
        t = inputs(dtype, plant)
        compare(strategy, None, dtype, layout, causal, None, plant, t, per_row_reference(t, causal, None, SINKS),
                SINKS)
    ok_all = comm.allreduce(int(ok_all), op=MPI.MIN) == 1
    if rank == 0:
        print(f"N={N}: {'all cases passed' if ok_all else 'FAILED'}", flush=True)
    return 0 if ok_all else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help="(internal) one rank of a run")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--python", default=sys.executable, help="the Python the package is built for (with torch)")
    ap.add_argument("--np", default="1,2,3", type=lambda s: [int(x) for x in s.split(",") if x])
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds allowed for each mpirun")
    args = ap.parse_args()
    return worker() if args.worker else drive(args)


if __name__ == "__main__":
    sys.exit(main())
