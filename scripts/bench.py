#!/usr/bin/python3
"""The benchmarks of ringattn, one driver: each subcommand measures one thing and writes its rows to
one CSV schema (results.py renders the tables of README.md and docs/ from such CSVs).

    scripts/bench.py kernel    [--reps 5] [--rounds 3] [--targets default,AVX2] [--seqs 4096,8192]
                               [--head-dims 64,128] [--dtypes f32,f64] [--no-pieces] [--no-causal]
    scripts/bench.py vs-torch  [--seq 8192] [--heads 8] [--head-dim 64] [--iters 3] [--rounds 5]
                               [--causal] [--no-torch] [--targets default]
    scripts/bench.py vs-sdpa   [--python "CMD"] [--seqs 4096,8192] [--iters 3] [--rounds 3] [--dtypes f32]
    scripts/bench.py python    [--seq 8192] [--heads 8] [--head-dim 64] [--iters 3] [--rounds 3]
    scripts/bench.py layouts   [--seq 8192] [--heads 4] [--head-dim 64] [--iters 3] [--timed 2] [--counted "4 8"]
    scripts/bench.py memory    [--seqs "16384 65536"] [--ranks 2] [--layout contiguous]
    scripts/bench.py dtype     [--rounds 5] [--shm-shape "OPTS"] [--tcp-shape "OPTS"]

Every subcommand takes --out FILE (default build/bench/SUBCOMMAND.csv; the file is replaced) and
prints its rows as a table. The binaries come from RINGATTN_BUILD (default build/), built first when
missing. A bad option is one line on stderr and exit 2 before anything is built or run.

CSV columns (docs/benchmarks.md defines every metric):
    benchmark   the subcommand
    case        what was measured, as key=value words (shape, dtype, ranks, target selection, ...)
    metric      which figure of that case
    value unit  the figure and its unit (s, GFLOP/s, %, x, MiB, bytes)
    commit      the commit of the sources the build was configured from (short hash; "+dirty" when
                src/, include/, apps/, python/ or tests/bench/ differ from it)
    cpu simd    the CPU model (/proc/cpuinfo) and the SIMD target the kernels ran on
    date        UTC, ISO 8601, when the subcommand started
    command     the command line that produced the row
"""
import argparse
import csv
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
BUILD = os.environ.get("RINGATTN_BUILD") or os.path.join(ROOT, "build")
BIN = os.path.join(BUILD, "ringattn")
KERNEL_BENCH = os.path.join(BUILD, "tests", "bench", "kernel_bench")
COLUMNS = ["benchmark", "case", "metric", "value", "unit", "commit", "cpu", "simd", "date", "command"]
med = statistics.median


# ---- the command line ----------------------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit 2 (the scripts' convention for bad input)."""

    def error(self, message):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def positive(text):
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return int(text)


def positive_list(text):
    """'4 8' or '4,8' -> [4, 8]; every word a positive integer."""
    words = text.replace(",", " ").split()
    if not words or not all(w.isdigit() and int(w) >= 1 for w in words):
        raise argparse.ArgumentTypeError(f"expected positive integers, got '{text}'")
    return [int(w) for w in words]


def words(text):
    out = text.replace(",", " ").split()
    if not out:
        raise argparse.ArgumentTypeError("expected one or more names")
    return out


def shape_opts(text):
    out = shlex.split(text)
    if not out:
        raise argparse.ArgumentTypeError("expected ringattn run options")
    return out


# ---- the machine and the tree ---------------------------------------------------------------------
def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.uname().machine


def source_dir():
    """The source tree the build was configured from (its CMakeCache.txt), else this checkout."""
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("CMAKE_HOME_DIRECTORY:"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return ROOT


def commit():
    """The commit of the sources the binaries were built from; "+dirty" when the code differs."""
    git = ["git", "-C", source_dir()]
    p = subprocess.run(git + ["rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    if p.returncode != 0:
        return "unknown"
    dirty = subprocess.run(git + ["status", "--porcelain", "-uno", "--", "src", "include", "apps", "python",
                                  "tests/bench", "CMakeLists.txt"], capture_output=True, text=True).stdout.strip()
    return p.stdout.strip() + ("+dirty" if dirty else "")


def mpi_env(**extra):
    env = dict(os.environ)
    with open(os.path.join(SCRIPTS, "openmpi.env")) as f:
        for line in f:
            if "=" in line and not line.startswith("#"):
                k, v = line.strip().split("=", 1)
                env.setdefault(k, v)
    env.update(extra)
    return env


def ensure_built(*targets):
    """Build the targets whose files are missing (cmake, Release, in RINGATTN_BUILD)."""
    need = [t for t, path in targets if not os.path.exists(path)]
    if not need:
        return
    print(f"bench: building {', '.join(need)} in {BUILD}", file=sys.stderr)
    subprocess.run(["cmake", "-S", ROOT, "-B", BUILD, "-DCMAKE_BUILD_TYPE=Release"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", BUILD, "-j", str(os.cpu_count() or 2), "--target", *need], check=True)


def run(cmd, env=None, what=None):
    """Run a command; on failure print its last lines and exit 3 (a runtime failure)."""
    p = subprocess.run(cmd, env=env or mpi_env(), capture_output=True, text=True)
    if p.returncode != 0:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-5:])
        print(f"bench: {what or ' '.join(cmd[:4])} failed (exit {p.returncode}):\n{tail}", file=sys.stderr)
        sys.exit(3)
    return p.stdout


def mpirun(n, args, report, simd=None, bind="core", prefix=()):
    env = mpi_env()
    if simd:
        env["RINGATTN_SIMD"] = simd
    else:
        env.pop("RINGATTN_SIMD", None)
    run([*prefix, "mpirun", "-np", str(n), "--bind-to", bind, BIN, *args, "--report", report], env=env,
        what=f"ringattn {' '.join(args)} (N={n})")
    with open(report) as f:
        return json.load(f)


def total(rep):
    return rep["time"]["forward_s"] + rep["time"]["backward_s"]


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


# ---- rows -----------------------------------------------------------------------------------------
class Rows:
    def __init__(self, benchmark):
        self.benchmark = benchmark
        self.rows = []

    def add(self, case, metric, value, unit, simd=""):
        self.rows.append(dict(benchmark=self.benchmark, case=case, metric=metric, value=value, unit=unit, simd=simd))


def case(**kv):
    return " ".join(f"{k}={v}" for k, v in kv.items())


def fmt_value(v):
    return f"{v:.6g}" if isinstance(v, float) else str(v)


# ---- kernel: the block kernels against the FMA peak ---------------------------------------------
def kernel_table(out):
    """Rows of a kernel_bench table: the words of each line that is not a comment or the header."""
    lines = [ln.split() for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
    return [w for w in lines if w[0] != "target"]


def pct(word):
    return float(word.rstrip("%"))


def bench_kernel(a, rows):
    ensure_built(("kernel_bench", KERNEL_BENCH), ("ringattn_app", BIN))
    for target in a.targets:
        env = mpi_env()
        env.pop("RINGATTN_SIMD", None)
        if target != "default":
            env["RINGATTN_SIMD"] = target
            probe = subprocess.run([KERNEL_BENCH, "--seqs", "64", "--heads", "1", "--head-dims", "8", "--dtypes", "f32",
                                    "--reps", "1", "--forward-only"], env=env, capture_output=True)
            if probe.returncode != 0:
                log(f"this CPU or build cannot run {target}: skipped")
                continue
        selection = "default" if target == "default" else f"RINGATTN_SIMD={target}"
        for dt in a.dtypes:
            seqs = a.seqs if dt == "f32" else a.seqs[:1]  # f64 at the first S only: half the rate, same shape
            log(f"kernel_bench {selection} {dt}")
            out = run([KERNEL_BENCH, "--seqs", ",".join(map(str, seqs)), "--heads", "8", "--head-dims",
                       ",".join(map(str, a.head_dims)), "--dtypes", dt, "--reps", str(a.reps)], env=env)
            for w in kernel_table(out):
                simd, c = w[0], case(selection=selection, dtype=w[1], S=w[2], H=w[3], D=w[4], mask="none")
                for p, base, dot in (("forward", 5, 15), ("backward", 10, 16)):
                    rows.add(c, f"{p}_gflops", float(w[base]), "GFLOP/s", simd)
                    rows.add(c, f"{p}_peak_gflops", float(w[base + 1]), "GFLOP/s", simd)
                    rows.add(c, f"{p}_of_peak", pct(w[base + 2]), "%", simd)
                    rows.add(c, f"{p}_best_of_peak", pct(w[base + 3]), "%", simd)
                    rows.add(c, f"{p}_of_sustained", pct(w[base + 4]), "%", simd)
                    if len(w) > dot and w[dot] != "-":  # bf16 on a dot-product instruction: over its peak
                        rows.add(c, f"{p}_of_dot_peak", pct(w[dot]), "%", simd)
        if a.pieces:
            log(f"kernel_bench --pieces {selection}")
            out = run([KERNEL_BENCH, "--pieces", "--head-dims", ",".join(map(str, a.head_dims)), "--dtypes",
                       ",".join(a.dtypes)], env=env)
            names = ["score_of_peak", "accumulate_of_peak", "exp_of_products", "piece_of_peak",
                     "tile_start_of_products", "piece_median_of_peak"]
            for w in kernel_table(out):
                simd, c = w[0], case(selection=selection, dtype=w[1], D=w[2], piece="default-tiles")
                rows.add(c, "peak_gflops", float(w[3]), "GFLOP/s", simd)
                for name, word in zip(names, w[4:10]):
                    if word != "-":  # bf16 on a dot-product instruction: no tile start or median piece
                        rows.add(c, name, pct(word), "%", simd)
    if not a.causal:
        return
    # The causal mask at N=2: causal zigzag against the same run unmasked, alternating per round.
    runargs = ["run", "--seq", str(a.causal_seq), "--heads", "8", "--head-dim", "64", "--iters", "3", "--warmup", "1"]
    with tempfile.TemporaryDirectory() as d:
        ratios, flops, simd = [], None, ""
        for r in range(a.rounds):
            log(f"causal against non-causal, round {r + 1}/{a.rounds}")
            full = mpirun(2, runargs, f"{d}/full.json")
            causal = mpirun(2, runargs + ["--causal", "--layout", "zigzag"], f"{d}/causal.json")
            ratios.append(total(causal) / total(full))
            flops = causal["imbalance"]["total_flops"] / full["imbalance"]["total_flops"]
            simd = full["config"]["simd"]
    c = case(N=2, S=a.causal_seq, H=8, D=64, dtype="f32", layout="zigzag", rounds=a.rounds)
    rows.add(c, "causal_over_full_time", med(ratios), "x", simd)
    rows.add(c, "causal_over_full_flops", flops, "x", simd)


# ---- vs-torch: ringattn at N=1 and N=2 against PyTorch eager -------------------------------------
def bench_vs_torch(a, rows):
    ensure_built(("ringattn_app", BIN))
    cores = os.cpu_count() or 1
    mask = "causal" if a.causal else "none"
    shape = dict(S=a.seq, H=a.heads, D=a.head_dim, dtype="f32", mask=mask)
    runargs = ["run", "--seq", str(a.seq), "--heads", str(a.heads), "--head-dim", str(a.head_dim), "--layout",
               "zigzag", "--iters", str(a.iters), "--warmup", "1"] + (["--causal"] if a.causal else [])
    torch_total = None
    if a.torch:
        log("PyTorch eager")
        t = json.loads(run(["/usr/bin/python3", os.path.join(ROOT, "tests", "bench", "torch_attention.py"), "--seq",
                            str(a.seq), "--heads", str(a.heads), "--head-dim", str(a.head_dim), "--threads", str(cores),
                            "--iters", str(a.iters)] + (["--causal"] if a.causal else []), what="torch_attention.py"))
        c = case(impl="pytorch-eager", threads=t["threads"], torch=t["torch"], **shape)
        torch_total = t["forward_s"] + t["backward_s"]
        rows.add(c, "forward_s", t["forward_s"], "s")
        rows.add(c, "backward_s", t["backward_s"], "s")
        rows.add(c, "total_s", torch_total, "s")
        rows.add(c, "gflops", (t["flops_forward"] + t["flops_backward"]) / torch_total * 1e-9, "GFLOP/s")
    for target in a.targets:
        simd = None if target == "default" else target
        env = mpi_env(**({"RINGATTN_SIMD": simd} if simd else {}))
        if not simd:
            env.pop("RINGATTN_SIMD", None)
        if subprocess.run(["mpirun", "-np", "1", BIN, "run", "--seq", "8", "--iters", "1"], env=env,
                          capture_output=True).returncode != 0:
            log(f"kernels {target}: this build or CPU cannot run them: skipped")
            continue
        n1, n2, pair = [], [], []
        with tempfile.TemporaryDirectory() as d:
            for r in range(a.rounds):
                log(f"kernels {target}: round {r + 1}/{a.rounds}")
                n1.append(mpirun(1, runargs, f"{d}/n1.json", simd))
                n2.append(mpirun(2, runargs, f"{d}/n2.json", simd))
                if cores >= 2:  # two N=1 jobs at once, one per core: what one core does while the other works
                    jobs = [subprocess.Popen(["taskset", "-c", str(i), "mpirun", "-np", "1", "--bind-to", "none", BIN,
                                              *runargs, "--report", f"{d}/c{i}.json"], env=env,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in (0, 1)]
                    if all(j.wait() == 0 for j in jobs):
                        pair.append(max(total(json.load(open(f"{d}/c{i}.json"))) for i in (0, 1)))
        ran = n1[0]["config"]["simd"]
        selection = "default" if not simd else f"RINGATTN_SIMD={simd}"
        flops = n1[0]["imbalance"]["total_flops"]
        for n, reps in ((1, n1), (2, n2)):
            c = case(impl="ringattn", N=n, selection=selection, rounds=a.rounds, **shape)
            f, b = med(x["time"]["forward_s"] for x in reps), med(x["time"]["backward_s"] for x in reps)
            rows.add(c, "forward_s", f, "s", ran)
            rows.add(c, "backward_s", b, "s", ran)
            rows.add(c, "total_s", f + b, "s", ran)
            rows.add(c, "gflops", flops / (f + b) * 1e-9, "GFLOP/s", ran)
            if torch_total:
                rows.add(c, "speedup_vs_pytorch", torch_total / (f + b), "x", ran)
        c = case(impl="ringattn", N=2, selection=selection, rounds=a.rounds, **shape)
        # the slowest rank sets the pace; its exposed wait is what the ring failed to hide
        waits = []
        for rep in n2:
            slow = max(rep["ranks"], key=lambda x: x["time"]["compute_s"])
            waits.append(100 * slow["time"]["wait_s"] / (slow["time"]["forward_s"] + slow["time"]["backward_s"]))
        rows.add(c, "slowest_rank_wait", med(waits), "%", ran)
        rows.add(c, "speedup_vs_n1", med(total(x) / total(y) for x, y in zip(n1, n2)), "x", ran)
        if len(pair) == len(n1):
            ceiling = [2 * total(x) / p for x, p in zip(n1, pair)]
            rows.add(c, "ceiling_vs_n1", med(ceiling), "x", ran)
            rows.add(c, "of_ceiling", 100 * med(p / 2 / total(y) for y, p in zip(n2, pair)), "%", ran)


# ---- vs-sdpa: ringattn at N=1 and N=2 against PyTorch 2.x scaled_dot_product_attention -----------
def script_with_timing(name):
    """tests/bench/NAME's text, to run as `python -` where tests/bench is not on the path (the SDPA
    chroot), behind a few lines that make tests/bench/bench_timing.py's text the module bench_timing."""
    bench = os.path.join(ROOT, "tests", "bench")
    timing = open(os.path.join(bench, "bench_timing.py")).read()
    return ("import sys, types\n"
            "bench_timing = types.ModuleType('bench_timing')\n"
            f"exec(compile({timing!r}, 'bench_timing.py', 'exec'), bench_timing.__dict__)\n"
            "sys.modules['bench_timing'] = bench_timing\n"
            + open(os.path.join(bench, name)).read())


def bench_vs_sdpa(a, rows):
    """S = seqs[0] on one thread (SDPA one thread, ringattn N=1) and S = seqs[1] on two (SDPA two
    threads, ringattn N=2), causal and not; each round runs every case once, SDPA then ringattn, and
    the figures are medians over the rounds of each run's median over --iters."""
    if a.parse_only:  # scripts/bench_sdpa.sh checks its options before it makes or mounts anything
        sys.exit(0)
    ensure_built(("ringattn_app", BIN))
    python = shlex.split(a.python)
    script = script_with_timing("sdpa_attention.py")
    plan = [(1, a.seqs[0])] + ([(2, a.seqs[1])] if len(a.seqs) > 1 else [])
    cases = [(n, s, causal, dt) for n, s in plan for causal in (False, True) for dt in a.dtypes]
    sdpa = {c: [] for c in cases}
    ours = {c: [] for c in cases}
    version = ""
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            for c in cases:
                n, s, causal, dt = c
                log(f"round {r + 1}/{a.rounds}: S={s} {'causal' if causal else 'full'} {dt}: SDPA on {n} thread(s)")
                args = ["--seq", str(s), "--heads", str(a.heads), "--head-dim", str(a.head_dim), "--threads", str(n),
                        "--iters", str(a.iters), "--dtype", dt] + (["--causal"] if causal else [])
                env = mpi_env(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS=str(n))
                p = subprocess.run(python + ["-", *args], input=script, env=env, capture_output=True, text=True)
                if p.returncode != 0:
                    tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-5:])
                    print(f"bench: SDPA under {a.python!r} failed (exit {p.returncode}):\n{tail}", file=sys.stderr)
                    sys.exit(3)
                t = json.loads(p.stdout.strip().splitlines()[-1])
                version = t["torch"]
                sdpa[c].append(t)
                log(f"round {r + 1}/{a.rounds}: S={s} {'causal' if causal else 'full'} {dt}: ringattn N={n}")
                runargs = ["run", "--seq", str(s), "--heads", str(a.heads), "--head-dim", str(a.head_dim), "--dtype",
                           dt, "--iters", str(a.iters), "--warmup", "1"] + (["--causal"] if causal else [])
                ours[c].append(mpirun(n, runargs, f"{d}/run.json"))
    for c in cases:
        n, s, causal, dt = c
        shape = dict(S=s, H=a.heads, D=a.head_dim, dtype=dt, mask="causal" if causal else "none")
        t = sdpa[c]
        tf, tb = med(x["forward_s"] for x in t), med(x["backward_s"] for x in t)
        flops = t[0]["flops_forward"] + t[0]["flops_backward"]
        cs = case(impl="pytorch-sdpa", threads=n, torch=version, rounds=a.rounds, **shape)
        rows.add(cs, "forward_s", tf, "s")
        rows.add(cs, "backward_s", tb, "s")
        rows.add(cs, "total_s", tf + tb, "s")
        rows.add(cs, "gflops", flops / (tf + tb) * 1e-9, "GFLOP/s")
        reps = ours[c]
        simd = reps[0]["config"]["simd"]
        f, b = med(x["time"]["forward_s"] for x in reps), med(x["time"]["backward_s"] for x in reps)
        cr = case(impl="ringattn", N=n, rounds=a.rounds, **shape)
        rows.add(cr, "forward_s", f, "s", simd)
        rows.add(cr, "backward_s", b, "s", simd)
        rows.add(cr, "total_s", f + b, "s", simd)
        rows.add(cr, "gflops", flops / (f + b) * 1e-9, "GFLOP/s", simd)
        rows.add(cr, "speedup_vs_sdpa", (tf + tb) / (f + b), "x", simd)
        # the same ratio per round (SDPA and ringattn ran back to back), its median
        rows.add(cr, "speedup_vs_sdpa_paired", med((x["forward_s"] + x["backward_s"]) / total(y)
                                                   for x, y in zip(t, reps)), "x", simd)


# ---- python: the binding against the command line -----------------------------------------------
def bench_python(a, rows):
    ensure_built(("ringattn_app", BIN), ("ringattn_python", os.path.join(BUILD, "python", "ringattn")))
    base = ["--seq", str(a.seq), "--heads", str(a.heads), "--head-dim", str(a.head_dim), "--iters", str(a.iters),
            "--warmup", "1"]
    cli, py, simd = [], [], ""
    env = mpi_env(PYTHONPATH=os.path.join(BUILD, "python"))
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            log(f"round {r + 1}/{a.rounds}")
            rep = mpirun(2, ["run", *base, "--layout", "contiguous"], f"{d}/cli.json")
            cli.append(total(rep))
            simd = rep["config"]["simd"]
            out = run(["mpirun", "-np", "2", "--bind-to", "core", "/usr/bin/python3",
                       os.path.join(ROOT, "tests", "bench", "python_attention.py"), *base], env=env,
                      what="python_attention.py")
            py.append(json.loads(out)["forward_backward_s"])
    c = case(N=2, S=a.seq, H=a.heads, D=a.head_dim, B=1, dtype="f32", mask="none", layout="contiguous",
             rounds=a.rounds)
    rows.add(c, "cli_total_s", med(cli), "s", simd)
    rows.add(c, "python_total_s", med(py), "s", simd)
    rows.add(c, "python_over_cli", med(p / q for p, q in zip(py, cli)), "x", simd)


# ---- layouts: causal load balance ----------------------------------------------------------------
def bench_layouts(a, rows):
    ensure_built(("ringattn_app", BIN))
    shape = ["--seq", str(a.seq), "--heads", str(a.heads), "--head-dim", str(a.head_dim)]
    with tempfile.TemporaryDirectory() as d:
        for n in a.timed + a.counted:
            timed = n in a.timed
            base_total = None
            for layout in ("contiguous", "striped", "zigzag"):
                log(f"N={n} {layout}")
                iters = ["--iters", str(a.iters), "--warmup", "1"] if timed else ["--iters", "1", "--warmup", "0"]
                rep = mpirun(n, ["run", *shape, "--causal", "--layout", layout, *iters], f"{d}/r.json", bind="none")
                # the same layout unmasked, forward only: its flops are the non-causal forward's
                full = mpirun(n, ["run", *shape, "--layout", layout, "--iters", "1", "--warmup", "0", "--no-backward"],
                              f"{d}/full.json", bind="none")
                im = rep["imbalance"]
                c = case(N=n, layout=layout, S=a.seq, H=a.heads, D=a.head_dim, dtype="f32", mask="causal",
                         timing="timed" if timed else "counted")
                simd = rep["config"]["simd"]
                rows.add(c, "imbalance", im["flops_max_over_mean"], "x", simd)
                # backward flops are 2.5x the forward's: the causal job's forward is 1/3.5 of its total
                rows.add(c, "causal_over_full_flops", im["total_flops"] / 3.5 / full["imbalance"]["total_flops"], "x",
                         simd)
                if layout == "contiguous":
                    rows.add(c, "model_block", im["model_contiguous_causal"], "x", simd)
                    rows.add(c, "model_pairs", im["model_contiguous_causal_pairs"], "x", simd)
                if timed:
                    t = total(rep)
                    base_total = base_total or t
                    rows.add(c, "total_s", t, "s", simd)
                    rows.add(c, "speedup_vs_contiguous", base_total / t, "x", simd)


# ---- memory: per-rank resident bytes against S ---------------------------------------------------
def bench_memory(a, rows):
    ensure_built(("ringattn_app", BIN))
    peaks = {}
    with tempfile.TemporaryDirectory() as d:
        for s in a.seqs:
            log(f"S={s}")
            rep = mpirun(a.ranks, ["run", "--seq", str(s), "--heads", "1", "--head-dim", "64", "--dtype", "f32",
                                   "--causal", "--layout", a.layout, "--iters", "1", "--warmup", "0"],
                         f"{d}/m.json", bind="none")
            c = case(N=a.ranks, S=s, H=1, D=64, dtype="f32", mask="causal", layout=a.layout)
            simd = rep["config"]["simd"]
            peaks[s] = max(r["memory"]["peak_rss_bytes"] for r in rep["ranks"])
            rows.add(c, "peak_rss_mib", peaks[s] / 2**20, "MiB", simd)
            rows.add(c, "budget_mib", max(r["memory"]["budget_bytes"] for r in rep["ranks"]) / 2**20, "MiB", simd)
    if len(a.seqs) >= 2:
        lo, hi = a.seqs[0], a.seqs[-1]
        c = case(N=a.ranks, S=f"{lo}-{hi}", H=1, D=64, dtype="f32", mask="causal", layout=a.layout)
        rows.add(c, "rss_growth", peaks[hi] / peaks[lo], "x", simd)
        rows.add(c, "positions_growth", hi / lo, "x", simd)


# ---- dtype: bf16 against f32 storage --------------------------------------------------------------
def bench_dtype(a, rows):
    ensure_built(("ringattn_app", BIN))
    got = {}  # (transport, dtype) -> [report, ...]
    ratio = {}  # transport -> [bf16 / f32 of one round, ...]: each ratio inside its round
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            for dt in ("bf16", "f32"):  # alternating, so drift of the machine hits both alike
                log(f"round {r + 1}/{a.rounds}: shared memory, {dt}")
                rep = mpirun(2, ["run", *a.shm_shape, "--dtype", dt, "--iters", "3"], f"{d}/r.json")
                got.setdefault(("shm", dt), []).append(rep)
                if dt == "f32":
                    ratio.setdefault("shm", []).append(total(got[("shm", "bf16")][-1]) / total(rep))
                log(f"round {r + 1}/{a.rounds}: TCP between two network namespaces, {dt}")
                env = mpi_env(RINGATTN_NETNS_SHAPE=" ".join(a.tcp_shape), RINGATTN_NETNS_NO_CHECK="1",
                              RINGATTN_NETNS_REPORT=f"{d}/t.json")
                p = subprocess.run(["bash", os.path.join(SCRIPTS, "netns_test.sh"), BIN, "--dtype", dt, "--iters", "5"],
                                   env=env, capture_output=True, text=True)
                if p.returncode == 0 and os.path.exists(f"{d}/t.json"):
                    got.setdefault(("tcp", dt), []).append(json.load(open(f"{d}/t.json")))
                    os.remove(f"{d}/t.json")
                    tcp = got[("tcp", dt)]
                    if dt == "f32" and len(got.get(("tcp", "bf16"), [])) == len(tcp):  # this round's bf16 ran
                        ratio.setdefault("tcp", []).append(total(got[("tcp", "bf16")][-1]) / total(tcp[-1]))
                else:
                    log(f"  TCP run skipped or failed: {(p.stdout + p.stderr).strip().splitlines()[-1:]}")
    shapes = {"shm": a.shm_shape, "tcp": a.tcp_shape}
    for transport in ("shm", "tcp"):
        f32 = got.get((transport, "f32"))
        for dt in ("bf16", "f32"):
            reps = got.get((transport, dt))
            if not reps:
                continue
            c = case(N=2, transport=transport, dtype=dt, rounds=len(reps)) + " " + " ".join(shapes[transport])
            simd = reps[0]["config"]["simd"]
            t = med(total(x) for x in reps)
            rows.add(c, "forward_s", med(x["time"]["forward_s"] for x in reps), "s", simd)
            rows.add(c, "backward_s", med(x["time"]["backward_s"] for x in reps), "s", simd)
            rows.add(c, "total_s", t, "s", simd)
            rows.add(c, "recv_bytes_rank0", reps[0]["ranks"][0]["ledger"]["recv_bytes"] / 2**20, "MiB", simd)
            wait = [max(100 * y["time"]["wait_s"] / max(y["time"]["forward_s"] + y["time"]["backward_s"], 1e-12)
                        for y in x["ranks"]) for x in reps]
            rows.add(c, "max_wait", med(wait), "%", simd)
            if dt == "bf16" and f32 and ratio.get(transport):
                rows.add(c, "time_over_f32", med(ratio[transport]), "x", simd)


# ---- main -------------------------------------------------------------------------------------------
def parser():
    ap = Parser(prog="bench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", metavar="SUBCOMMAND", parser_class=Parser)
    sub.required = True

    def add(name, func, summary):
        p = sub.add_parser(name, help=summary, description=summary)
        p.set_defaults(func=func)
        p.add_argument("--out", help=f"the CSV to write (default: $RINGATTN_BUILD/bench/{name}.csv)")
        return p

    p = add("kernel", bench_kernel, "the block kernels against the FMA peak of one core, and the causal mask at N=2")
    p.add_argument("--reps", type=positive, default=5, help="kernel_bench repetitions per shape (median)")
    p.add_argument("--rounds", type=positive, default=3, help="rounds of the causal against non-causal N=2 runs")
    p.add_argument("--targets", type=words, default=["default", "AVX2"],
                   help="'default' and/or Highway target names forced with RINGATTN_SIMD")
    p.add_argument("--seqs", type=positive_list, default=[4096, 8192], help="S (f64 at the first only)")
    p.add_argument("--head-dims", type=positive_list, default=[64, 128])
    p.add_argument("--dtypes", type=words, default=["f32", "f64"])
    p.add_argument("--causal-seq", type=positive, default=8192, help="S of the causal against non-causal runs")
    p.add_argument("--no-pieces", dest="pieces", action="store_false", help="skip the pass-by-pass table")
    p.add_argument("--no-causal", dest="causal", action="store_false", help="skip the causal runs at N=2")

    p = add("vs-torch", bench_vs_torch, "ringattn at N=1 and N=2 against PyTorch eager on the same shape")
    p.add_argument("--seq", type=positive, default=8192)
    p.add_argument("--heads", type=positive, default=8)
    p.add_argument("--head-dim", type=positive, default=64)
    p.add_argument("--iters", type=positive, default=3)
    p.add_argument("--rounds", type=positive, default=5)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--no-torch", dest="torch", action="store_false")
    p.add_argument("--targets", type=words, default=["default"])

    p = add("vs-sdpa", bench_vs_sdpa, "ringattn at N=1 and N=2 against PyTorch 2.x scaled_dot_product_attention "
            "(forward + backward, one and two threads)")
    p.add_argument("--python", default="/usr/bin/python3",
                   help="the command that runs a Python with torch >= 2.1 (it reads the timing script on stdin); "
                        "scripts/bench_sdpa.sh passes its Debian 13 chroot")
    p.add_argument("--seqs", type=positive_list, default=[4096, 8192],
                   help="S on one thread (N=1), then S on two threads (N=2)")
    p.add_argument("--heads", type=positive, default=8)
    p.add_argument("--head-dim", type=positive, default=64)
    p.add_argument("--iters", type=positive, default=3)
    p.add_argument("--rounds", type=positive, default=3)
    p.add_argument("--dtypes", type=words, default=["f32"], help="f32 and/or bf16")
    p.add_argument("--parse-only", action="store_true", help=argparse.SUPPRESS)

    p = add("python", bench_python, "ringattn.attention + backward from Python against `ringattn run`, N=2")
    p.add_argument("--seq", type=positive, default=8192)
    p.add_argument("--heads", type=positive, default=8)
    p.add_argument("--head-dim", type=positive, default=64)
    p.add_argument("--iters", type=positive, default=3)
    p.add_argument("--rounds", type=positive, default=3)

    p = add("layouts", bench_layouts, "causal load balance per layout: timed at --timed N, counted at --counted N")
    p.add_argument("--seq", type=positive, default=8192)
    p.add_argument("--heads", type=positive, default=4)
    p.add_argument("--head-dim", type=positive, default=64)
    p.add_argument("--iters", type=positive, default=3)
    p.add_argument("--timed", type=positive_list, default=[2])
    p.add_argument("--counted", type=positive_list, default=[4, 8])

    p = add("memory", bench_memory, "each rank's peak RSS and planned bytes against S (causal, H=1, D=64, f32)")
    p.add_argument("--seqs", type=positive_list, default=[16384, 65536])
    p.add_argument("--ranks", type=positive, default=2)
    p.add_argument("--layout", choices=["contiguous", "striped", "zigzag"], default="contiguous")

    p = add("dtype", bench_dtype, "bf16 against f32 storage at N=2, shared memory and TCP between two namespaces")
    p.add_argument("--rounds", type=positive, default=5)
    p.add_argument("--shm-shape", type=shape_opts,
                   default=shape_opts("--seq 8192 --heads 4 --kv-heads 2 --head-dim 64 --causal --layout zigzag"))
    p.add_argument("--tcp-shape", type=shape_opts, default=shape_opts("--seq 1024 --heads 2 --kv-heads 2 --head-dim 64"))
    return ap


def main(argv):
    a = parser().parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    # a wrapper (scripts/bench_sdpa.sh) names itself as the command that reproduces the rows
    command = os.environ.get("RINGATTN_BENCH_COMMAND") or " ".join(["scripts/bench.py"] + [shlex.quote(x) for x in argv])
    rows = Rows(a.what)
    a.func(a, rows)
    common = dict(commit=commit(), cpu=cpu_model(), date=started, command=command)
    out = a.out or os.path.join(BUILD, "bench", f"{a.what}.csv")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in rows.rows:
            w.writerow({**common, **r, "value": fmt_value(r["value"])})
    width = max((len(r["case"]) for r in rows.rows), default=4)
    for r in rows.rows:
        print(f"{r['case']:<{width}}  {r['metric']:<24} {fmt_value(r['value']):>12} {r['unit']:<8} {r['simd']}")
    log(f"{len(rows.rows)} rows -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
