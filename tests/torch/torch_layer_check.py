#!/usr/bin/python3
"""Independent PyTorch autograd check of `ringattn run --layer` and `run --rope` (one case).

Layer mode (default): seeded random x [B,S,M], wq [M,H*D], wk, wv [M,HKV*D], wo [H*D,M] and
dy [B,S,M]; the binary runs under mpirun for every N in --np (e.g. 1,2,3,4,5) on the same
inputs, and y, dx, dwq, dwk, dwv, dwo are compared with a float64 torch autograd reference of
    Q = X Wq, K = X Wk, V = X Wv  ->  RoPE(Q), RoPE(K) at positions 0..S-1  ->  attention  ->
    Y = O Wo,   loss = sum(dy * Y)
that shares no code with ringattn (RoPE is written here in the Hugging Face form
x*cos + rotate_half(x)*sin). The report is checked for the all-reduce figures: dWo's reduction
started before the ring backward, with its exposed time.

Attention mode (--attention): q, k, v, dout as in torch_check.py, `run --rope THETA`; o, lse and
dq, dk, dv (with respect to q and k before rotation) are compared.

--expect-fail NAMES: the run must succeed and exactly the listed tensors must fail (the others
pass), e.g. with --debug-average-weight-grads: dwq,dwk,dwv,dwo. Exit 0 when all is as expected.

Example:
  /usr/bin/python3 torch_layer_check.py --binary build/ringattn --np 1,2,3,4,5 --seq 45 \\
      --batch 2 --heads 4 --kv-heads 2 --head-dim 8 --model-dim 24 --rope 10000 \\
      --layout zigzag --causal --dtype f32
"""

import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_check import (NUMPY_DTYPE, TOLERANCE, compare, int_list, run_mpi,  # noqa: E402
                         visibility_mask)

LAYER_OUTPUTS = ("y", "dx", "dwq", "dwk", "dwv", "dwo")
ATTENTION_OUTPUTS = ("o", "lse", "dq", "dk", "dv")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", required=True, help="path to the ringattn executable")
    p.add_argument("--mpirun", default="mpirun", help="mpirun / mpiexec executable")
    p.add_argument("--np", type=int_list, required=True, dest="nranks",
                   help="rank counts to run, e.g. 1,2,3,4,5 (same inputs, one reference)")
    p.add_argument("--attention", action="store_true", help="plain attention with --rope (no --layer)")
    p.add_argument("--seq", type=int, required=True, help="total positions S")
    p.add_argument("--batch", type=int, default=1, help="batch B")
    p.add_argument("--heads", type=int, default=1, help="query heads H")
    p.add_argument("--kv-heads", type=int, default=None, help="key/value heads HKV (default H)")
    p.add_argument("--head-dim", type=int, default=8, help="head dim D (even with --rope)")
    p.add_argument("--model-dim", type=int, default=16, help="model dim M (layer mode)")
    p.add_argument("--rope", type=float, default=None, help="RoPE base THETA")
    p.add_argument("--dtype", choices=sorted(TOLERANCE), default="f64")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--layout", choices=["contiguous", "striped", "zigzag"], default="contiguous")
    p.add_argument("--seed", type=int, default=0, help="numpy seed for the inputs")
    p.add_argument("--expect-fail", type=lambda t: [x for x in t.split(",") if x], default=[],
                   help="tensors that must fail the comparison (a planted bug must be caught)")
    p.add_argument("--extra", action="append", default=[],
                   help="extra argument for `ringattn run` (repeatable), e.g. --extra=--debug-rope-local-positions")
    p.add_argument("--workdir", default=None,
                   help="parent of the scratch dir (kept); default: system temp, removed on success")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds allowed for each run")
    p.add_argument("--tol", type=float, default=None, help="override the dtype's tolerance")
    a = p.parse_args(argv)
    if a.kv_heads is None:
        a.kv_heads = a.heads
    if min(min(a.nranks), a.seq, a.batch, a.heads, a.kv_heads, a.head_dim, a.model_dim) < 1:
        p.error("--np, --seq, --batch, --heads, --kv-heads, --head-dim, --model-dim must be >= 1")
    if a.heads % a.kv_heads != 0:
        p.error(f"--heads {a.heads} is not a multiple of --kv-heads {a.kv_heads}")
    if a.attention and a.rope is None:
        p.error("--attention checks `run --rope`: give --rope THETA")
    names = ATTENTION_OUTPUTS if a.attention else LAYER_OUTPUTS
    if any(n not in names for n in a.expect_fail):
        p.error(f"--expect-fail names must be among {','.join(names)}")
    return a


# --------------------------------------------------------------------------- inputs

def make_inputs(a):
    """Seeded inputs in the requested dtype. Weights ~ N(0,1)/sqrt(fan_in) keep scores O(1)."""
    rng = np.random.default_rng(a.seed)
    dt = NUMPY_DTYPE[a.dtype]
    b, s, h, hkv, d, m = a.batch, a.seq, a.heads, a.kv_heads, a.head_dim, a.model_dim
    if a.attention:
        t = {"q": rng.standard_normal((b, s, h, d)), "k": rng.standard_normal((b, s, hkv, d)),
             "v": rng.standard_normal((b, s, hkv, d)), "dout": rng.standard_normal((b, s, h, d))}
    else:
        t = {"x": rng.standard_normal((b, s, m)),
             "wq": rng.standard_normal((m, h * d)) / math.sqrt(m),
             "wk": rng.standard_normal((m, hkv * d)) / math.sqrt(m),
             "wv": rng.standard_normal((m, hkv * d)) / math.sqrt(m),
             "wo": rng.standard_normal((h * d, m)) / math.sqrt(h * d),
             "dy": rng.standard_normal((b, s, m))}
    return {name: np.ascontiguousarray(x.astype(dt)) for name, x in t.items()}


# --------------------------------------------------------------------------- reference

def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, theta):
    """x [B,S,heads,D] rotated at positions 0..S-1 (Hugging Face Llama form)."""
    s, d = x.shape[1], x.shape[3]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))   # [D/2]
    angles = torch.outer(torch.arange(s, dtype=torch.float64), inv_freq)           # [S, D/2]
    emb = torch.cat((angles, angles), dim=-1)[None, :, None, :]                     # [1,S,1,D]
    return x * emb.cos() + rotate_half(x) * emb.sin()


def attention(q, k, v, mask):
    """q [B,S,H,D], k, v [B,S,HKV,D] -> o [B,S,H,D], lse [B,H,S]; empty rows give o = 0."""
    h, hkv, d = q.shape[2], k.shape[2], q.shape[3]
    ke = k.repeat_interleave(h // hkv, dim=2)
    ve = v.repeat_interleave(h // hkv, dim=2)
    scores = torch.einsum("bihd,bjhd->bhij", q, ke) / math.sqrt(d)
    scores = scores.masked_fill(~mask, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True).detach()
    safe_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = torch.exp(scores - safe_max)
    l = p.sum(dim=-1, keepdim=True)
    safe_l = torch.where(l > 0, l, torch.ones_like(l))
    o = torch.einsum("bhij,bjhd->bihd", p / safe_l, ve)
    lse = torch.where(l > 0, safe_max + torch.log(safe_l), torch.full_like(l, float("-inf"))).squeeze(-1)
    return o, lse


def layer_reference(t, a, mask):
    x, wq, wk, wv, wo = (torch.tensor(t[n].astype(np.float64), requires_grad=True)
                         for n in ("x", "wq", "wk", "wv", "wo"))
    dy = torch.tensor(t["dy"].astype(np.float64))
    b, s, h, hkv, d = a.batch, a.seq, a.heads, a.kv_heads, a.head_dim
    q = (x @ wq).reshape(b, s, h, d)       # head h = columns h*D .. h*D+D-1
    k = (x @ wk).reshape(b, s, hkv, d)
    v = (x @ wv).reshape(b, s, hkv, d)
    if a.rope is not None:
        q, k = rope(q, a.rope), rope(k, a.rope)
    o, _ = attention(q, k, v, mask)
    y = o.reshape(b, s, h * d) @ wo
    (dy * y).sum().backward()
    out = {"y": y, "dx": x.grad, "dwq": wq.grad, "dwk": wk.grad, "dwv": wv.grad, "dwo": wo.grad}
    return {n: v.detach().numpy() for n, v in out.items()}


def attention_reference(t, a, mask):
    q, k, v = (torch.tensor(t[n].astype(np.float64), requires_grad=True) for n in ("q", "k", "v"))
    g = torch.tensor(t["dout"].astype(np.float64))
    o, lse = attention(rope(q, a.rope), rope(k, a.rope), v, mask)
    (g * o).sum().backward()
    out = {"o": o, "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}
    return {n: v.detach().numpy() for n, v in out.items()}


# --------------------------------------------------------------------------- run

def run_binary(a, n, in_dir, out_dir, report):
    cmd = [a.mpirun, "-np", str(n), "--oversubscribe", os.path.abspath(a.binary), "run",
           "--inputs", in_dir, "--out", out_dir, "--report", report, "--layout", a.layout]
    if not a.attention:
        cmd += ["--layer", "--heads", str(a.heads), "--head-dim", str(a.head_dim)]
    if a.rope is not None:
        cmd += ["--rope", repr(a.rope)]
    if a.causal:
        cmd.append("--causal")
    cmd += a.extra
    print("run:", " ".join(cmd), flush=True)
    return run_mpi(cmd, a.timeout)


def check_report(path, n, elem_size):
    """Layer mode: the all-reduce figures are there and consistent; returns a list of problems."""
    with open(path) as f:
        rep = json.load(f)
    bad = []
    red = rep.get("allreduce", {})
    dwo = red.get("dwo", {})
    if dwo.get("started") != "before the ring backward":
        bad.append(f"allreduce.dwo.started is {dwo.get('started')!r}")
    for key in ("max_exposed_s", "max_elapsed_s", "hidden", "done_by_ring_backward_end", "total_send_bytes"):
        if key not in dwo:
            bad.append(f"allreduce.dwo.{key} missing")
    ranks = red.get("ranks", [])
    if len(ranks) != n:
        bad.append(f"allreduce.ranks has {len(ranks)} entries for N={n}")
    for rr in ranks:
        d = rr["dwo"]
        if not 0 <= d["exposed_s"] <= d["elapsed_s"] + 1e-9:
            bad.append(f"rank {rr['rank']}: exposed {d['exposed_s']} not within elapsed {d['elapsed_s']}")
        if d["send_bytes"] != d["send_elems"] * elem_size:
            bad.append(f"rank {rr['rank']}: send_bytes != send_elems * {elem_size}")
    # the rank's ledger carries the same traffic (dWo + dWq/dWk/dWv) next to the ring's
    for rr in ranks:
        led = rep["ranks"][rr["rank"]]["ledger"]
        for way in ("send", "recv"):
            want = rr["dwo"][f"{way}_elems"] + rr["dwqkv"][f"{way}_elems"]
            if led.get(f"allreduce_{way}_elems") != want or led.get(f"allreduce_{way}_bytes") != want * elem_size:
                bad.append(f"rank {rr['rank']}: ledger allreduce_{way}_elems {led.get(f'allreduce_{way}_elems')} "
                           f"!= {want} (dWo + dWqkv)")
    # each rank sends 2 (N-1)/N of the buffer: the total is 2 (N-1) buffers
    if "elems" in dwo and dwo.get("total_send_bytes") != 2 * (n - 1) * dwo["elems"] * elem_size:
        bad.append(f"allreduce.dwo.total_send_bytes {dwo.get('total_send_bytes')} != 2 (N-1) elems * {elem_size}")
    if not bad:
        print(f"report: dWo reduction started before the ring backward; exposed {dwo['max_exposed_s'] * 1e3:.3f} ms "
              f"of {dwo['max_elapsed_s'] * 1e3:.3f} ms, hidden {dwo['hidden']}, "
              f"done by ring backward end {dwo['done_by_ring_backward_end']}")
    return bad


def main(argv=None):
    a = parse_args(argv)
    tol = a.tol if a.tol is not None else TOLERANCE[a.dtype]
    names = ATTENTION_OUTPUTS if a.attention else LAYER_OUTPUTS
    if a.workdir:
        os.makedirs(a.workdir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="torch_layer_check_", dir=a.workdir)
    in_dir = os.path.join(scratch, "in")
    os.makedirs(in_dir)
    inputs = make_inputs(a)
    for name, arr in inputs.items():
        np.save(os.path.join(in_dir, name + ".npy"), arr)

    mask = visibility_mask(a.seq, a.causal)
    ref = attention_reference(inputs, a, mask) if a.attention else layer_reference(inputs, a, mask)

    all_ok = True
    for n in a.nranks:
        out_dir = os.path.join(scratch, f"out_n{n}")
        os.makedirs(out_dir)
        report = os.path.join(out_dir, "report.json")
        ok, msg = run_binary(a, n, in_dir, out_dir, report)
        if not ok:
            print(f"FAIL N={n}: ringattn run failed: {msg}", file=sys.stderr)
            all_ok = False
            continue
        for name in names:
            path = os.path.join(out_dir, name + ".npy")
            if not os.path.isfile(path):
                print(f"FAIL N={n}: missing output {path}")
                all_ok = False
                continue
            ours = np.load(path, allow_pickle=False)
            ok, line = compare(name, ours, ref[name], tol, NUMPY_DTYPE[a.dtype])
            want_fail = name in a.expect_fail
            if want_fail:
                line += "  (expected to fail: " + ("caught" if not ok else "NOT CAUGHT") + ")"
            print(f"N={n} {line}")
            all_ok &= (ok != want_fail)
        if not a.attention:
            problems = check_report(report, n, NUMPY_DTYPE[a.dtype].itemsize)
            for p in problems:
                print(f"FAIL N={n}: report: {p}")
            all_ok &= not problems

    if all_ok:
        print("PASS")
        if not a.workdir:
            shutil.rmtree(scratch, ignore_errors=True)
        return 0
    print(f"FAIL (files kept in {scratch})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
