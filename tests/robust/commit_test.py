#!/usr/bin/python3
"""The commit of a job's outputs into --out, and the --out checks, one named test per invocation.

    commit_test.py NAME --binary PATH [--mpirun EXE]

  kill_at_each_commit_step  rank 0 kills itself with SIGKILL right after the k-th change its commit
                        makes to --out (hidden hook RINGATTN_DEBUG_KILL_AT_COMMIT_STEP=k), for every
                        k until a job gets through its whole commit. After each kill (and the SIGTERM
                        Open MPI then sends rank 1, whose handler must not delete what the commit
                        needs), the documented recovery, `sh DIR/.ringattn-*.commit` (even k) or the
                        next job on --out (odd k; one refused for a bad --report, so that it writes
                        nothing itself), leaves exactly one complete set, the old one or the new
                        one byte for byte, and no hidden entry. A last normal job leaves its own set.
                        At N = 3 the same for the first output moved into place (k = 12), where
                        the earlier commit left only the new o.npy and a hidden .ringattn-*.old.
  failed_commit_puts_old_back  a rename that fails at step k while rank 0 lives (hidden hook
                        RINGATTN_DEBUG_FAIL_AT_COMMIT_STEP=k): exit 3, one line, the old set byte for
                        byte and nothing hidden; and rank 0 killed at each step of that undoing: sh
                        or the next job finishes the turned-around journal into the old set.
  out_name_too_long     --out whose last name has 300 characters (and a path longer than PATH_MAX):
                        exit 2 on every rank, one error line naming --out, before any compute (a job
                        that computes for seconds is refused in well under that), nothing created.
  out_parent_not_writable  --out in /proc, under a file, and (when not root) in a read-only
                        directory: exit 2 before compute, one line naming --out.
  out_symlink_swap      --out is a symlink that is swapped to another directory while the job
                        stages its outputs: the job's outputs land whole in the directory the link
                        named when the job started, and neither directory holds a .ringattn-* entry.
Exits 0 when every assertion holds, 1 otherwise.
"""
import glob
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, env, main, quiet_mpirun, run  # noqa: E402

ARGS = None  # set by harness.main
JOB = ["run", "--seq", 64, "--heads", 2, "--head-dim", 8, "--dtype", "f64"]
SLOW_JOB = ["run", "--seq", 32768, "--heads", 4]  # tens of seconds of compute per rank


def ringattn(n, *args, timeout=120, extra_env=None):
    return run([*quiet_mpirun(ARGS.mpirun), "-np", n, ARGS.binary, *args], timeout=timeout, extra_env=extra_env)


def error_lines(p):
    return [l for l in p.stderr.splitlines() if l.startswith("ringattn") or "] [r" in l]


def made(p, what):
    """Checks that the job p exited 0, saying why not (its exit and ringattn's line, else the first
    line of mpirun's that is not a rule): True if it did."""
    why = (error_lines(p) or [l for l in p.stderr.splitlines() if l.strip("- ")] or [""])[0]
    return check(p.returncode == 0, what + ("" if p.returncode == 0 else f" (exit {p.returncode}: {why[-300:]})"))


def snapshot(d):
    """{name: bytes} of the visible files of d."""
    return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))
            if not f.startswith(".") and os.path.isfile(os.path.join(d, f))}


def hidden(d):
    return sorted(f for f in os.listdir(d) if f.startswith("."))


def describe(got, sets):
    for name, want in sets.items():
        if got == want:
            return name
    return f"a mix: {sorted(got)}"


# --- SIGKILL during the commit ----------------------------------------------------------------

def test_kill_at_each_commit_step():
    with tempfile.TemporaryDirectory() as d:
        refs = {}  # N: the old and the new set as N ranks write them (the sums' order depends on N)
        for n in (2, 3):
            for name, seed in (("the old set", 1), ("the new set", 2)):
                ref = os.path.join(d, f"ref{n}_{seed}")
                if not made(ringattn(n, *JOB, "--seed", seed, "--out", ref), f"reference run N={n} seed {seed}"):
                    return
                refs.setdefault(n, {})[name] = snapshot(ref)
            check(refs[n]["the old set"] != refs[n]["the new set"] and len(refs[n]["the new set"]) == 9,
                  f"N={n}: two different complete sets of 9 files: {sorted(refs[n]['the new set'])}")
        cases = [(2, k) for k in range(1, 60)] + [(3, 12)]
        steps = None  # the number of steps of a whole commit, once a job got through it
        for n, k in cases:
            sets = refs[n]
            if n == 2 and steps is not None and k > steps:
                continue
            out = os.path.join(d, f"out{n}_{k}")
            if not made(ringattn(n, *JOB, "--seed", 1, "--out", out), f"N={n} k={k}: the old set"):
                continue
            p = ringattn(n, *JOB, "--seed", 2, "--out", out, timeout=60,
                         extra_env={"RINGATTN_DEBUG_KILL_AT_COMMIT_STEP": str(k)})
            if p.returncode == 0:
                # k is past the last step: the whole commit ran
                check(snapshot(out) == sets["the new set"] and not hidden(out),
                      f"N={n} k={k}: an undisturbed commit leaves the new set and nothing hidden")
                if n == 2:
                    steps = k - 1
                continue
            after_kill = sorted(os.listdir(out))
            how = finish_by(k, n, out)
            got = snapshot(out)
            verdict = describe(got, sets)
            check(verdict in sets and not hidden(out),
                  f"N={n} k={k}: killed (exit {p.returncode}) leaving {after_kill}; after {how}: {verdict}, "
                  f"hidden {hidden(out)}")
        steps = steps or 0
        # 1 journal, 2 the set-aside directory, 3-11 the old files aside, 12-20 the new ones in,
        # 21-23 the cleanup (an older ringattn had 18 renames and no journal)
        check(steps >= 20, f"the commit was interrupted after each of its {steps} steps (expected at least 20: "
              f"the journal and 18 renames)")
        # a normal job after an interrupted commit leaves its own set and nothing else
        out = os.path.join(d, "out2_1")
        p = ringattn(2, *JOB, "--seed", 1, "--out", out, extra_env={"RINGATTN_DEBUG_KILL_AT_COMMIT_STEP": "5"})
        p = ringattn(2, *JOB, "--seed", 2, "--out", out)
        check(p.returncode == 0 and snapshot(out) == refs[2]["the new set"] and not hidden(out),
              f"the next successful job leaves its own set and nothing hidden ({p.returncode}, {hidden(out)})")


# --- a failure while rank 0 lives ----------------------------------------------------------------

def finish_by(k, n, out):
    """Finishes what a killed commit left in out: `sh` its journals (even k) or the next job (odd k)."""
    if k % 2 == 0:
        journals = glob.glob(os.path.join(out, ".ringattn-*.commit"))
        for j in journals:
            r = subprocess.run(["/bin/sh", j], capture_output=True, text=True, timeout=30)
            check(r.returncode == 0, f"k={k}: sh {os.path.basename(j)} exits 0 ({r.stderr.strip()})")
        return f"`sh {' '.join(os.path.basename(j) for j in journals) or '(no journal)'}`"
    r = ringattn(n, *JOB, "--seed", 3, "--out", out, "--report", "/proc/ringattn-commit-test.json")
    check(r.returncode == 2, f"k={k}: the next job is refused ({r.returncode})")
    return "the next job (refused for its --report)"


def test_failed_commit_puts_old_back():
    with tempfile.TemporaryDirectory() as d:
        ref = os.path.join(d, "ref")
        if not made(ringattn(2, *JOB, "--seed", 1, "--out", ref), "the old set"):
            return
        old = snapshot(ref)
        # a rename that fails at step k (hidden hook): exit 3, the old set byte for byte, nothing hidden
        for k in (1, 2, 3, 11, 12, 16, 20):
            out = os.path.join(d, f"fail{k}")
            if not made(ringattn(2, *JOB, "--seed", 1, "--out", out), f"k={k}: the old set"):
                continue
            p = ringattn(2, *JOB, "--seed", 2, "--out", out, timeout=60,
                         extra_env={"RINGATTN_DEBUG_FAIL_AT_COMMIT_STEP": str(k)})
            lines = error_lines(p)
            check(p.returncode == 3 and len(lines) == 1 and "earlier outputs were kept" in lines[0],
                  f"k={k}: exit 3, one line saying the earlier outputs were kept ({p.returncode}: {lines[:2]})")
            check(snapshot(out) == old and not hidden(out),
                  f"k={k}: the old set byte for byte ({describe(snapshot(out), {'the old set': old})}), nothing "
                  f"hidden {hidden(out)}")
        # killed while putting the old set back (fails after the 4th new file moved in): the journal,
        # turned around, is finished by sh or the next job into the old set
        fail, k, ended = 15, 16, False
        while not ended and k < 60:
            out = os.path.join(d, f"back{k}")
            if not made(ringattn(2, *JOB, "--seed", 1, "--out", out), f"k={k}: the old set"):
                k += 1
                continue
            p = ringattn(2, *JOB, "--seed", 2, "--out", out, timeout=60,
                         extra_env={"RINGATTN_DEBUG_FAIL_AT_COMMIT_STEP": str(fail),
                                    "RINGATTN_DEBUG_KILL_AT_COMMIT_STEP": str(k)})
            ended = p.returncode == 3
            left = sorted(os.listdir(out))
            how = "nothing (the job undid its commit)" if ended else finish_by(k, 2, out)
            check(snapshot(out) == old and not hidden(out),
                  f"fail at {fail}, kill at {k} (exit {p.returncode}, leaving {left}); after {how}: "
                  f"{describe(snapshot(out), {'the old set': old})}, hidden {hidden(out)}")
            k += 1
        check(ended and k > 30, f"the undoing was interrupted after each of its {k - 17} steps")


# --- --out checked before compute -------------------------------------------------------------

def refused_fast(n, out, what, words=("--out",)):
    t0 = time.monotonic()
    p = ringattn(n, *SLOW_JOB, "--out", out, timeout=120)
    elapsed = time.monotonic() - t0
    lines = error_lines(p)
    check(p.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words),
          f"N={n} {what}: exit 2, one line naming {', '.join(words)} ({p.returncode}: {[l[:160] for l in lines[:2]]})")
    check(elapsed < 10, f"N={n} {what}: refused before compute ({elapsed:.1f} s; the job computes for longer)")


def test_out_name_too_long():
    with tempfile.TemporaryDirectory() as d:
        for n in (1, 2, 3):
            refused_fast(n, os.path.join(d, "o" * 300), "a 300-character name", ("--out", "300"))
        deep = os.path.join(d, *(["d" * 200] * 22))  # 4400 characters, each name allowed
        refused_fast(2, deep, "a path longer than PATH_MAX")
        check(os.listdir(d) == [], f"nothing was created: {os.listdir(d)}")


def test_out_parent_not_writable():
    with tempfile.TemporaryDirectory() as d:
        refused_fast(2, "/proc/ringattn-commit-test", "a directory in /proc")
        open(os.path.join(d, "file"), "w").close()
        refused_fast(2, os.path.join(d, "file", "out"), "under a file")
        if os.geteuid() != 0:
            ro = os.path.join(d, "ro")
            os.mkdir(ro, 0o555)
            refused_fast(2, os.path.join(ro, "out"), "in a read-only directory")
            refused_fast(2, ro, "a read-only directory")


# --- the --out symlink swapped while staging --------------------------------------------------

def test_out_symlink_swap():
    job = ["run", "--seq", 4096, "--heads", 2, "--head-dim", 64]
    for attempt in range(1, 6):
        with tempfile.TemporaryDirectory() as d:
            x, y, link = os.path.join(d, "x"), os.path.join(d, "y"), os.path.join(d, "link")
            os.mkdir(x)
            os.mkdir(y)
            os.symlink(x, link)
            cmd = [*quiet_mpirun(ARGS.mpirun), "-np", "2", ARGS.binary, *map(str, job), "--out", link]
            p = subprocess.Popen(cmd, env=env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            t0 = time.monotonic()
            staging = lambda: [f for f in os.listdir(x) if f.endswith(".tmp")]
            while p.poll() is None and not staging() and time.monotonic() - t0 < 60:
                time.sleep(0.002)
            caught = bool(staging())
            if caught:  # swap the link atomically
                os.symlink(y, link + ".new")
                os.replace(link + ".new", link)
            try:
                _, err = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            if not caught:
                print(f"attempt {attempt}: the job staged and committed between two polls; again")
                continue
            print(f"swapped {link} from x to y during staging; exit {p.returncode} {err.strip()[-300:]}")
            names = sorted(snapshot(x))
            check(p.returncode == 0 and names == ["dk.npy", "dout.npy", "dq.npy", "dv.npy", "k.npy", "lse.npy",
                                                   "o.npy", "q.npy", "v.npy"],
                  f"the outputs land whole in x, where --out pointed at the start (exit {p.returncode}, {names})")
            check(not os.listdir(y), f"y is untouched: {os.listdir(y)}")
            check(not hidden(x) and not hidden(y), f"no hidden entry is left: x {hidden(x)}, y {hidden(y)}")
            return
    check(False, "caught the job while it staged in one of 5 attempts")


if __name__ == "__main__":
    sys.exit(main(globals()))
