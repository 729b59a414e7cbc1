#!/usr/bin/python3
"""Runs one Python script under mpirun with a time limit and checks how the job ended.

    failure_test.py --mpirun mpirun --np 2 --expect watchdog --needle backward SCRIPT [ARGS...]

--expect ok        exit 0 within the limit.
--expect watchdog  a nonzero exit within the limit, and the watchdog's one line ("timeout: ...")
                   in the output, containing every --needle.
--expect abort     a nonzero exit within the limit (the job ended instead of hanging).
--mpi4py runs the script as `python -m mpi4py SCRIPT`, which turns an uncaught exception on any
rank into MPI_Abort. A run past the limit is killed (its whole process group) and fails the test.
Exit 0 when the job ended as expected, 1 otherwise.
"""

import argparse
import os
import signal
import subprocess
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--np", type=int, required=True)
    p.add_argument("--limit", type=float, default=60, help="seconds the job may take")
    p.add_argument("--expect", choices=("ok", "watchdog", "abort"), default="ok")
    p.add_argument("--needle", action="append", default=[], help="text the watchdog's line must contain")
    p.add_argument("--mpi4py", action="store_true", help="run as python -m mpi4py SCRIPT")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = [a.mpirun, "--oversubscribe", "-np", str(a.np), sys.executable, *(["-m", "mpi4py"] if a.mpi4py else []),
           a.script, *a.args]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=a.limit)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        hung = True
    took = time.monotonic() - t0
    sys.stdout.write(out)
    lines = [ln for ln in out.splitlines() if "timeout:" in ln]
    if hung:
        verdict = f"FAILED: still running after {a.limit:.0f} s (killed)"
    elif a.expect == "ok":
        verdict = "ok" if proc.returncode == 0 else f"FAILED: exit {proc.returncode}"
    elif proc.returncode == 0:
        verdict = "FAILED: exit 0 (expected the job to end with an error)"
    elif a.expect == "watchdog" and not any(all(n in ln for n in a.needle) for ln in lines):
        verdict = f"FAILED: no watchdog line containing {a.needle} (exit {proc.returncode})"
    else:
        verdict = f"ok (exit {proc.returncode})"
    print(f"{' '.join(cmd)}: {took:.1f} s, expected {a.expect} within {a.limit:.0f} s: {verdict}")
    return 0 if verdict.startswith("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
