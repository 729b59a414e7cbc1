"""The same options through the command line, the C++ API and Python at N = 2: each case gets the
same verdict from all three, and a refusal names the same option with the same message once each
front end's names for the options are mapped back to one vocabulary.

  entry_points_test.py --binary build/ringattn --cpp build/tests/entry_points/cpp_entry \
      --python-entry tests/entry_points/python_entry.py --mpirun mpirun
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

# Each front end's name of an option, and the one token they all map to.
NAMES = {
    "cli": {"--seq": "seq", "--batch": "batch", "--heads": "heads", "--kv-heads": "kv_heads",
            "--head-dim": "head_dim", "--dtype": "dtype", "--causal": "causal", "--window": "window",
            "--doc-lens": "doc_lens", "--layout": "layout", "--partition": "partition", "--scale": "scale",
            "--rope": "rope", "--strategy": "strategy", "--ulysses-degree": "ulysses_degree",
            "--timeout": "timeout", "--softcap": "softcap", "--sinks": "sinks",
            "--precision": "precision"},
    "cpp": {"shape.S": "seq", "shape.B": "batch", "shape.H": "heads", "shape.HKV": "kv_heads",
            "shape.D": "head_dim", "rope_theta": "rope", "timeout_s": "timeout"},
    "python": {"seq_len": "seq", "q's B": "batch", "q's H": "heads", "k's HKV": "kv_heads",
               "q's D": "head_dim"},
}

BASE = dict(seq="16", heads="4", kv_heads="2", head_dim="8")
# (what, options, expected option at fault or None, front ends that cannot express it)
CASES = [
    ("plain causal", dict(causal="1"), None, ()),
    ("zigzag, windowed, GQA", dict(layout="zigzag", window="3", doc_lens="5,11"), None, ()),
    ("partition under zigzag", dict(layout="zigzag", partition="8,8"), "partition", ()),
    ("partition of the wrong sum", dict(partition="3,4"), "partition", ()),
    ("bf16 with RoPE", dict(dtype="bf16", rope="10000"), "rope", ()),
    ("f16 with RoPE", dict(dtype="f16", rope="10000"), "rope", ()),
    ("f32 with RoPE", dict(rope="10000"), None, ()),
    ("RoPE with an odd D", dict(head_dim="7", rope="10000"), "rope", ()),
    ("window 0", dict(window="0"), "window", ()),
    ("negative window", dict(window="-2"), "window", ()),
    ("ulysses with H % N != 0", dict(heads="3", kv_heads="1", strategy="ulysses"), "strategy", ()),
    ("usp without a degree", dict(strategy="usp"), "strategy", ()),
    ("a degree for ring", dict(ulysses_degree="2"), "ulysses_degree", ()),
    ("unknown strategy", dict(strategy="tree"), "strategy", ()),
    ("unknown layout", dict(layout="diagonal"), "layout", ()),
    ("documents of the wrong sum", dict(doc_lens="4,4"), "doc_lens", ()),
    ("H not a multiple of HKV", dict(heads="4", kv_heads="3"), "kv_heads", ()),
    ("scale overflowing f32", dict(scale="1e300"), "scale", ()),
    ("unknown dtype", dict(dtype="f8"), "dtype", ("python",)),  # Python's dtype is the tensors'
    ("negative timeout", dict(timeout="-1"), "timeout", ("python",)),
    ("negative softcap", dict(softcap="-1"), "softcap", ()),
    ("infinite softcap", dict(softcap="inf"), "softcap", ()),
    ("softcap 0 (none, as flash-attn's)", dict(softcap="0"), None, ()),
    ("softcap 30", dict(softcap="30", causal="1"), None, ()),
    ("softcap beyond f32", dict(softcap="1e300"), "softcap", ()),
    ("sinks, one per head", dict(sinks="0.5,-1,2,-inf"), None, ()),
    ("sinks of the wrong length", dict(sinks="0.5,1"), "sinks", ()),
    ("a NaN sink", dict(sinks="0,nan,0,0"), "sinks", ()),
    ("a +inf sink", dict(sinks="0,inf,0,0"), "sinks", ()),
    ("a sink beyond f32", dict(sinks="0,1e300,0,0"), "sinks", ()),
    ("precision f32 (the default)", dict(precision="f32"), None, ()),
    ("precision bf16 with bf16", dict(dtype="bf16", precision="bf16", causal="1"), None, ()),
    ("precision bf16 with f32", dict(precision="bf16"), "precision", ()),
    ("precision bf16 with f16", dict(dtype="f16", precision="bf16"), "precision", ()),
    ("unknown precision", dict(dtype="bf16", precision="fp8"), "precision", ()),
    ("cu_seqlens", dict(cu_seqlens="0,5,5,16", causal="1"), None, ("cli",)),  # the command line has --doc-lens
    ("cu_seqlens with doc_lens", dict(cu_seqlens="0,16", doc_lens="16"), "cu_seqlens", ("cli",)),
    ("cu_seqlens ending before S", dict(cu_seqlens="0,5,12"), "cu_seqlens", ("cli",)),
    ("cu_seqlens decreasing", dict(cu_seqlens="0,9,4,16"), "cu_seqlens", ("cli",)),
]


def normalize(front, msg):
    for name in sorted(NAMES[front], key=len, reverse=True):
        msg = msg.replace(name, NAMES[front][name])
    return msg


def cli_args(opts, scratch):
    out = []
    for key, value in opts.items():
        flag = "--" + key.replace("_", "-")
        if key == "causal":
            out += [flag] if value == "1" else []
        elif key == "sinks":  # the command line reads them from a file
            path = os.path.join(scratch, "sinks.npy")
            np.save(path, np.array([float(x) for x in value.split(",")]))
            out += [flag, path]
        else:
            out += [flag, value]
    return out


def run(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    lines = [l for l in p.stdout.splitlines() + p.stderr.splitlines()
             if l.startswith("accepted") or l.startswith("error: ") or l.startswith("ringattn: error: ")]
    return p.returncode, (lines[0].replace("ringattn: ", "", 1) if lines else "(nothing)")


def main():
    ap = argparse.ArgumentParser()
    for opt in ("--binary", "--cpp", "--python-entry", "--mpirun"):
        ap.add_argument(opt, required=True)
    a = ap.parse_args()
    env = dict(os.environ)
    mpirun = [a.mpirun, "-np", "2", "--oversubscribe"]
    failures = 0
    scratch = tempfile.mkdtemp(prefix="entry_points_")
    for what, opts, fault, cannot in CASES:
        o = dict(BASE, **opts)
        got = {}
        if "cli" not in cannot:
            got["cli"] = run(mpirun + [a.binary, "run", "--no-backward"] + cli_args(o, scratch), env)
        got["cpp"] = run(mpirun + [a.cpp] + [f"{k}={v}" for k, v in o.items()], env)
        if "python" not in cannot:
            got["python"] = run(mpirun + [sys.executable, a.python_entry] + [f"{k}={v}" for k, v in o.items()],
                                env)
        verdicts = {}
        for front, (code, line) in got.items():
            if fault is None:
                ok = code == 0 and (front == "cli" or line == "accepted")
            else:
                ok = code == 2 and line.startswith("error: ")
            msg = normalize(front, line)
            if fault is not None and not re.match(rf"error: {fault}\b", msg):
                ok = False
            verdicts[front] = msg
            print(f"{'ok  ' if ok else 'FAIL'} {what}: {front} exit {code}: {line}")
            failures += not ok
        if fault is not None and len(set(verdicts.values())) != 1:
            print(f"FAIL {what}: the messages differ once names are mapped: {verdicts}")
            failures += 1
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"{len(CASES)} cases, {failures} failed checks")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
