#!/usr/bin/python3
"""Independent PyTorch autograd check of `ringattn run` (one case per invocation).

Generates seeded random q, k, v, dout, runs the binary under mpirun on them, and
compares o, lse, dq, dk, dv with a float64 torch autograd reference that shares
no code with ringattn. Exit 0 when every tensor is within tolerance, 1 otherwise
(including a failed or timed-out run, missing or malformed outputs, NaN or inf).

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

TOLERANCE = {"f32": 3e-4, "f64": 1e-10}
NUMPY_DTYPE = {"f32": np.dtype("<f4"), "f64": np.dtype("<f8")}


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
    p.add_argument("--np", type=int, required=True, dest="nranks", help="MPI ranks N")
    p.add_argument("--seq", type=int, required=True, help="total positions S")
    p.add_argument("--batch", type=int, default=1, help="batch B")
    p.add_argument("--heads", type=int, default=1, help="query heads H")
    p.add_argument("--kv-heads", type=int, default=None, help="key/value heads HKV (default H)")
    p.add_argument("--head-dim", type=int, default=16, help="head dim D")
    p.add_argument("--dtype", choices=sorted(TOLERANCE), default="f64")
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
    p.add_argument("--strategy", choices=["ring", "ulysses", "usp"], default=None,
                   help="passed to ringattn run (default: its default, ring)")
    p.add_argument("--ulysses-degree", type=int, default=None, help="usp: ranks per all-to-all group U")
    p.add_argument("--workdir", default=None,
                   help="parent of the scratch dir (kept); default: system temp, removed on success")
    p.add_argument("--mpirun", default="mpirun", help="mpirun / mpiexec executable")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds allowed for the run")
    p.add_argument("--tol", type=float, default=None, help="override the dtype's tolerance")
    a = p.parse_args(argv)

    if a.kv_heads is None:
        a.kv_heads = a.heads
    if min(a.nranks, a.seq, a.batch, a.heads, a.kv_heads, a.head_dim) < 1:
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
    dt = NUMPY_DTYPE[args.dtype]
    b, s, h, hkv, d = args.batch, args.seq, args.heads, args.kv_heads, args.head_dim
    q = rng.standard_normal((b, s, h, d)) * args.logit_scale
    k = rng.standard_normal((b, s, hkv, d))
    v = rng.standard_normal((b, s, hkv, d))
    dout = rng.standard_normal((b, s, h, d))
    return {name: np.ascontiguousarray(x.astype(dt))
            for name, x in (("q", q), ("k", k), ("v", v), ("dout", dout))}


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


def reference(q, k, v, dout, mask, scale=None):
    """float64 autograd reference.

    q, dout [B,S,H,D]; k, v [B,S,HKV,D] (numpy, any float dtype); mask [S,S] bool.
    Returns float64 numpy o [B,S,H,D], lse [B,H,S], dq, dk, dv. A row with no visible key
    gets o = 0, lse = -inf and no gradient (computed with a safe max, never NaN).
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
    scores = scores.masked_fill(~mask, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True).detach()               # -inf on empty rows
    safe_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = torch.exp(scores - safe_max)                                   # 0 where masked
    l = p.sum(dim=-1, keepdim=True)                                    # 0 on empty rows
    nonempty = l > 0
    safe_l = torch.where(nonempty, l, torch.ones_like(l))
    o = torch.einsum("bhij,bjhd->bihd", p / safe_l, ve)                # 0 on empty rows
    lse = torch.where(nonempty, safe_max + torch.log(safe_l),
                      torch.full_like(l, float("-inf"))).squeeze(-1)   # [B,H,S]

    loss = (g * o).sum()
    loss.backward()
    out = {"o": o, "lse": lse, "dq": qt.grad, "dk": kt.grad, "dv": vt.grad}
    return {name: t.detach().numpy() for name, t in out.items()}


# --------------------------------------------------------------------------- comparison

def compare(name, ours, ref, tol, expect_dtype=None):
    """Relative error max|ours - ref| / max|ref| of one tensor; returns (ok, message).

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
    # An all-zero reference (e.g. every row masked) is compared absolutely.
    rel = err / ref_max if ref_max > 0 else err
    ok = rel <= tol  # rel is finite here, so a NaN cannot slip through this test
    return ok, (f"{name:4s} rel_err {rel:.3e}  tol {tol:.1e}  (max|ref| {ref_max:.3e})  "
                f"{'ok' if ok else 'FAIL'}")


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
    print("run:", " ".join(cmd), flush=True)

    env = dict(os.environ, **MPI_ENV)
    # Own session, so a timeout can take down mpirun and every rank it started (Open MPI
    # gives each rank its own process group, but they stay in mpirun's session).
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        _signal_session(proc.pid, signal.SIGTERM)  # mpirun forwards it to the ranks
        try:
            stdout, stderr = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            stdout, stderr = "", ""
        _signal_session(proc.pid, signal.SIGKILL)
        proc.wait()
        return False, f"timed out after {args.timeout:g} s\n{stderr or ''}"
    if proc.returncode != 0:
        return False, (f"exit code {proc.returncode}\n--- stdout ---\n{stdout}"
                       f"\n--- stderr ---\n{stderr}")
    return True, ""


def load_outputs(out_dir):
    outs = {}
    for name in ("o", "lse", "dq", "dk", "dv"):
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

    ok, msg = run_binary(args, in_dir, out_dir)
    if not ok:
        print(f"FAIL: ringattn run failed: {msg}", file=sys.stderr)
        print(f"inputs kept in {scratch}", file=sys.stderr)
        return 1

    try:
        ours = load_outputs(out_dir)
    except (OSError, ValueError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        print(f"files kept in {scratch}", file=sys.stderr)
        return 1

    mask = visibility_mask(args.seq, args.causal, args.window, args.doc_lens)
    ref = reference(inputs["q"], inputs["k"], inputs["v"], inputs["dout"], mask, args.scale)

    all_ok = True
    for name in ("o", "lse", "dq", "dk", "dv"):
        ok, line = compare(name, ours[name], ref[name], tol, NUMPY_DTYPE[args.dtype])
        print(line)
        all_ok &= ok

    if all_ok:
        print("PASS")
        if not args.workdir:
            shutil.rmtree(scratch, ignore_errors=True)
        return 0
    print(f"FAIL (files kept in {scratch})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
