#!/usr/bin/python3
"""End-to-end checks of `ringattn decode`, one named test per invocation.

    decode_test.py NAME --binary PATH [--mpirun EXE]

Each test runs real mpirun jobs and exits 0 when every assertion holds, 1 otherwise.
"""
import json
import math
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, main, mpmd_launches, run  # noqa: E402

ARGS = None  # set by harness.main
SHAPE = ["--cache-len", "40", "--new-tokens", "2", "--steps", "3", "--heads", "4", "--kv-heads", "2",
         "--head-dim", "8"]


def decode(n, *args, timeout=300):
    return run([ARGS.mpirun, "-np", n, "--oversubscribe", ARGS.binary, "decode", *SHAPE, *args], timeout=timeout)


def test_out_is_one_set():
    """--out puts one complete set in place: a second run replaces the first's files and removes
    the ones it does not write (o_prefill.npy after --prefill load); `run --out` on the same
    directory removes decode's; a refused job leaves nothing behind."""
    with tempfile.TemporaryDirectory() as d:
        p = decode(2, "--out", d, "--stream-mib", "0")
        check(p.returncode == 0, f"decode --out: exit {p.returncode}: {p.stderr[-400:]}")
        first = sorted(os.listdir(d))
        check(first == ["k.npy", "o_decode.npy", "o_prefill.npy", "q.npy", "v.npy"], f"the set: {first}")
        o1 = np.load(os.path.join(d, "o_decode.npy"))
        p = decode(3, "--out", d, "--prefill", "load", "--stream-mib", "0")
        check(p.returncode == 0, f"decode --prefill load --out: exit {p.returncode}: {p.stderr[-400:]}")
        second = sorted(os.listdir(d))
        check(second == ["k.npy", "o_decode.npy", "q.npy", "v.npy"], f"the second set, without o_prefill: {second}")
        o2 = np.load(os.path.join(d, "o_decode.npy"))
        check(np.abs(o1 - o2).max() <= 1e-5, "the same decode rows at N = 2 and N = 3 (attended or loaded prompt)")
        p = run([ARGS.mpirun, "-np", "2", ARGS.binary, "run", "--seq", "16", "--out", d])
        check(p.returncode == 0, f"run --out: exit {p.returncode}")
        left = [f for f in os.listdir(d) if f.startswith("o_")]
        check(left == [], f"run --out removes decode's files from its set: {left}")
        # bad input: exit 2 on every rank, the new directory never created, nothing hidden left
        p = decode(2, "--new-tokens", "0", "--out", os.path.join(d, "new"))
        check(p.returncode == 2, f"--new-tokens 0: exit {p.returncode}")
        check(not os.path.exists(os.path.join(d, "new")), "a refused job creates no --out directory")
        hidden = [f for f in os.listdir(d) if f.startswith(".")]
        check(hidden == [], f"nothing hidden left: {hidden}")


def test_load_and_merge_checked():
    """--prefill load keeps the prompt's K/V unattended and checks the decode rows against their
    definition; --merge allreduce (recursive doubling with fixed partners; N = 3 folds a rank in first) gives the same rows to
    f32 rounding, the same on every rank. Bad values, sizes past memory or 2^50 positions, and ranks
    started with different options end with exit 2 on every rank."""
    for n in (1, 3):
        for merge in ("gather", "allreduce"):
            p = decode(n, "--prefill", "load", "--merge", merge, "--check", "--window", "7", "--stream-mib", "0")
            check(p.returncode == 0, f"N={n} --merge {merge}: exit {p.returncode}: {p.stdout[-600:]}{p.stderr[-300:]}")
            check("PASSED" in p.stdout and "identical on every rank: yes" in p.stdout, f"N={n} --merge {merge}")
    for bad in (["--prefill", "ring"], ["--merge", "tree"], ["--stream-mib", "-1"]):
        p = decode(2, *bad)
        check(p.returncode == 2 and bad[0] in p.stderr, f"{bad}: exit {p.returncode}, {p.stderr.strip()[:200]}")
    # sizes past this machine's memory, or past 2^50 positions: refused before anything is built,
    # naming the option furthest above its usual size
    for bad, needle in ((["--cache-len", "1000000000000"], "--cache-len 1000000000000: a cache of"),
                        (["--steps", "1000000000"], "--steps 1000000000: a cache of"),
                        (["--batch", "100000000", "--cache-len", "64"], "--batch 100000000: a cache of"),
                        (["--head-dim", "1000000000", "--cache-len", "64"], "--head-dim 1000000000: a cache of"),
                        (["--steps", "4611686018427387904", "--new-tokens", "2"], "is over 2^50")):
        p = run([ARGS.mpirun, "-np", 2, "--oversubscribe", ARGS.binary, "decode", *bad, "--stream-mib", "0"],
                timeout=60)
        lines = [l for l in p.stderr.splitlines() if l.startswith("ringattn")]
        check(p.returncode == 2 and len(lines) == 1 and needle in lines[0],
              f"{bad}: exit {p.returncode}, {lines[:2]}")
    # ranks started with different options: exit 2 on every rank, naming the option, in seconds
    if not mpmd_launches(ARGS.mpirun):
        return
    for opt, a, b in (("--prefill", "load", "attend"), ("--steps", "2", "3"), ("--timeout", "20", "30"),
                      ("--merge", "gather", "allreduce")):
        side = lambda v: ["-np", "1", ARGS.binary, "decode", *SHAPE, "--stream-mib", "0", opt, v]
        p = run([ARGS.mpirun, "--oversubscribe", *side(a), ":", *side(b)], timeout=60)
        lines = [l for l in p.stderr.splitlines() if l.startswith("ringattn")]
        check(p.returncode == 2 and lines and all(opt in l for l in lines),
              f"{opt} {a} on one rank, {b} on the other: exit {p.returncode}, {lines[:2]}")


def test_repeated_runs_bitwise_equal():
    """Two runs of the same job write bitwise the same o_decode.npy (the merge's order is fixed), for
    either merge; the job itself checks that every rank's O is bitwise the same (a digest)."""
    for merge in ("gather", "allreduce"):
        outs = []
        for _ in range(2):
            with tempfile.TemporaryDirectory() as d:
                p = decode(3, "--out", d, "--merge", merge, "--dtype", "bf16", "--window", "9", "--stream-mib", "0")
                check(p.returncode == 0 and "identical on every rank: yes" in p.stdout,
                      f"--merge {merge}: exit {p.returncode}, {p.stdout[-300:]}")
                f = os.path.join(d, "o_decode.npy")
                outs.append(open(f, "rb").read() if os.path.exists(f) else b"")
        check(outs[0] and outs[0] == outs[1], f"--merge {merge}: two runs' o_decode.npy are bitwise equal")


def test_report_fields():
    """The report has per rank the bytes one step read, the bandwidth reached and the stream
    bandwidth measured in the same run; the merge time and an MPI_Allreduce of as many values."""
    with tempfile.TemporaryDirectory() as d:
        rep = os.path.join(d, "r.json")
        p = decode(2, "--report", rep, "--stream-mib", "512")
        check(p.returncode == 0, f"exit {p.returncode}: {p.stderr[-400:]}")
        r = json.load(open(rep)) if p.returncode == 0 else {}
        B, T, H, D = 1, 2, 4, 8
        m = r.get("merge", {})
        check(m.get("state_values") == B * T * H * (D + 2), f"state values: {m.get('state_values')}")
        check(m.get("merge_s", 0) > 0 and m.get("allreduce_s", 0) > 0, f"merge times: {m}")
        check(r.get("stream_bytes_per_s", 0) > 1e8, f"stream bandwidth: {r.get('stream_bytes_per_s')}")
        check(r.get("stream_buffer_bytes") == 256 << 20, f"stream buffer per rank: {r.get('stream_buffer_bytes')}")
        total = 0
        for rr in r.get("ranks", []):
            dd = rr["decode"]
            # the rank's prompt and decoded positions, K and V, f32
            check(dd["kv_bytes_per_step"] == dd["cache_positions"] * 2 * 2 * D * 4, f"rank {rr['rank']}: {dd}")
            check(abs(dd["bytes_per_s"] - dd["kv_bytes_per_step"] / dd["step_s"]) <= 1e-6 * dd["bytes_per_s"],
                  f"rank {rr['rank']}: bytes_per_s")
            check(dd["stream_bytes_per_s"] > 1e8, f"rank {rr['rank']}: stream")
            total += dd["cache_positions"]
        check(total == 40 + 3 * 2, f"every position in one rank's cache: {total}")
        # config: every option with the value used (the scale and the watchdog resolved)
        cfg = r.get("config", {})
        want = {"scale": 1 / math.sqrt(D), "stream_mib": 512, "check": False, "out": "", "report": rep}
        check(all(cfg.get(k) == v for k, v in want.items()) and cfg.get("timeout", 0) >= 300,
              f"config: {({k: cfg.get(k) for k in [*want, 'timeout']})}")
        p = decode(2, "--report", rep, "--stream-mib", "0", "--scale", "0.5", "--timeout", "40")
        cfg = json.load(open(rep)).get("config", {}) if p.returncode == 0 else {}
        check(cfg.get("scale") == 0.5 and cfg.get("timeout") == 40, f"--scale 0.5 --timeout 40: {cfg}")


if __name__ == "__main__":
    sys.exit(main(globals()))
