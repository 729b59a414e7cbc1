#!/usr/bin/python3
"""`ringattn decode --out` against PyTorch float64 causal attention over all positions.

    decode_check.py --binary build/ringattn --np 1,2,3,4,5 --cache-len 37 --new-tokens 4 --steps 3 \
        --heads 4 --kv-heads 2 --head-dim 8 --dtype f32 [--window W] [--layout L]

For each N the binary prefills S0 generated positions and decodes K steps of T tokens; its
o_prefill.npy and o_decode.npy must equal rows [0, S0) and [S0, S0 + K T) of softmax attention over
all S0 + K T positions of its own q.npy, k.npy, v.npy (the inputs as the ranks held them), computed
here in float64 with torch's autograd-free ops: f64 within 1e-10, f32 and 16-bit storage within
3e-4 of max |ref| (16-bit storage computes in f32 on the rounded inputs). The 16-bit error must
also stay flat in N: no N's error above twice N = 1's plus 1e-6 (the merge is in f32, so N only
reorders f32 sums).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

TOL = {"f64": 1e-10, "f32": 3e-4, "bf16": 3e-4, "f16": 3e-4}


def reference(q, k, v, window, scale):
    """O of causal (windowed) attention over every position; q [B, S, H, D], k, v [B, S, HKV, D]."""
    B, S, H, D = q.shape
    G = H // k.shape[2]
    k = k.repeat_interleave(G, dim=2)
    v = v.repeat_interleave(G, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    visible = j <= i
    if window:
        visible &= j > i - window
    s = s.masked_fill(~visible, float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), v)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", required=True)
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--np", default="1,2,3")
    p.add_argument("--timeout", type=float, default=240)
    a, rest = p.parse_known_args()
    opts = dict(zip(rest[::2], rest[1::2]))
    dtype = opts.get("--dtype", "f32")
    window = int(opts["--window"]) if "--window" in opts else None
    S0, T, K = (int(opts[o]) for o in ("--cache-len", "--new-tokens", "--steps"))
    failures, errs = 0, {}
    for n in [int(x) for x in a.np.split(",")]:
        with tempfile.TemporaryDirectory() as d:
            # --stream-mib 0: a check, not a benchmark (the stream measurement reads 2 GiB)
            cmd = [a.mpirun, "-np", str(n), "--oversubscribe", a.binary, "decode", *rest, "--out", d,
                   "--report", os.path.join(d, "r.json"), "--stream-mib", "0"]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            if r.returncode != 0:
                print(f"FAIL N={n}: exit {r.returncode}: {r.stderr.strip()[-400:]}")
                failures += 1
                continue
            load = lambda name: torch.from_numpy(np.load(os.path.join(d, name))).double()
            q, k, v = load("q.npy"), load("k.npy"), load("v.npy")
            scale = float(opts.get("--scale", q.shape[-1] ** -0.5))
            ref = reference(q, k, v, window, scale)
            peak = ref.abs().max().item()
            e_pre = (load("o_prefill.npy") - ref[:, :S0]).abs().max().item() / peak
            e_dec = (load("o_decode.npy") - ref[:, S0:S0 + K * T]).abs().max().item() / peak
            errs[n] = max(e_pre, e_dec)
            ok = errs[n] <= TOL[dtype]
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} N={n}: prefill {e_pre:.2e} decode {e_dec:.2e} (tol {TOL[dtype]:.0e})")
    if dtype in ("bf16", "f16", "f32") and 1 in errs:
        flat = all(e <= 2 * errs[1] + 1e-6 for e in errs.values())
        print(f"{'ok  ' if flat else 'FAIL'} error flat in N: {errs}")
        failures += not flat
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
