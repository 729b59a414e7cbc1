#!/usr/bin/python3
"""Faults during a `ringattn run` job, one named test per invocation.

    fault_test.py NAME --binary PATH [--mpirun EXE]

  watchdog            a rank stalls before its first send (hidden --debug-stall-rank/-seconds);
                      with --timeout 2 the job aborts with exit 3 within 15 s, and the message
                      names the ring step and the peer; a shorter stall does not trip it.
  kill_rank1_compute  kill -9 of rank 1 about 1 s into a several-second job: the job ends within
  kill_rank0_compute  15 s with a non-zero exit, no rank is left running, and --out holds nothing
                      (no o.npy ..., no hidden temporary file either).
  kill_during_write   the same, but the kill lands while the outputs are being written (as soon
                      as the first temporary file appears in --out): nothing may be left, not even
                      a hidden partial file.
  kill_during_layer_write  the same for `run --layer` (kill of rank 0), whose outputs are staged
                      by the same code.
Exits 0 when every assertion holds, 1 otherwise.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, env, main, quiet_mpirun  # noqa: E402

END_WITHIN_S = 15
ARGS = None  # set by harness.main


def start(n, *args):
    cmd = [*quiet_mpirun(ARGS.mpirun), "-np", str(n), ARGS.binary, "run", *map(str, args)]
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.Popen(cmd, env=env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(p, limit):
    """(exit code, stdout, stderr, timed_out); kills the whole process group past `limit` seconds."""
    try:
        out, err = p.communicate(timeout=limit)
        return p.returncode, out, err, False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return p.returncode, out, err, True


def children(pid):
    """Pids whose parent is pid (read from /proc, so no procps needed)."""
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name is in parentheses and may hold spaces: fields after the last ')'
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            kids.append(int(entry))
    return kids


def rank_pids(mpirun_pid, n, deadline):
    """{rank: pid} of the n ranks mpirun started (rank from each one's OMPI_COMM_WORLD_RANK)."""
    while time.monotonic() < deadline:
        ranks = {}
        for pid in children(mpirun_pid):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            except OSError:
                continue
            if b"OMPI_COMM_WORLD_RANK" in env:
                ranks[int(env[b"OMPI_COMM_WORLD_RANK"])] = pid
        if len(ranks) == n:
            return ranks
        time.sleep(0.05)
    return {}


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# --- watchdog ------------------------------------------------------------------------------------

def test_watchdog():
    for n in (2, 3):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "out")
            t0 = time.monotonic()
            p = start(n, "--seq", 256, "--heads", 2, "--head-dim", 16, "--timeout", 2, "--out", out,
                      "--debug-stall-rank", 1, "--debug-stall-seconds", 60)
            rc, stdout, stderr, timed_out = finish(p, 60)
            elapsed = time.monotonic() - t0
            text = stdout + stderr
            print(text.strip())
            check(not timed_out and elapsed < END_WITHIN_S, f"N={n}: a stalled rank ends the job in {elapsed:.1f} s "
                  f"(< {END_WITHIN_S} s; it stalls 60 s)")
            check(rc == 3, f"N={n}: exit 3 (got {rc})")
            line = next((l for l in text.splitlines() if "timeout" in l), "")
            check(re.search(r"step \d+", line) is not None, f"N={n}: the timeout message names the step: {line!r}")
            # The rank that times out ([rK] in the log tag) names another rank, the peer it waits on;
            # with N=2 that is rank 0 waiting on the stalled rank 1.
            waiting = re.search(r"\[r(\d+)\]", line)
            peers = {int(x) for x in re.findall(r"rank (\d+)", line)} - {int(waiting.group(1)) if waiting else -1}
            want = {1} if n == 2 else set(range(n))
            check(bool(peers & want), f"N={n}: the timeout message names the peer rank it waits on (found {peers})")
            check(not os.path.exists(out) or not os.listdir(out), f"N={n}: --out holds nothing: "
                  f"{sorted(os.listdir(out)) if os.path.exists(out) else []}")
    # a peer that is slow but alive does not trip the watchdog
    t0 = time.monotonic()
    p = start(2, "--seq", 256, "--heads", 2, "--head-dim", 16, "--timeout", 10, "--check",
              "--debug-stall-rank", 1, "--debug-stall-seconds", 1)
    rc, stdout, stderr, _ = finish(p, 60)
    check(rc == 0 and "PASSED" in stdout, f"a 1 s stall under --timeout 10 completes and passes --check (exit {rc}, "
          f"{time.monotonic() - t0:.1f} s) {stderr.strip()[-300:]}")


# --- kill -9 -------------------------------------------------------------------------------------

# About 7 s on one core per rank (forward + backward, S=16384, H=4, D=64, f32), so a kill after
# 1 s lands mid-run. For a kill during the writes a shorter job (0.5 s) is enough: this script
# polls --out every 2 ms meanwhile, which slows the ranks down on a 2-core machine.
LONG_JOB = ["--seq", 16384]
SHORT_JOB = ["--seq", 4096]


def kill_test(victim, when, job=None):
    # On a loaded machine the poller below may sleep through the whole write (tens of ms), or
    # between seeing a temporary file and the kill, while the job commits: an attempt in which
    # the complete set of outputs was in place before the kill proves nothing, and is repeated.
    job = job or (LONG_JOB if when == "compute" else SHORT_JOB)
    complete = None
    if when == "write":
        with tempfile.TemporaryDirectory() as d:
            rc, _, stderr, _ = finish(start(2, *job, "--out", d), 120)
            complete = sorted(os.listdir(d))
            check(rc == 0 and complete, f"the job completes undisturbed and writes {complete} {stderr.strip()[-300:]}")
    for attempt in range(1, 6):
        if kill_once(victim, when, job, complete) != "committed first":
            return
        print(f"attempt {attempt}: all outputs were committed before the kill landed; again")
    check(False, "caught the job during its writes in one of 5 attempts")


def kill_once(victim, when, job, complete):
    n = 2
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out")
        os.makedirs(out)
        p = start(n, *job, "--out", out)
        t0 = time.monotonic()
        ranks = rank_pids(p.pid, n, t0 + 20)
        check(len(ranks) == n, f"found the {n} rank processes under mpirun: {ranks}")
        if len(ranks) != n:
            finish(p, 1)
            return
        if when == "compute":
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
            listing = os.listdir(out)
            check(not listing and p.poll() is None, f"the job is still computing at 1 s (--out holds {listing})")
        else:  # the first temporary output file appears, then kill at once (the start-up probe of
            # --out, a short-lived .ringattn-probe-PID, is not one)
            staged = lambda: [f for f in os.listdir(out) if not f.startswith(".ringattn-probe-")]
            while p.poll() is None and not staged() and time.monotonic() - t0 < 60:
                time.sleep(0.002)
            caught = sorted(os.listdir(out))
            if caught == complete:
                finish(p, 60)
                return "committed first"
            check(p.poll() is None and caught, f"caught the job writing its outputs: {caught}")
        os.kill(ranks[victim], signal.SIGKILL)
        t_kill = time.monotonic()
        print(f"kill -9 rank {victim} (pid {ranks[victim]}) at {t_kill - t0:.2f} s", flush=True)
        rc, stdout, stderr, timed_out = finish(p, 60)
        ended = time.monotonic() - t_kill
        print(stderr.strip()[-1000:])
        check(not timed_out and ended < END_WITHIN_S, f"the job ended {ended:.1f} s after the kill (< {END_WITHIN_S} s)")
        check(rc != 0, f"non-zero exit (got {rc})")
        time.sleep(0.2)
        left = [pid for pid in ranks.values() if alive(pid)]
        check(not left, f"no rank process is left running: {left}")
        listing = sorted(os.listdir(out))
        if complete is not None and listing == complete:
            return "committed first"
        visible = [f for f in listing if not f.startswith(".")]
        hidden = [f for f in listing if f.startswith(".")]
        check(not visible, f"--out holds no output file: {visible}")
        check(not hidden, f"--out holds no hidden temporary file: {hidden}")


def test_kill_rank1_compute():
    kill_test(1, "compute")


def test_kill_rank0_compute():
    kill_test(0, "compute")


def test_kill_during_write():
    kill_test(1, "write")


def test_kill_during_layer_write():
    """--layer stages y, dx, the weight gradients and the generated inputs the same way."""
    kill_test(0, "write", ["--layer", "--model-dim", 256, "--seq", 4096])


if __name__ == "__main__":
    sys.exit(main(globals()))
