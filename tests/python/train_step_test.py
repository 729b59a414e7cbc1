#!/usr/bin/python3
"""examples/train_step.py at N=2 against the same model trained on one process with plain
PyTorch attention: the per-step losses (f64) must agree within 1e-6, and training must lower the
loss. Exit 0 on success, 1 otherwise (including a failed or timed-out run)."""

import argparse
import json
import os
import subprocess
import sys
import tempfile

TOL = 1e-6  # float64 losses of order one, after a few steps; rounding differs by ~1e-15


def run(cmd, timeout):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        raise SystemExit(f"train_step_test: {' '.join(cmd)} exited {r.returncode}")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--script", required=True)
    p.add_argument("--steps", type=int, default=6)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dist, ref = os.path.join(tmp, "dist.json"), os.path.join(tmp, "ref.json")
        common = ["--steps", str(a.steps), "--dtype", "f64"]
        run([a.mpirun, "--oversubscribe", "-np", "2", sys.executable, a.script, *common, "--losses", dist], 240)
        run([sys.executable, a.script, "--reference", *common, "--losses", ref], 120)
        with open(dist) as f:
            d = json.load(f)
        with open(ref) as f:
            r = json.load(f)
    ok = len(d) == len(r) == a.steps
    worst = max((abs(x - y) for x, y in zip(d, r)), default=float("inf"))
    for step, (x, y) in enumerate(zip(d, r)):
        print(f"step {step}: ringattn N=2 {x:.15f}  torch N=1 {y:.15f}  diff {abs(x - y):.1e}")
    ok = ok and worst <= TOL and d[-1] < d[0]
    print(f"max |diff| {worst:.2e} (tol {TOL:.0e}); loss {d[0]:.6f} -> {d[-1]:.6f}: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
