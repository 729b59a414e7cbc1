#!/usr/bin/python3
"""Results that are never silently wrong or lost, one named test per invocation.

    outputs_test.py NAME --binary PATH [--mpirun EXE]

  concurrent_jobs       two jobs with different inputs on one --out, 20 times: every job that exits 0
                        leaves a directory whose o, lse, dq, dk, dv are the attention of the q, k, v,
                        dout beside them (numpy float64 reference), never a mix or zeros.
  special_report_paths  --report through /dev/stdout, /dev/null and a symlink is written through (the
                        device and the link stay); a report that is an input, the trace, an output,
                        the --out directory (by an absolute or a relative name), a directory or a
                        name too long is refused with exit 2 before anything runs.
  failed_commit_keeps_old  a directory standing on an output name makes the commit fail with exit 3,
                        and the earlier results stay whole (the same bytes); the directory stays.
  stale_outputs_removed a --no-backward run into an old directory removes the old dq, dk, dv and
                        keeps the inputs it read; an input that --out holds under a name the job
                        writes (inputs converted on load, a sinks file named o.npy) is refused with
                        exit 2 and every file stays.
  bad_input_creates_nothing  a job refused for bad input creates no --out directory; --out with a
                        missing parent says so.
  signals_exit_128_plus SIGINT and SIGTERM end a job with 130 and 143, removing what was staged.
  ranks_must_agree      ranks started with different S, heads, mask flag, layout or input files end
                        with exit 2 on every rank, naming the field and the ranks, within seconds.
  memory_plan           tiles far larger than the shards are capped (the job runs and passes
                        --check); a layer whose weights cannot fit is refused with exit 2 naming
                        --model-dim, in seconds.
Exits 0 when every assertion holds, 1 otherwise.
"""
import concurrent.futures
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, env, main, mpmd_launches, quiet_mpirun, run  # noqa: E402

ARGS = None  # set by harness.main


def ringattn(n, *args, timeout=120):
    return run([*quiet_mpirun(ARGS.mpirun), "-np", n, ARGS.binary, *args], timeout=timeout)


def error_lines(p):
    return [l for l in p.stderr.splitlines() if l.startswith("ringattn") or "] [r" in l]


def attention(q, k, v, dout, scale):
    """float64 attention and its gradients (no mask), [B, S, H, D] layout, GQA by repeat."""
    G = q.shape[2] // k.shape[2]
    k2, v2 = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k2) * scale
    s -= s.max(-1, keepdims=True)
    p = np.exp(s)
    l = p.sum(-1, keepdims=True)
    p /= l
    o = np.einsum("bhij,bjhd->bihd", p, v2)
    dp = np.einsum("bihd,bjhd->bhij", dout, v2)
    ds = p * (dp - np.einsum("bihd,bihd->bhi", dout, o)[..., None])
    dq = np.einsum("bhij,bjhd->bihd", ds, k2) * scale
    dk = np.einsum("bhij,bihd->bjhd", ds, q) * scale
    dv = np.einsum("bhij,bihd->bjhd", p, dout)
    B, S, HKV, D = k.shape
    dk = dk.reshape(B, S, HKV, G, D).sum(3)
    dv = dv.reshape(B, S, HKV, G, D).sum(3)
    return o, dq, dk, dv


def consistent(d):
    """Whether the outputs in d are the attention of the inputs beside them."""
    load = lambda n: np.load(os.path.join(d, n + ".npy")).astype(np.float64)
    try:
        q, k, v, dout = (load(n) for n in ("q", "k", "v", "dout"))
        got = [load(n) for n in ("o", "dq", "dk", "dv")]
    except (OSError, ValueError) as e:
        return f"unreadable: {e}"
    want = attention(q, k, v, dout, 1 / np.sqrt(q.shape[-1]))
    for name, g, w in zip(("o", "dq", "dk", "dv"), got, want):
        err = np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30)
        if not err <= 3e-4:
            return f"{name} is not the attention of the q, k, v beside it (rel err {err:.3g})"
    return None


# --- concurrent jobs ---------------------------------------------------------------------------

def test_concurrent_jobs():
    job = ["run", "--seq", 512, "--heads", 2, "--head-dim", 16, "--dtype", "f32"]
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cc")
        for rep in range(20):
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                futs = [pool.submit(ringattn, 1, *job, "--seed", 2 * rep + j, "--out", out) for j in (0, 1)]
                results = [f.result() for f in futs]
            codes = [p.returncode for p in results]
            if 0 in codes:
                problem = consistent(out)
                if problem:
                    bad += 1
                    print(f"repetition {rep}: exits {codes}: {problem}")
            leftovers = [f for f in os.listdir(out) if f.startswith(".")] if os.path.isdir(out) else []
            if leftovers:
                bad += 1
                print(f"repetition {rep}: hidden files left: {leftovers}")
            if codes != [0, 0]:
                print(f"repetition {rep}: exits {codes}: {[error_lines(p) for p in results]}")
        check(bad == 0, f"20 repetitions of two jobs on one --out: every successful job left a consistent set "
              f"({bad} inconsistent)")


# --- report and trace paths --------------------------------------------------------------------

SMALL = ["run", "--seq", 32, "--heads", 2, "--head-dim", 8]


def test_special_report_paths():
    p = ringattn(2, *SMALL, "--report", "/dev/stdout")
    check(p.returncode == 0 and '"ranks"' in p.stdout, f"--report /dev/stdout writes the report there (exit "
          f"{p.returncode})")
    check(os.path.islink("/dev/stdout"), "/dev/stdout is still a symlink")
    p = ringattn(2, *SMALL, "--report", "/dev/null")
    check(p.returncode == 0, f"--report /dev/null works (exit {p.returncode})")
    check(stat.S_ISCHR(os.stat("/dev/null").st_mode), "/dev/null is still a character device")
    with tempfile.TemporaryDirectory() as d:
        target, link = os.path.join(d, "real.json"), os.path.join(d, "link.json")
        open(target, "w").close()
        os.symlink(target, link)
        p = ringattn(2, *SMALL, "--report", link)
        check(p.returncode == 0 and os.path.islink(link), f"a symlinked report keeps the link (exit {p.returncode})")
        check(os.path.getsize(target) > 0 and json.load(open(target)).get("ranks"), "the link's target holds the report")
        inp = os.path.join(d, "in")
        p = ringattn(1, *SMALL, "--out", inp)
        check(p.returncode == 0, "made inputs")
        before = open(os.path.join(inp, "q.npy"), "rb").read()
        long_name = os.path.join(d, "r" * 256 + ".json")
        cases = {
            "an input file": (["--inputs", inp, "--report", os.path.join(inp, "q.npy")], "--report"),
            "the trace": (["--report", os.path.join(d, "same.json"), "--trace", os.path.join(d, "same.json")],
                          "--report"),
            "an output": (["--out", os.path.join(d, "o"), "--report", os.path.join(d, "o", "dq.npy")], "--report"),
            "the --out directory (report)": (["--out", os.path.join(d, "r.json"), "--report", os.path.join(d, "r.json")],
                                             "--report"),
            "the --out directory (trace)": (["--out", os.path.join(d, "t.json"), "--trace", os.path.join(d, "t.json")],
                                            "--trace"),
            "a directory (report)": (["--report", d], "--report"),
            "a directory (trace)": (["--trace", d], "--trace"),
            "a name too long": (["--report", long_name], "--report"),
        }
        for what, (extra, opt) in cases.items():
            args = (["run", "--heads", 2, "--head-dim", 8] if "--inputs" in extra else list(SMALL)) + extra
            t0 = time.monotonic()
            p = ringattn(2, *args, timeout=60)
            lines = error_lines(p)
            check(p.returncode == 2 and len(lines) == 1 and opt in lines[0],
                  f"report path is {what}: exit 2 naming {opt} ({p.returncode}: {lines[:2]})")
            check(time.monotonic() - t0 < 30, f"{what}: refused in seconds")
        check(open(os.path.join(inp, "q.npy"), "rb").read() == before, "the input file is untouched")
        # the same by a relative name, neither existing yet
        p = run([*quiet_mpirun(ARGS.mpirun), "-np", 2, "--wdir", d, ARGS.binary, *SMALL, "--report", "rel.json", "--out",
                 "rel.json"], timeout=60)
        lines = error_lines(p)
        check(p.returncode == 2 and len(lines) == 1 and "--out directory" in lines[0],
              f"--report and --out of one relative name: exit 2 ({p.returncode}: {lines[:2]})")
        for o in ("o", "r.json", "t.json", "rel.json"):
            check(not os.path.exists(os.path.join(d, o)), f"a refused job creates no --out directory ({o})")
        p = run([*quiet_mpirun(ARGS.mpirun), "-np", 2, ARGS.binary, "lab", "--report", "/proc/ringattn-outputs-test.json"])
        lines = error_lines(p)
        check(p.returncode == 2 and len(lines) == 1 and "--report" in lines[0],
              f"lab --report in /proc: exit 2 ({p.returncode}: {lines[:2]})")


# --- failed commits, stale names ---------------------------------------------------------------

JOB = ["run", "--seq", 64, "--heads", 2, "--head-dim", 8, "--dtype", "f64"]


def snapshot(d):
    return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))
            if os.path.isfile(os.path.join(d, f))}


def test_failed_commit_keeps_old():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "o4")
        p = ringattn(2, *JOB, "--seed", 1, "--out", out)
        check(p.returncode == 0, "first run")
        os.remove(os.path.join(out, "dv.npy"))
        os.mkdir(os.path.join(out, "dv.npy"))  # a directory standing where a file goes
        before = snapshot(out)
        p = ringattn(2, *JOB, "--seed", 2, "--out", out)
        lines = error_lines(p)
        check(p.returncode == 3 and len(lines) == 1 and "dv.npy" in lines[0],
              f"the commit fails with exit 3 naming dv.npy ({p.returncode}: {lines[:2]})")
        check(snapshot(out) == before, "every earlier output is still there, byte for byte")
        check(os.path.isdir(os.path.join(out, "dv.npy")), "the directory on dv.npy is not removed")
        check(not [f for f in os.listdir(out) if f.startswith(".")], "no hidden file is left")
        # the same with a report: it is written only when the outputs were
        rep = os.path.join(d, "r.json")
        p = ringattn(2, *JOB, "--seed", 3, "--out", out, "--report", rep)
        check(p.returncode == 3 and not os.path.exists(rep), "no report is written when the commit failed")


def test_stale_outputs_removed():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "o")
        check(ringattn(2, *JOB, "--seed", 1, "--out", out).returncode == 0, "a run with a backward pass")
        check(ringattn(2, *JOB, "--seed", 2, "--out", out, "--no-backward").returncode == 0, "a forward-only run")
        names = sorted(os.listdir(out))
        check(names == ["dout.npy", "k.npy", "lse.npy", "o.npy", "q.npy", "v.npy"],
              f"the old dq, dk, dv are gone: {names}")
        # a run that reads its inputs from --out keeps them
        p = ringattn(2, "run", "--inputs", out, "--out", out, "--no-backward")
        check(p.returncode == 0 and {"q.npy", "k.npy", "v.npy", "dout.npy"} <= set(os.listdir(out)),
              f"the inputs it read stay ({p.returncode}: {error_lines(p)[:1]})")
        # an input under a name the job writes is refused before anything runs: converted inputs are
        # written as used (q.npy ... as f32), and a sinks file may not stand on an output name
        sinks = os.path.join(out, "o.npy")
        before = snapshot(out)
        np.save(os.path.join(d, "sinks.npy"), np.zeros(2))
        for what, args in {"inputs converted to f32": ["--inputs", out, "--dtype", "f32"],
                           "a sinks file named o.npy": [*JOB[1:], "--sinks", sinks],
                           "a sinks file named dsinks.npy": [*JOB[1:], "--sinks", os.path.join(out, "dsinks.npy")]}.items():
            if "dsinks" in what:
                os.replace(os.path.join(d, "sinks.npy"), os.path.join(out, "dsinks.npy"))
                before = snapshot(out)
            elif "o.npy" in what:
                np.save(sinks, np.zeros(2))
                before = snapshot(out)
            p = ringattn(2, "run", *args, "--out", out)
            lines = error_lines(p)
            check(p.returncode == 2 and len(lines) == 1 and "--out" in lines[0] and "input" in lines[0],
                  f"{what}: exit 2 naming --out and the input ({p.returncode}: {lines[:2]})")
            check(snapshot(out) == before, f"{what}: every file is untouched")


def test_bad_input_creates_nothing():
    with tempfile.TemporaryDirectory() as d:
        inp = os.path.join(d, "in")
        check(ringattn(1, *SMALL, "--out", inp).returncode == 0, "made inputs")
        q = np.load(os.path.join(inp, "q.npy"))
        q[0, 3, 1, 2] = np.nan
        np.save(os.path.join(inp, "q.npy"), q)
        new = os.path.join(d, "new")
        p = ringattn(2, "run", "--inputs", inp, "--out", new)
        check(p.returncode == 2 and not os.path.exists(new), f"NaN in q: exit 2 and no {new} ({p.returncode})")
        p = ringattn(2, *SMALL, "--out", os.path.join(d, "missing", "out"))
        lines = error_lines(p)
        check(p.returncode == 2 and len(lines) == 1 and "parent" in lines[0],
              f"--out with a missing parent says so: {lines[:1]}")


# --- signals -----------------------------------------------------------------------------------

def test_signals_exit_128_plus():
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "out")
            cmd = [ARGS.binary, "run", "--seq", 16384, "--heads", 4, "--out", out]
            p = subprocess.Popen([str(c) for c in cmd], env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
            time.sleep(2.0)
            p.send_signal(sig)
            try:
                p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
            check(p.returncode == code, f"{sig.name}: exit {code} (got {p.returncode})")
            left = os.listdir(out) if os.path.isdir(out) else []
            check(not left, f"{sig.name}: nothing left in --out: {left}")


# --- ranks that disagree -----------------------------------------------------------------------

def mpmd(a, b, timeout=60):
    """Rank 0 runs `run a...`, rank 1 `run b...`."""
    cmd = [*quiet_mpirun(ARGS.mpirun), "-np", 1, ARGS.binary, "run", *a, ":", "-np", 1, ARGS.binary, "run", *b]
    return run(cmd, timeout=timeout)


def test_ranks_must_agree():
    if not mpmd_launches(ARGS.mpirun):
        return
    base = ["--heads", 2, "--head-dim", 8]
    with tempfile.TemporaryDirectory() as d:
        in64, in65 = os.path.join(d, "in64"), os.path.join(d, "in65")
        check(ringattn(1, "run", "--seq", 64, *base, "--out", in64).returncode == 0, "made 64-position inputs")
        check(ringattn(1, "run", "--seq", 65, *base, "--out", in65).returncode == 0, "made 65-position inputs")
        cases = [
            ("S from the files", ["--inputs", in64], ["--inputs", in65], "S ("),
            ("S from --seq", ["--seq", 64, *base], ["--seq", 65, *base], "S ("),
            ("heads", ["--seq", 64, "--heads", 2, "--head-dim", 8], ["--seq", 64, "--heads", 4, "--head-dim", 8], "H ("),
            ("a mask flag", ["--seq", 64, *base, "--causal"], ["--seq", 64, *base], "--causal"),
            ("the layout", ["--seq", 64, *base, "--layout", "striped"], ["--seq", 64, *base, "--layout", "zigzag"],
             "layout"),
            ("an option one rank cannot parse", ["--seq", 64, *base], ["--seq", "lots", *base], "--seq"),
            # the default watchdog counts --check's flops: the option itself is named, not --timeout
            ("--check alone", ["--seq", 64, *base, "--check"], ["--seq", 64, *base], "--check:"),
            ("an option one rank refuses", ["--seq", 64, *base, "--model-dim", 4], ["--seq", 64, *base], "--model-dim"),
        ]
        for what, a, b, field in cases:
            t0 = time.monotonic()
            p = mpmd(a, b)
            lines = error_lines(p)
            check(p.returncode == 2 and len(lines) == 1 and field in lines[0] and (
                "rank 0" in lines[0] and "rank 1" in lines[0] or "lots" in lines[0] or "only applies" in lines[0]),
                f"{what}: exit 2 naming {field!r} and the ranks ({p.returncode}: {lines[:2]})")
            check(time.monotonic() - t0 < 30, f"{what}: ends in seconds ({time.monotonic() - t0:.1f} s)")
    # probe and lab agree the same way, naming their own options
    small = ["--seq", 16, "--heads", 2, "--head-dim", 4, "--max-bytes", 4096, "--iters", 1]
    for cmd, a, b, field in (("probe", small, small + ["--dtype", "f64"], "the dtype"),
                             ("probe", small, small + ["--causal"], "--causal"),
                             ("lab", [], ["--no-causal"], "--no-causal"),
                             ("lab", [], ["--skip-empty"], "--skip-empty"),
                             ("lab", ["--partition", "2,3"], ["--partition", "3,2"], "the shard sizes")):
        t0 = time.monotonic()
        p = run([*quiet_mpirun(ARGS.mpirun), "-np", 1, ARGS.binary, cmd, *a, ":", "-np", 1, ARGS.binary, cmd, *b], timeout=60)
        lines = error_lines(p)
        check(p.returncode == 2 and len(lines) == 1 and f"ranks disagree on {field}" in lines[0]
              and time.monotonic() - t0 < 30,
              f"{cmd} {' '.join(map(str, b))}: exit 2 naming {field!r} ({p.returncode}: {lines[:2]})")


# --- memory ------------------------------------------------------------------------------------

def test_memory_plan():
    t0 = time.monotonic()
    p = ringattn(2, "run", "--seq", 97, "--heads", 2, "--head-dim", 8, "--tile-q", 65536, "--tile-k", 65536,
                 "--check", timeout=60)
    check(p.returncode == 0 and "PASSED" in p.stdout and time.monotonic() - t0 < 30,
          f"tiles of 65536 at S=97 are capped at the shards: exit {p.returncode} in {time.monotonic() - t0:.1f} s")
    t0 = time.monotonic()
    p = ringattn(2, "run", "--layer", "--model-dim", 10000000, "--seq", 64, timeout=60)
    lines = error_lines(p)
    check(p.returncode == 2 and len(lines) == 1 and "--model-dim" in lines[0] and time.monotonic() - t0 < 30,
          f"a layer of M=10^7: exit 2 naming --model-dim before allocating ({p.returncode}: {lines[:1]})")


if __name__ == "__main__":
    sys.exit(main(globals()))
