#!/usr/bin/python3
"""Independent PyTorch autograd check of `ringattn run` (one case per invocation).

Generates seeded random q, k, v, dout, runs the binary under mpirun on them, and
compares o, lse, dq, dk, dv with a float64 torch autograd reference that shares
no code with ringattn. Exit 0 when every tensor is within tolerance, 1 otherwise
(including a failed or timed-out run, missing or malformed outputs, NaN or inf).

bf16 and f16 runs are compared with the float64 reference computed on the rounded inputs
(torch's own `.to(torch.bfloat16)` / `.to(torch.float16)` of the files' values), and the
rounded inputs ringattn writes to --out must equal torch's rounding bit for bit. `--np` may list
several N (one run each on the same inputs), with `--flat-in-n` asserting that the error does
not grow with N, and `--emulate-bf16-partials` printing what rounding each per-block partial
result to bf16 before summing it would give (what ring implementations that sum bf16 partials do).

Example:
  /usr/bin/python3 torch_check.py --binary build/ringattn --np 3 --seq 37 \
      --batch 2 --heads 4 --kv-heads 2 --head-dim 16 --dtype f32 --causal \
      --partition 10,0,27
"""

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import MPI_ENV  # noqa: E402

TOLERANCE = {"f32": 3e-4, "f64": 1e-10, "bf16": 2e-5, "f16": 2e-5}
NUMPY_DTYPE = {"f16": np.dtype("<f2"), "f32": np.dtype("<f4"), "f64": np.dtype("<f8")}
OUTPUT_DTYPE = {"f32": np.dtype("<f4"), "f64": np.dtype("<f8"), "bf16": np.dtype("<f4"), "f16": np.dtype("<f4")}
TORCH_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "f64": torch.float64}


def int_list(text):
    """'10,0,27' -> [10, 0, 27]."""
    try:
        return [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", required=True, help="path to the ringattn executable")
    p.add_argument("--np", type=int_list, required=True, dest="nranks_list",
                   help="MPI ranks N (a list runs each N on the same inputs)")
    p.add_argument("--seq", type=int, required=True, help="total positions S")
    p.add_argument("--batch", type=int, default=1, help="batch B")
    p.add_argument("--heads", type=int, default=1, help="query heads H")
    p.add_argument("--kv-heads", type=int, default=None, help="key/value heads HKV (default H)")
    p.add_argument("--head-dim", type=int, default=16, help="head dim D")
    p.add_argument("--dtype", choices=sorted(TOLERANCE), default="f64")
    p.add_argument("--file-dtype", choices=sorted(NUMPY_DTYPE), default=None,
                   help="dtype of the input files (default: --dtype, f64 for bf16); when it differs "
                        "from --dtype, ringattn gets --dtype and rounds on load")
    p.add_argument("--flat-in-n", action="store_true",
                   help="also fail when an error at some N exceeds 3x its error at the first N "
                        "(plus 1e-6, float32's rounding noise)")
    p.add_argument("--emulate-bf16-partials", action="store_true",
                   help="print the error of summing per-block partials rounded to bf16 at each N")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--partition", type=int_list, default=None, help="n0,n1,... (contiguous)")
    p.add_argument("--layout", choices=["contiguous", "striped", "zigzag"], default=None)
    p.add_argument("--window", type=int, default=None, help="causal sliding window W")
    p.add_argument("--doc-lens", type=int_list, default=None, help="document lengths, sum S")
    p.add_argument("--scale", type=float, default=None,
                   help="score scale passed to ringattn (default 1/sqrt(D) on both sides)")
    p.add_argument("--logit-scale", type=float, default=1.0,
                   help="multiply q by this (e.g. 40: logits large enough to overflow exp)")
    p.add_argument("--seed", type=int, default=0, help="numpy seed for the inputs")
    p.add_argument("--softcap", type=float, default=None, help="soft-cap C: scores s -> C tanh(s / C)")
    p.add_argument("--sinks", action="store_true",
                   help="attention sinks: seeded [H] logits (head 0's -inf when H > 2) passed as --sinks FILE.npy; "
                        "dsinks.npy is checked too")
    p.add_argument("--strategy", choices=["ring", "ulysses", "usp", "allgather"], default=None,
                   help="passed to ringattn run (default: its default, ring)")
    p.add_argument("--ulysses-degree", type=int, default=None, help="usp: ranks per all-to-all group U")
    p.add_argument("--kv-head-group", type=int, default=None, help="allgather: KV heads gathered at once G")
    p.add_argument("--workdir", default=None,
                   help="parent of the scratch dir (kept); default: system temp, removed on success")
    p.add_argument("--mpirun", default="mpirun", help="mpirun / mpiexec executable")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds allowed for the run")
    p.add_argument("--tol", type=float, default=None, help="override the dtype's tolerance")
    p.add_argument("--natural-floor", action="store_true",
                   help="measure an output's error against max(max|ref|, its natural magnitude), as "
                        "`ringattn run --check` does: for a softmax so sharp that dq's reference is "
                        "f64 rounding noise around 0")
    a = p.parse_args(argv)

    if a.kv_heads is None:
        a.kv_heads = a.heads
    if a.file_dtype is None:
        a.file_dtype = "f64" if a.dtype == "bf16" else a.dtype
    if not a.nranks_list:
        p.error("--np needs at least one N")
    a.nranks = a.nranks_list[0]
    if min(a.nranks_list + [a.seq, a.batch, a.heads, a.kv_heads, a.head_dim]) < 1:
        p.error("--np, --seq, --batch, --heads, --kv-heads, --head-dim must be >= 1")
    if a.heads % a.kv_heads != 0:
        p.error(f"--heads {a.heads} is not a multiple of --kv-heads {a.kv_heads}")
    if a.doc_lens is not None and (sum(a.doc_lens) != a.seq or min(a.doc_lens, default=0) < 0):
        p.error(f"--doc-lens must be non-negative and sum to --seq {a.seq}")
    if a.window is not None and a.window < 0:
        p.error("--window must be >= 0")
    return a


# --------------------------------------------------------------------------- inputs

def make_inputs(args):
    """Seeded random q [B,S,H,D], k, v [B,S,HKV,D], dout [B,S,H,D] in the requested dtype."""
    rng = np.random.default_rng(args.seed)
    dt = NUMPY_DTYPE[args.file_dtype]
    b, s, h, hkv, d = args.batch, args.seq, args.heads, args.kv_heads, args.head_dim
    q = rng.standard_normal((b, s, h, d)) * args.logit_scale
    k = rng.standard_normal((b, s, hkv, d))
    v = rng.standard_normal((b, s, hkv, d))
    dout = rng.standard_normal((b, s, h, d))
    return {name: np.ascontiguousarray(x.astype(dt))
            for name, x in (("q", q), ("k", k), ("v", v), ("dout", dout))}


def make_sinks(args):
    """Seeded [H] sink logits of order one (float64); head 0 has none (-inf) when H > 2."""
    sinks = np.random.default_rng(args.seed + 1000).standard_normal(args.heads) * 1.5
    if args.heads > 2:
        sinks[0] = -np.inf
    return sinks


# --------------------------------------------------------------------------- reference

def visibility_mask(s, causal=False, window=None, doc_lens=None):
    """Boolean [S, S], True where query i may attend key j (global positions)."""
    i = torch.arange(s).unsqueeze(1)
    j = torch.arange(s).unsqueeze(0)
    vis = torch.ones(s, s, dtype=torch.bool)
    if causal or window is not None:  # a sliding window is causal by definition
        vis &= j <= i
    if window is not None:
        vis &= j > i - window
    if doc_lens is not None:
        doc = torch.repeat_interleave(torch.arange(len(doc_lens)),
                                      torch.tensor(doc_lens, dtype=torch.long))
        vis &= doc.unsqueeze(1) == doc.unsqueeze(0)
    return vis


def reference(q, k, v, dout, mask, scale=None, softcap=None, sinks=None):
    """float64 autograd reference.

    q, dout [B,S,H,D]; k, v [B,S,HKV,D] (numpy, any float dtype); mask [S,S] bool.
    Returns float64 numpy o [B,S,H,D], lse [B,H,S], dq, dk, dv. A row with no visible key
    gets o = 0, lse = -inf and no gradient (computed with a safe max, never NaN).
    softcap C: scores s -> C tanh(s / C) before the mask. sinks [H]: one more column per row, the
    head's logit, in the softmax but attending to no value (gpt-oss); dsinks is its gradient.
    """
    qt = torch.tensor(np.asarray(q, dtype=np.float64), requires_grad=True)
    kt = torch.tensor(np.asarray(k, dtype=np.float64), requires_grad=True)
    vt = torch.tensor(np.asarray(v, dtype=np.float64), requires_grad=True)
    g = torch.tensor(np.asarray(dout, dtype=np.float64))
    h, hkv, d = qt.shape[2], kt.shape[2], qt.shape[3]
    if scale is None:
        scale = 1.0 / math.sqrt(d)

    # query head h reads kv head h // (H/HKV); the backward sums the group onto its kv head.
    ke = kt.repeat_interleave(h // hkv, dim=2)
    ve = vt.repeat_interleave(h // hkv, dim=2)

    scores = torch.einsum("bihd,bjhd->bhij", qt, ke) * scale           # [B,H,S,S]
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~mask, float("-inf"))
    st = None
    if sinks is not None:  # the sink column: [B,H,S,1]
        st = torch.tensor(np.asarray(sinks, dtype=np.float64), requires_grad=True)
        scores = torch.cat([scores, st.view(1, h, 1, 1).expand(scores.shape[0], h, scores.shape[2], 1)], dim=-1)
    row_max = scores.amax(dim=-1, keepdim=True).detach()               # -inf on empty rows
    safe_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = torch.exp(scores - safe_max)                                   # 0 where masked
    l = p.sum(dim=-1, keepdim=True)                                    # 0 on empty rows
    nonempty = l > 0
    safe_l = torch.where(nonempty, l, torch.ones_like(l))
    p = p[..., :ve.shape[1]]                                           # the sink attends to no value
    o = torch.einsum("bhij,bjhd->bihd", p / safe_l, ve)                # 0 on empty rows
    lse = torch.where(nonempty, safe_max + torch.log(safe_l),
                      torch.full_like(l, float("-inf"))).squeeze(-1)   # [B,H,S]

    loss = (g * o).sum()
    loss.backward()
    out = {"o": o, "lse": lse, "dq": qt.grad, "dk": kt.grad, "dv": vt.grad}
    if st is not None:
        out["dsinks"] = st.grad
    return {name: t.detach().numpy() for name, t in out.items()}


# --------------------------------------------------------------------------- comparison

def compare(name, ours, ref, tol, expect_dtype=None, floor=0.0):
    """Relative error max|ours - ref| / max(max|ref|, floor) of one tensor; returns (ok, message).

    Fails on shape or dtype mismatch, and on any NaN / inf in ours except lse = -inf
    exactly where the reference has -inf (rows with no visible key)."""
    if ours.shape != ref.shape:
        return False, f"{name:4s} shape {ours.shape} != expected {ref.shape}"
    if expect_dtype is not None and ours.dtype != expect_dtype:
        return False, f"{name:4s} dtype {ours.dtype.str} != input dtype {expect_dtype.str}"
    ours = ours.astype(np.float64)

    if name == "lse":
        ref_neginf = np.isneginf(ref)
        ours_neginf = np.isneginf(ours)
        if not np.array_equal(ref_neginf, ours_neginf):
            bad = int(np.count_nonzero(ref_neginf != ours_neginf))
            return False, (f"{name:4s} -inf pattern differs in {bad} entries "
                           f"(ref {int(ref_neginf.sum())}, ours {int(ours_neginf.sum())})")
        ours, ref = ours[~ref_neginf], ref[~ref_neginf]

    if not np.all(np.isfinite(ours)):
        nan = int(np.count_nonzero(np.isnan(ours)))
        inf = int(np.count_nonzero(np.isinf(ours)))
        return False, f"{name:4s} has {nan} NaN and {inf} inf entries"
    assert np.all(np.isfinite(ref)), f"reference {name} is not finite"

    if ref.size == 0:
        return True, f"{name:4s} empty (nothing to compare)"
    ref_max = float(np.max(np.abs(ref)))
    err = float(np.max(np.abs(ours - ref)))
    denom = max(ref_max, floor)
    # An all-zero reference (e.g. every row masked) is compared absolutely.
    rel = err / denom if denom > 0 else err
    ok = rel <= tol  # rel is finite here, so a NaN cannot slip through this test
    return ok, (f"{name:4s} rel_err {rel:.3e}  tol {tol:.1e}  (max|ref| {ref_max:.3e}"
                f"{f', floor {floor:.3e}' if floor > ref_max else ''})  {'ok' if ok else 'FAIL'}")


def natural_floors(used, scale):
    """The magnitude each output has by its operands (ringattn's --check uses the same): |o| <= max|v|,
    lse of order 1, dq ~ scale |k| |v| |dO|, dk ~ scale |q| |v| |dO|, dv ~ |dO|."""
    q, k, v, d = (float(np.max(np.abs(used[t]))) for t in ("q", "k", "v", "dout"))
    sc = abs(scale if scale is not None else 1.0 / math.sqrt(used["q"].shape[-1]))
    return {"o": v, "lse": 1.0, "dq": sc * k * v * d, "dk": sc * q * v * d, "dv": d, "dsinks": v * d}


# --------------------------------------------------------------------------- run

def _signal_session(sid, sig):
    """Send sig to every process in session sid (the session this script started)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # fields after "(comm)": state ppid pgrp session
                os.kill(int(entry), sig)
        except (OSError, IndexError, ValueError):
            pass


def run_binary(args, in_dir, out_dir):
    """Run `mpirun -np N ringattn run --inputs IN --out OUT ...`; returns (ok, message)."""
    cmd = [args.mpirun, "-np", str(args.nranks), "--oversubscribe",
           os.path.abspath(args.binary), "run", "--inputs", in_dir, "--out", out_dir]
    if args.softcap is not None:
        cmd += ["--softcap", repr(args.softcap)]
    if args.sinks:
        cmd += ["--sinks", os.path.join(os.path.dirname(in_dir), "sinks.npy")]
    if args.dtype != args.file_dtype:
        cmd += ["--dtype", args.dtype]
    if args.causal:
        cmd.append("--causal")
    if args.partition is not None:
        cmd += ["--partition", ",".join(map(str, args.partition))]
    if args.layout is not None:
        cmd += ["--layout", args.layout]
    if args.window is not None:
        cmd += ["--window", str(args.window)]
    if args.doc_lens is not None:
        cmd += ["--doc-lens", ",".join(map(str, args.doc_lens))]
    if args.scale is not None:
        cmd += ["--scale", repr(args.scale)]
    if args.strategy is not None:
        cmd += ["--strategy", args.strategy]
    if args.ulysses_degree is not None:
        cmd += ["--ulysses-degree", str(args.ulysses_degree)]
    if args.kv_head_group is not None:
        cmd += ["--kv-head-group", str(args.kv_head_group)]
    print("run:", " ".join(cmd), flush=True)
    return run_mpi(cmd, args.timeout)


def run_mpi(cmd, timeout):
    """Run an mpirun command line with MPI_ENV; returns (ok, message). On a timeout, mpirun and every
    rank it started get SIGTERM, then SIGKILL."""
    env = dict(os.environ, **MPI_ENV)
    # Own session, so a timeout can take down mpirun and every rank it started (Open MPI
    # gives each rank its own process group, but they stay in mpirun's session).
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _signal_session(proc.pid, signal.SIGTERM)  # mpirun forwards it to the ranks
        try:
            stdout, stderr = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            stdout, stderr = "", ""
        _signal_session(proc.pid, signal.SIGKILL)
        proc.wait()
        return False, f"timed out after {timeout:g} s\n{stderr or ''}"
    if proc.returncode != 0:
        return False, (f"exit code {proc.returncode}\n--- stdout ---\n{stdout}"
                       f"\n--- stderr ---\n{stderr}")
    return True, ""


def load_outputs(out_dir, names=("o", "lse", "dq", "dk", "dv")):
    outs = {}
    for name in names:
        path = os.path.join(out_dir, name + ".npy")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"missing output {path}")
        outs[name] = np.load(path, allow_pickle=False)
    return outs


def main(argv=None):
    args = parse_args(argv)
    tol = args.tol if args.tol is not None else TOLERANCE[args.dtype]

    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="torch_check_", dir=args.workdir)
    in_dir, out_dir = os.path.join(scratch, "in"), os.path.join(scratch, "out")
    os.makedirs(in_dir)
    os.makedirs(out_dir)

    inputs = make_inputs(args)
    for name, arr in inputs.items():
        np.save(os.path.join(in_dir, name + ".npy"), arr)
    # What ringattn computes on: the files' values as torch rounds them to the run's dtype.
    used = {name: torch.from_numpy(arr).to(TORCH_DTYPE[args.dtype]).double().numpy()
            for name, arr in inputs.items()}
    rounded = args.dtype != args.file_dtype and NUMPY_DTYPE.get(args.dtype, np.dtype("<f2")).itemsize \
        <= NUMPY_DTYPE[args.file_dtype].itemsize

    sinks = make_sinks(args) if args.sinks else None
    if sinks is not None:
        np.save(os.path.join(scratch, "sinks.npy"), sinks)
    names = ("o", "lse", "dq", "dk", "dv") + (("dsinks",) if args.sinks else ())

    mask = visibility_mask(args.seq, args.causal, args.window, args.doc_lens)
    ref = reference(used["q"], used["k"], used["v"], used["dout"], mask, args.scale, args.softcap, sinks)
    floors = natural_floors(used, args.scale) if args.natural_floor else {}

    all_ok = True
    first = {}
    for n in args.nranks_list:
        args.nranks = n
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        ok, msg = run_binary(args, in_dir, out_dir)
        if not ok:
            print(f"FAIL: ringattn run failed at N={n}: {msg}", file=sys.stderr)
            print(f"inputs kept in {scratch}", file=sys.stderr)
            return 1
        try:
            ours = load_outputs(out_dir, names)
        except (OSError, ValueError) as e:
            print(f"FAIL: {e}", file=sys.stderr)
            print(f"files kept in {scratch}", file=sys.stderr)
            return 1
        # The inputs as used: written (as f32 for 16-bit dtypes) exactly when they were rounded.
        for name in inputs:
            path = os.path.join(out_dir, name + ".npy")
            if rounded != os.path.isfile(path):
                print(f"FAIL: N={n}: {name}.npy {'missing from' if rounded else 'written to'} --out "
                      f"(inputs {'were' if rounded else 'were not'} rounded)")
                all_ok = False
            elif rounded and not np.array_equal(np.load(path).astype(np.float64), used[name]):
                bad = int(np.count_nonzero(np.load(path).astype(np.float64) != used[name]))
                print(f"FAIL: N={n}: {name}.npy differs from torch's rounding to {args.dtype} in {bad} values")
                all_ok = False
        print(f"N={n}:")
        for name in names:
            ok, line = compare(name, ours[name], ref[name], tol, OUTPUT_DTYPE[args.dtype], floors.get(name, 0.0))
            err = rel_error(ours[name], ref[name])
            print("  " + line)
            all_ok &= ok
            if args.flat_in_n:
                if n == args.nranks_list[0]:
                    first[name] = err
                elif err > 3 * first[name] + 1e-6:  # float32 rounding noise is ~1e-7
                    print(f"  FAIL: {name} error {err:.3e} at N={n} grew beyond 3x its {first[name]:.3e} at "
                          f"N={args.nranks_list[0]}")
                    all_ok = False
        if args.emulate_bf16_partials:
            emu = bf16_partials(used, mask, args, n)
            print("  summing per-block partials rounded to bf16 instead: " +
                  "  ".join(f"{k} {rel_error(emu[k], ref[k]):.3e}" for k in ("o", "dq", "dk", "dv")))

    if all_ok:
        print("PASS")
        if not args.workdir:
            shutil.rmtree(scratch, ignore_errors=True)
        return 0
    print(f"FAIL (files kept in {scratch})")
    return 1


def rel_error(ours, ref):
    ours = ours.astype(np.float64)
    finite = np.isfinite(ref)
    if not finite.any():
        return 0.0
    m = float(np.max(np.abs(ref[finite])))
    e = float(np.max(np.abs(ours[finite] - ref[finite])))
    return e / m if m > 0 else e


def shard_positions(s, n, layout):
    """The positions each of n ranks owns (contiguous, striped or zigzag), as lists."""
    if layout == "striped":
        return [list(range(r, s, n)) for r in range(n)]
    if layout == "zigzag":
        c = 2 * n
        bounds = [s * i // c for i in range(c + 1)]
        chunk = [list(range(bounds[i], bounds[i + 1])) for i in range(c)]
        return [chunk[r] + chunk[c - 1 - r] for r in range(n)]
    bounds = [s * i // n for i in range(n + 1)]
    return [list(range(bounds[r], bounds[r + 1])) for r in range(n)]


def bf16_partials(x, mask, args, n):
    """O, dQ, dK, dV as a ring that rounds every per-block partial to bf16 and sums in bf16.

    Exact (float64) per-block pieces of the softmax and its gradient, for query shard r and the
    K/V block of owner o: O accumulates the rescaled block outputs, dQ the blocks' dS K, and each
    owner sums the contributions dS^T Q and P^T dO of every query shard, in ring order, each
    rounded to bf16 before the sum and the sum kept in bf16."""
    bf = lambda t: t.to(torch.bfloat16).double()  # noqa: E731
    q, k, v, g = (torch.from_numpy(x[t]) for t in ("q", "k", "v", "dout"))
    h, hkv, d = q.shape[2], k.shape[2], q.shape[3]
    scale = args.scale if args.scale is not None else 1.0 / math.sqrt(d)
    ke, ve = k.repeat_interleave(h // hkv, dim=2), v.repeat_interleave(h // hkv, dim=2)
    sc = torch.einsum("bihd,bjhd->bhij", q, ke) * scale
    sc = sc.masked_fill(~mask, float("-inf"))
    mx = sc.amax(-1, keepdim=True)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    p = torch.exp(sc - mx)
    lsum = p.sum(-1, keepdim=True)
    p = p / torch.where(lsum > 0, lsum, torch.ones_like(lsum))
    o_exact = torch.einsum("bhij,bjhd->bihd", p, ve)
    dp = torch.einsum("bihd,bjhd->bhij", g, ve)
    delta = (g * o_exact).sum(-1).permute(0, 2, 1).unsqueeze(-1)      # [B,H,S,1]
    ds = p * (dp - delta)
    pos = shard_positions(args.seq, n, args.layout or ("zigzag" if args.causal and not args.window
                                                        and not args.doc_lens else "contiguous"))
    o = torch.zeros_like(o_exact)
    dq = torch.zeros_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    grp = lambda t: t.reshape(t.shape[0], t.shape[1], hkv, h // hkv, d).sum(3)  # noqa: E731
    for r in range(n):
        R = torch.tensor(pos[r], dtype=torch.long)
        for j in range(n):
            C = torch.tensor(pos[(r - j) % n], dtype=torch.long)
            if len(R) == 0 or len(C) == 0:
                continue
            po = torch.einsum("bhij,bjhd->bihd", p[:, :, R][:, :, :, C], ve[:, C])
            o[:, R] = bf(o[:, R] + bf(po))
            pq = torch.einsum("bhij,bjhd->bihd", ds[:, :, R][:, :, :, C], ke[:, C]) * scale
            dq[:, R] = bf(dq[:, R] + bf(pq))
    for own in range(n):
        C = torch.tensor(pos[own], dtype=torch.long)
        for j in range(n):
            R = torch.tensor(pos[(own + j) % n], dtype=torch.long)
            if len(R) == 0 or len(C) == 0:
                continue
            pk = grp(torch.einsum("bhij,bihd->bjhd", ds[:, :, R][:, :, :, C], q[:, R]) * scale)
            pv = grp(torch.einsum("bhij,bihd->bjhd", p[:, :, R][:, :, :, C], g[:, R]))
            dk[:, C] = bf(dk[:, C] + bf(pk))
            dv[:, C] = bf(dv[:, C] + bf(pv))
    return {"o": o.numpy(), "dq": dq.numpy(), "dk": dk.numpy(), "dv": dv.numpy()}


if __name__ == "__main__":
    sys.exit(main())
