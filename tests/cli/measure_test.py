#!/usr/bin/python3
"""End-to-end checks of `ringattn plan`, `ringattn probe`, scripts/sweep.sh and scripts/plot.py
(the measurement requirements), one named test per invocation:

    measure_test.py NAME --binary PATH [--mpirun EXE] [--root SOURCE_DIR]

Exits 0 when every assertion holds, 1 otherwise, 77 (ctest SKIP) when matplotlib is missing.
Needs only the Python standard library (and matplotlib for the plot test).
"""
import csv
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, env, main, run  # noqa: E402

ARGS = None  # set by harness.main


def close(got, want, rel, what):
    ok = got is not None and abs(got - want) <= rel * abs(want)
    check(ok, f"{what}: {got} vs {want} (within {rel:.0%})")


def plan(*args):
    p = run([ARGS.binary, "plan", *args, "--json"])
    check(p.returncode == 0, f"plan {' '.join(map(str, args))}: exit 0 ({p.stderr.strip()})")
    return json.loads(p.stdout) if p.returncode == 0 else {}


PLAN_KEYS = ["recv_bytes", "send_bytes", "step_intensity", "layer_intensity", "beta", "compute_s", "comm_s",
             "comm_ratio", "step_compute_s", "step_comm_s", "max_ranks", "causal_utilization",
             "causal_utilization_tri", "ulysses_recv_bytes", "tp_bytes", "verdict"]


# The cost model's worked example: S=262144, N=8, H=32, HKV=8, D=128, p=2, 312e12, 300e9.
def test_plan_reference_figures():
    seed = ["--seq", 262144, "--ranks", 8, "--heads", 32, "--kv-heads", 8, "--head-dim", 128, "--batch", 1,
            "--bytes", 2, "--flops", 312e12, "--bandwidth", 300e9]
    j = plan(*seed)
    check(list(j)[:len(PLAN_KEYS)] == PLAN_KEYS, f"the documented keys, in order: {list(j)}")
    check(set(j) == set(PLAN_KEYS) | {"inputs", "strategies", "recommended", "recommended_ulysses_degree"},
          "nothing but the documented keys, the echoed inputs and the strategies")
    want = {"recv_bytes": 0.94e9, "send_bytes": 0.94e9, "step_intensity": 131072, "layer_intensity": 149797,
            "beta": 1040, "compute_s": 0.451, "comm_s": 3.13e-3, "comm_ratio": 0.0069, "step_compute_s": 56.4e-3,
            "step_comm_s": 0.447e-3, "causal_utilization": 0.563, "causal_utilization_tri": 0.533,
            "ulysses_recv_bytes": 0.587e9, "tp_bytes": 8.59e9}
    for k, v in want.items():
        close(j.get(k), v, 0.01, k)
    check(j.get("verdict") == "overlap has room", f"verdict {j.get('verdict')}")
    # the strategies side by side: ring, ulysses (the same 0.587 GB, as elements at p = 2), usp U=2, U=4,
    # allgather (the ring's bytes, gathered)
    st = j.get("strategies", [])
    check([(x.get("strategy"), x.get("ulysses_degree")) for x in st] ==
          [("ring", 1), ("ulysses", 8), ("usp", 2), ("usp", 4), ("allgather", 1)], f"strategies {st}")
    if len(st) == 5:
        check(st[4].get("ag_recv_bytes") == st[0].get("recv_bytes"),
              f"allgather receives the ring's bytes: {st[4].get('ag_recv_bytes')}")
    if len(st) == 4:
        close(st[1].get("a2a_recv_elems", 0) * 2, 0.587e9, 0.01, "ulysses a2a elements x p")
        close(st[0].get("recv_bytes"), 0.94e9, 0.01, "ring bytes in the strategies")
    check(j.get("recommended") == "ring" and j.get("recommended_ulysses_degree") == 1,
          f"recommended {j.get('recommended')}")
    inp = j.get("inputs", {})
    check(inp.get("seq") == 262144 and inp.get("ranks") == 8 and inp.get("kv_heads") == 8 and
          inp.get("causal") is False, f"inputs echoed: {inp}")
    # the defaults are the cost model's example
    check(plan() == j, "plan with no options = the reference example")
    # across nodes on 400 Gb/s IB, 50 GB/s per GPU: 18.8 ms, 4.2%
    ib = plan("--bandwidth", 50e9)
    close(ib.get("comm_s"), 18.8e-3, 0.01, "IB comm_s")
    close(ib.get("comm_ratio"), 0.042, 0.01, "IB comm_ratio")
    # beta = 19,780 with GQA 4: 128K -> 26, 32K -> 6, 8K -> 1
    for S, n in ((131072, 26), (32768, 6), (8192, 1)):
        m = plan("--seq", S, "--flops", 19780e9, "--bandwidth", 1e9)
        check(m.get("max_ranks") == n, f"max_ranks at S={S}: {m.get('max_ranks')} (seed {n})")
    # causal halves compute and intensity, not bytes
    c = plan("--causal")
    close(c.get("compute_s"), j["compute_s"] / 2, 1e-9, "causal compute_s")
    close(c.get("step_intensity"), j["step_intensity"] / 2, 1e-9, "causal step_intensity")
    close(c.get("recv_bytes"), j["recv_bytes"], 1e-12, "causal recv_bytes")
    # one rank: nothing received, layer intensity infinite (null in JSON)
    one = plan("--ranks", 1)
    check(one.get("recv_bytes") == 0 and one.get("layer_intensity") is None and
          one.get("verdict") == "no communication", f"N=1: {one.get('recv_bytes')} {one.get('verdict')}")
    t = run([ARGS.binary, "plan"])
    check(t.returncode == 0 and "131072" in t.stdout and "overlap has room" in t.stdout, "the table prints")


def test_plan_bad_input_exits_2():
    cases = {"--kv-heads": ["--kv-heads", 5], "--ranks": ["--ranks", 0], "--bandwidth": ["--bandwidth", 0],
             "--flops": ["--flops", -1], "--bytes": ["--bytes", 0], "--seq": ["--seq", 0]}
    for opt, args in cases.items():
        p = run([ARGS.binary, "plan", *args])
        lines = p.stderr.strip().splitlines()
        check(p.returncode == 2, f"{opt}: exit 2 (got {p.returncode})")
        check(len(lines) == 1 and lines[0].startswith(f"ringattn: error: {opt}:"), f"{opt}: one line: {lines}")
    p = run([ARGS.binary, "plan", "--seq", "many"])
    check(p.returncode == 2, f"non-numeric --seq: exit 2 (got {p.returncode})")
    # --heads alone: HKV = H, as run's default (the default HKV = 8 goes with the default H = 32)
    for heads, kv in ((4, 4), (3, 3), (32, 8)):
        j = plan("--heads", heads) if heads != 32 else plan()
        check(j.get("inputs", {}).get("kv_heads") == kv, f"plan --heads {heads}: HKV {j.get('inputs', {})}")


PROBE_KEYS = ["bandwidth", "compute_flops", "beta", "step_intensity", "predicted_comm_ratio", "measured_comm_ratio",
              "verdict"]
VERDICTS = {"overlap has room", "depends on the implementation", "communication is not negligible"}


# The check: mpirun -np 2 ringattn probe --seq 4096 --heads 4 --head-dim 64 --json
def test_probe_json():
    p = run([ARGS.mpirun, "-np", 2, ARGS.binary, "probe", "--seq", 4096, "--heads", 4, "--head-dim", 64, "--json"],
            timeout=60)
    check(p.returncode == 0, f"exit 0 ({p.stderr.strip()[-300:]})")
    try:
        j = json.loads(p.stdout)
    except json.JSONDecodeError as e:
        check(False, f"stdout is one JSON object ({e}): {p.stdout[:200]}")
        return
    for k in PROBE_KEYS:
        check(k in j and j[k] is not None, f"key {k}")
    bw = j.get("bandwidth", [])
    check(len(bw) >= 5, f"at least 5 message sizes ({len(bw)})")
    check([b["bytes"] for b in bw] == [4096 << i for i in range(15)], "sizes double from 4 KiB to 64 MiB")
    for b in bw:
        ok = all(k in b for k in ("bytes", "time_s", "gbps")) and b["time_s"] > 0 and b["gbps"] > 0
        check(ok and abs(b["gbps"] - b["bytes"] / b["time_s"] * 1e-9) <= 1e-9 * b["gbps"],
              f"{b['bytes']} B: time_s {b['time_s']:.3g}, gbps = bytes / time_s = {b['gbps']:.3g}")
        check(b.get("wrong") == 0, f"{b['bytes']} B: no wrong bytes")
    check(j["compute_flops"] > 1e8, f"compute_flops {j['compute_flops']:.3g} > 0.1 GFLOP/s")
    # L = 2048, H/HKV = 1, p = 4 (f32): I_step = (H/HKV) (S/N) (2/p) = 1024
    check(j["step_intensity"] == 1024, f"step_intensity {j['step_intensity']} == 1024")
    close(j["beta"], j["compute_flops"] / (j["block_gbps"] * 1e9), 1e-9, "beta = compute / bandwidth at a block")
    close(j["predicted_comm_ratio"], j["beta"] / j["step_intensity"], 1e-9, "predicted = beta / I_step")
    check(j["block_bytes"] == 2 * 2048 * 4 * 64 * 4, f"one K/V block is 2 B L HKV D p bytes ({j['block_bytes']})")
    check(j["measured_comm_ratio"] > 0 and math.isfinite(j["measured_comm_ratio"]), "measured ratio > 0")
    check(j["verdict"] in VERDICTS and j["predicted_verdict"] in VERDICTS, f"verdicts {j['verdict']}")
    check(j["exposed_wait_ratio"] >= 0, "exposed wait ratio >= 0")


def test_probe_one_rank():
    p = run([ARGS.mpirun, "-np", 1, ARGS.binary, "probe", "--seq", 512, "--heads", 2, "--head-dim", 16, "--json"])
    check(p.returncode == 0, f"exit 0 ({p.stderr.strip()[-300:]})")
    j = json.loads(p.stdout) if p.returncode == 0 else {}
    check(j.get("bandwidth") == [], "N=1: no neighbour, empty bandwidth table")
    check(j.get("beta") is None and j.get("measured_comm_ratio") == 0, "N=1: no beta, nothing measured")
    check(j.get("verdict") == "no communication", f"N=1 verdict {j.get('verdict')}")
    check(j.get("compute_flops", 0) > 0, "N=1: the compute rate is still measured")
    p = run([ARGS.mpirun, "-np", 2, ARGS.binary, "probe", "--max-bytes", 100, "--min-bytes", 4096])
    lines = [l for l in p.stderr.splitlines() if l.startswith("ringattn")]
    check(p.returncode == 2 and len(lines) == 1 and lines[0].startswith("ringattn: error: --max-bytes:"),
          f"--max-bytes below --min-bytes: exit 2, one line ({p.returncode}: {lines})")


# The check: probe --strategies ring,ulysses --json at N=2 reports both, and "recommended"
# is the one with the smaller measured forward + backward; usp has no U between 1 and N=2 and is
# listed with the reason, not run; H=3 forbids ulysses.
def test_probe_strategies():
    cmd = [ARGS.mpirun, "-np", 2, ARGS.binary, "probe", "--seq", 512, "--heads", 4, "--head-dim", 32,
           "--max-bytes", 1 << 20, "--budget", 0.2, "--json"]
    p = run(cmd + ["--strategies", "ring,ulysses,usp"], timeout=60)
    check(p.returncode == 0, f"exit 0 ({p.stderr.strip()[-300:]})")
    j = json.loads(p.stdout) if p.returncode == 0 else {}
    st = j.get("strategies", [])
    check([x.get("strategy") for x in st] == ["ring", "ulysses", "usp"], f"strategies in order: {st}")
    ran = [x for x in st if x.get("run")]
    check(len(ran) == 2, "ring and ulysses run")
    for x in ran:
        ok = all(x.get(k) is not None for k in ("ulysses_degree", "forward_s", "backward_s", "recv_bytes",
                                                 "exposed_wait_s"))
        check(ok and x["forward_s"] > 0 and x["backward_s"] > 0 and x["recv_bytes"] > 0, f"measured: {x}")
    if len(ran) == 2:
        best = min(ran, key=lambda x: x["forward_s"] + x["backward_s"])
        check(j.get("recommended") == best["strategy"], f"recommended {j.get('recommended')} = {best['strategy']}")
        check(ran[0]["ulysses_degree"] == 1 and ran[1]["ulysses_degree"] == 2, "U: ring 1, ulysses N")
        # ulysses at N=2, HKV = H: (N-1)/N B (S/N) (2H + 2HKV) D per pass plus the forward's LSE, in f32
        moved = 1 * 256 * (8 + 8) * 32 // 2
        check(ran[1]["recv_bytes"] == 4 * (2 * moved + 256 * 4 // 2), f"ulysses recv_bytes {ran[1]['recv_bytes']}")
    check(st and not st[-1].get("run") and "divides" in st[-1].get("reason", ""), f"usp not run: {st[-1:]}")
    check(j.get("plan_recommended") in ("ring", "ulysses"), f"plan_recommended {j.get('plan_recommended')}")
    p = run([ARGS.mpirun, "-np", 2, ARGS.binary, "probe", "--seq", 64, "--heads", 3, "--head-dim", 8,
             "--max-bytes", 65536, "--budget", 0.1, "--json", "--strategies", "ulysses,ring"], timeout=60)
    j = json.loads(p.stdout) if p.returncode == 0 else {}
    st = j.get("strategies", [])
    check(len(st) == 2 and not st[0].get("run") and "H % N == 0" in st[0].get("reason", "") and st[1].get("run"),
          f"H=3: ulysses listed with the rule, ring run: {st}")
    check(j.get("recommended") == "ring", f"recommended ring ({j.get('recommended')})")
    # 16-bit storage: blocks of p = 2 bytes (I_step doubles), the ring sends K/V in the storage type
    # and dK/dV in f32: forward + replay 2 x 2 B, gradients 4 B per element of one block (N=2).
    for dtype in ("bf16", "f16"):
        p = run(cmd[:-3] + ["--budget", 0.1, "--json", "--dtype", dtype, "--strategies", "ring"], timeout=60)
        j = json.loads(p.stdout) if p.returncode == 0 else {}
        elems = 2 * 256 * 4 * 32  # 2 B L HKV D, L = S/N = 256
        st = j.get("strategies", [{}])
        check(p.returncode == 0 and j.get("config", {}).get("dtype") == dtype, f"{dtype}: exit 0, config.dtype")
        check(j.get("block_bytes") == elems * 2 and j.get("step_intensity") == 256,
              f"{dtype}: block_bytes {j.get('block_bytes')} = {elems * 2}, I_step {j.get('step_intensity')} = 256")
        check(st[0].get("recv_bytes") == elems * (2 + 2 + 4), f"{dtype}: ring recv_bytes {st[0].get('recv_bytes')}")
    p = run([ARGS.mpirun, "-np", 2, ARGS.binary, "probe", "--dtype", "f8"])
    lines = [l for l in p.stderr.splitlines() if l.startswith("ringattn")]
    check(p.returncode == 2 and len(lines) == 1 and "bf16, f16, f32 or f64" in lines[0],
          f"unknown dtype: exit 2, one line ({p.returncode}: {lines})")
    p = run([ARGS.mpirun, "-np", 2, ARGS.binary, "probe", "--strategies", "ring,tree"])
    lines = [l for l in p.stderr.splitlines() if l.startswith("ringattn")]
    check(p.returncode == 2 and len(lines) == 1 and "ring, ulysses, usp or allgather" in lines[0]
          and "--strategies: unknown strategy 'tree'" in lines[0],
          f"unknown strategy: exit 2, one line naming --strategies ({p.returncode}: {lines})")
    # A U the user gives is checked as run checks it, before anything is measured.
    p = run([ARGS.mpirun, "-np", 2, ARGS.binary, "probe", "--strategies", "ring,usp", "--ulysses-degree", 3])
    lines = [l for l in p.stderr.splitlines() if l.startswith("ringattn")]
    check(p.returncode == 2 and len(lines) == 1 and lines[0].startswith("ringattn: error: --ulysses-degree:")
          and "does not divide N=2" in lines[0] and "step 1" not in p.stdout,
          f"--ulysses-degree 3 at N=2: exit 2, one line, nothing measured ({p.returncode}: {lines})")


# scripts/sweep.sh then scripts/plot.py, on a small grid: a CSV row per run and three PNGs.
def test_sweep_plot():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("SKIP: python3-matplotlib is not installed (scripts/setup.sh installs it)")
        sys.exit(77)
    with tempfile.TemporaryDirectory() as d:
        out = f"{d}/s.csv"
        sweep_env = dict(env(), RINGATTN_BUILD=os.path.dirname(ARGS.binary))
        p = subprocess.run(["bash", f"{ARGS.root}/scripts/sweep.sh", "--ranks", "1 2", "--seqs", "256 512",
                            "--layouts", "contiguous zigzag", "--masks", "none causal", "--heads", "4",
                            "--kv-heads", "2", "--head-dim", "16", "--no-probe", "--out", out],
                           env=sweep_env, capture_output=True, text=True, timeout=300)
        check(p.returncode == 0, f"sweep.sh exit 0 ({p.stderr.strip()[-400:]})")
        rows = list(csv.DictReader(open(out))) if os.path.exists(out) else []
        # N=1: one layout; N=2: two; x 2 sizes x 2 masks
        check(len(rows) == (1 + 2) * 2 * 2, f"one row per run ({len(rows)})")
        for col in ("N", "S", "H", "HKV", "D", "dtype", "causal", "layout", "forward_s", "backward_s", "wait_s",
                    "bytes", "gflops", "max_error"):
            check(rows and col in rows[0], f"column {col}")
        for r in rows:
            what = f"N={r['N']} S={r['S']} causal={r['causal']} {r['layout']}"
            check(r["status"] == "ok" and float(r["forward_s"]) > 0 and float(r["backward_s"]) > 0, f"{what}: ran")
            check(float(r["max_error"]) <= 3e-4, f"{what}: checked, max error {r['max_error']} <= 3e-4")
            check((int(r["bytes"]) > 0) == (r["N"] != "1"), f"{what}: bytes move iff N > 1")
            # I_step = (H/HKV)(S/N)(2/p), halved when causal
            want = 2 * int(r["S"]) / int(r["N"]) * 2 / 4 * (0.5 if r["causal"] == "1" else 1)
            close(float(r["step_intensity"]), want, 1e-12, f"{what}: step_intensity")
        contig = [r for r in rows if r["N"] == "2" and r["causal"] == "1" and r["layout"] == "contiguous"]
        for r in contig:  # block models at N = 2: 2N/(N+1) = 4/3 (diagonal whole) .. (2N-1)/N = 3/2 (triangle)
            x = float(r["imbalance"])  # the CSV keeps 6 significant digits
            check(4 / 3 - 1e-5 <= x <= 3 / 2 + 1e-5, f"S={r['S']}: contiguous causal imbalance {x:.4f} in [4/3, 3/2]")
        p = run(["/usr/bin/python3", f"{ARGS.root}/scripts/plot.py", out, "--beta", 20])
        check(p.returncode == 0, f"plot.py exit 0 ({p.stderr.strip()[-400:]})")
        for k in ("time", "wait", "imbalance", "strategies"):
            f = f"{d}/s_{k}.png"
            ok = os.path.exists(f) and open(f, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(f) > 10000
            check(ok, f"{k} chart is a PNG")
        # the strategy axis: usp:3 does not divide N=2 and is skipped, said so; every other point checked.
        # allgather follows usp:2, so a U carried over from the strategy before it would show.
        out = f"{d}/st.csv"
        p = subprocess.run(["bash", f"{ARGS.root}/scripts/sweep.sh", "--ranks", "2", "--seqs", "128 256",
                            "--layouts", "zigzag", "--masks", "causal", "--heads", "4", "--head-dim", "16",
                            "--strategies", "ring ulysses usp:2 allgather usp:3", "--no-probe", "--out", out],
                           env=sweep_env, capture_output=True, text=True, timeout=300)
        check(p.returncode == 0 and "N=2:usp:3" in p.stderr, f"strategy sweep exit 0 ({p.stderr.strip()[-400:]})")
        rows = list(csv.DictReader(open(out))) if os.path.exists(out) else []
        got = [(r["strategy"], r["ulysses_degree"], r["S"]) for r in rows]
        want = [(st, u, s) for st, u in (("ring", "1"), ("ulysses", "2"), ("usp", "2"), ("allgather", "1"))
                for s in ("128", "256")]
        check(got == want, f"one row per strategy and S: {got}")
        for r in rows:
            what = f"{r['strategy']} U={r['ulysses_degree']} S={r['S']}"
            check(r["status"] == "ok" and float(r["max_error"]) <= 3e-4, f"{what}: ran and checked")
            check((float(r["a2a_wait_s"]) > 0) == (r["strategy"] in ("ulysses", "usp")),
                  f"{what}: all-to-all wait iff ulysses or usp")
        p = run(["/usr/bin/python3", f"{ARGS.root}/scripts/plot.py", out])
        check(p.returncode == 0 and os.path.getsize(f"{d}/st_strategies.png") > 10000,
              f"plot.py draws the strategies ({p.stderr.strip()[-300:]})")


def test_simulated_plot():
    """plot.py on the committed simulation sweep (docs/results): the README's table, S x N, each cell
    from its point's rows, and the chart; a CSV without a successful row is refused in one line."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("SKIP: python3-matplotlib is not installed (scripts/setup.sh installs it)")
        sys.exit(77)
    data = f"{ARGS.root}/docs/results/simulate-infiniband.csv"
    rows = list(csv.DictReader(open(data)))
    with tempfile.TemporaryDirectory() as d:
        p = run(["/usr/bin/python3", f"{ARGS.root}/scripts/plot.py", data, "--table"])
        check(p.returncode == 0, f"plot.py --table exit 0 ({p.stderr.strip()[-300:]})")
        lines = p.stdout.strip().splitlines()
        ns = sorted({int(r["N"]) for r in rows})
        ss = sorted({int(r["S"]) for r in rows})
        check(lines and lines[0] == "| S \\ N | " + " | ".join(map(str, ns)) + " |", f"header: {lines[:1]}")
        check(len(lines) == 2 + len(ss), f"one line per S ({len(lines)})")
        for S, line in zip(ss, lines[2:]):
            cells = [c.strip() for c in line.strip("|").split("|")][1:]
            for N, c in zip(ns, cells):
                point = [r for r in rows if int(r["N"]) == N and int(r["S"]) == S and r["status"] == "ok"]
                ring = [r for r in point if r["strategy"] == "ring"]
                if not ring:
                    check(c == "–", f"S={S} N={N}: no ring row, no cell ({c})")
                    continue
                best = min(point, key=lambda r: float(r["forward_s"]) + float(r["backward_s"]))
                name = best["strategy"] + (":" + best["ulysses_degree"] if best["strategy"] == "usp" else "")
                want = f"{float(ring[0]['exposed_wait']) * 100:.1f}% · {float(ring[0]['plan_comm_ratio']) * 100:.0f}%"
                check(c.startswith(want) and c.split(" · ")[2].split(" ")[0] == name,
                      f"S={S} N={N}: '{c}' starts with '{want}' and recommends {name}")
                check(name == best["recommended"], f"S={S} N={N}: the CSV's recommended column says {name}")
        p = run(["/usr/bin/python3", f"{ARGS.root}/scripts/plot.py", data, "--outdir", d])
        f = f"{d}/simulate-infiniband_simulated.png"
        check(p.returncode == 0 and os.path.exists(f) and open(f, "rb").read(8) == b"\x89PNG\r\n\x1a\n",
              f"the simulated chart is a PNG ({p.stderr.strip()[-300:]})")
        bad = f"{d}/failed.csv"
        with open(bad, "w") as fh:
            fh.write(open(data).readline() + ",".join(["x"] * len(rows[0])) + "\n")
        p = run(["/usr/bin/python3", f"{ARGS.root}/scripts/plot.py", bad, "--table"])
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        check(p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr,
              f"no successful row: one line, exit 2 ({p.returncode}: {lines[:2]})")


def test_sweep_bad_input():
    """sweep.sh refuses bad options before its first run, with one line and exit 2, and leaves no
    half-written CSV; plot.py on a missing file says so in one line."""
    with tempfile.TemporaryDirectory() as d:
        out = f"{d}/s.csv"
        sweep_env = dict(env(), RINGATTN_BUILD=os.path.dirname(ARGS.binary))
        for args, word in ((["--seqs", "0"], "--seqs"), (["--ranks", "1 x"], "--ranks"),
                           (["--layouts", "diagonal"], "--layouts"), (["--dtype", "f128"], "--dtype"),
                           (["--heads", "4", "--kv-heads", "3"], "--kv-heads"),
                           (["--strategies", "ring tree"], "--strategies"), (["--strategies", "usp"], "--strategies")):
            p = subprocess.run(["bash", f"{ARGS.root}/scripts/sweep.sh", *args, "--no-probe", "--out", out],
                               env=sweep_env, capture_output=True, text=True, timeout=60)
            lines = [l for l in p.stderr.splitlines() if l.strip()]
            check(p.returncode == 2 and len(lines) == 1 and word in lines[0] and "sweep: [" not in p.stderr,
                  f"sweep.sh {' '.join(args)}: exit 2 before any run, one line naming {word} ({p.returncode}: {lines[:2]})")
            check(os.listdir(d) == [], f"sweep.sh {' '.join(args)}: nothing left behind ({os.listdir(d)})")
        p = run(["/usr/bin/python3", f"{ARGS.root}/scripts/plot.py", f"{d}/missing.csv"])
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        check(p.returncode == 2 and len(lines) == 1 and "missing.csv" in lines[0] and "Traceback" not in p.stderr,
              f"plot.py on a missing file: one line, exit 2 ({p.returncode}: {lines[:2]})")


def test_bench_bad_input():
    """The benchmark driver refuses a missing value, a value that is not a positive integer and an
    unknown option with one line naming the option and exit 2, before it builds or runs anything."""
    bench_env = dict(env(), RINGATTN_BUILD=os.path.dirname(ARGS.binary))
    cases = [("kernel", ["--reps", "0"], "--reps"), ("kernel", ["--rounds"], "--rounds"),
             ("vs-torch", ["--seq", "8k"], "--seq"), ("vs-torch", ["--iters"], "--iters"),
             ("python", ["--heads", "-1"], "--heads"), ("python", ["--rounds", ""], "--rounds"),
             ("layouts", ["--counted", "4 x"], "--counted"), ("layouts", ["--head-dim"], "--head-dim"),
             ("memory", ["--seqs", "16384 0"], "--seqs"), ("memory", ["--ranks", "two"], "--ranks"),
             ("memory", ["--tiles", "2"], "--tiles"), ("dtype", ["--rounds", "1.5"], "--rounds"),
             ("dtype", ["--tcp-shape"], "--tcp-shape"), ("cache", [], "cache")]
    for sub, args, word in cases:
        p = subprocess.run(["/usr/bin/python3", f"{ARGS.root}/scripts/bench.py", sub, *args], env=bench_env,
                           capture_output=True, text=True, timeout=60)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        check(p.returncode == 2 and len(lines) == 1 and word in lines[0] and p.stdout == "",
              f"bench.py {sub} {' '.join(args)}: exit 2, one line naming {word}, nothing run ({p.returncode}: {lines[:2]})")


if __name__ == "__main__":
    sys.exit(main(globals(), lambda ap: ap.add_argument(
        "--root", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
