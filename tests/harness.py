"""What the end-to-end test scripts share (tests/cli, tests/robust, tests/torch).

MPI_ENV is what Open MPI needs on a 2-core machine run as root (scripts/openmpi.env, the one place
it is defined): permission to run as root, more ranks than cores, and yielding while idle so
oversubscribed ranks do not starve each other.
check() records one named assertion; main() runs `test_NAME` of the calling script, given as the
first argument, and turns the recorded failures into the exit code (0 passed, 1 failed, 2 usage).

Scripts import it with their parent directory on sys.path:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""
import argparse
import functools
import os
import subprocess
import sys



def _read_env(path):
    env = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                env[key] = value
    return env


MPI_ENV = _read_env(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                                 "openmpi.env"))
FAILURES = []


def env():
    """This process's environment plus MPI_ENV."""
    return dict(os.environ, **MPI_ENV)


def run(cmd, timeout=120, extra_env=None):
    """Runs cmd (items converted with str) with MPI_ENV (and extra_env), no stdin, output captured as
    text."""
    return subprocess.run([str(c) for c in cmd], env=dict(env(), **(extra_env or {})), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


@functools.cache
def quiet_mpirun(mpirun):
    """The launcher as the tests that count stderr lines start it: [mpirun, "-q"], so that Open MPI 4's
    mpirun keeps its own words on a job's exit codes off stderr. Open MPI 5's mpirun has no -q (it
    exits 213 on it) and is then started as [mpirun]."""
    quiet = run([mpirun, "-q", "-np", 1, "true"], timeout=60).returncode == 0
    return [mpirun, "-q"] if quiet else [mpirun]


@functools.cache
def mpmd_launches(mpirun):
    """Whether mpirun starts a job of two programs (`-np 1 A : -np 1 B`), the way the tests give ranks
    different options. Open MPI 5.0's mpirun on an external PMIx, as Debian 13 packages it, dies of a
    segmentation fault on any such command line, `true` included: there a test skips its checks of
    ranks that disagree, and says so. Any other failure of mpirun fails the calling test."""
    p = run([mpirun, "-np", 1, "true", ":", "-np", 1, "true"], timeout=60)
    if p.returncode < 0:  # killed by a signal
        print(f"SKIP ranks started with different options: `{mpirun} -np 1 true : -np 1 true` died of "
              f"signal {-p.returncode}", flush=True)
    else:
        check(p.returncode == 0, f"`{mpirun} -np 1 true : -np 1 true` starts two programs "
                                 f"({p.returncode}: {p.stderr.strip()[:200]})")
    return p.returncode == 0


def check(cond, what):
    """Prints the check and records a failure; returns cond, so that a caller can stop on it."""
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def main(namespace, add_arguments=None):
    """Parses NAME --binary PATH [--mpirun EXE] (plus what add_arguments adds), stores the result as
    namespace["ARGS"] and runs namespace["test_" + NAME]. Returns the exit code."""
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("--binary", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    if add_arguments:
        add_arguments(ap)
    args = ap.parse_args()
    namespace["ARGS"] = args
    fn = namespace.get("test_" + args.name)
    if fn is None:
        print(f"unknown test {args.name}", file=sys.stderr)
        return 2
    fn()
    print(f"{args.name}: {'FAILED' if FAILURES else 'passed'} ({len(FAILURES)} failed checks)")
    return 1 if FAILURES else 0
