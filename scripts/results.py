#!/usr/bin/python3
"""Render the results tables of README.md and docs/ from the CSVs in docs/results/.

    scripts/results.py            rewrite every table between its markers
    scripts/results.py --check    exit 1, naming the tables, when a committed table is not what the
                                  CSVs give (the ctest scripts.results_tables runs this)

A table sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->` in a markdown file; NAME
is one of TABLES below. The CSVs are written by scripts/bench.py (one schema: benchmark, case,
metric, value, unit, commit, cpu, simd, date, command) and, for the simulation, by
scripts/simulate.sh --sweep. Tables under docs/results/ also say where each figure comes from
(commit, CPU, date, command); tables elsewhere carry the command only, never a date.
"""
import argparse
import csv
import glob
import os
import re
import sys

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
RESULTS = os.path.join(ROOT, "docs", "results")


class Missing(Exception):
    pass


def load(name):
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        raise Missing(f"docs/results/{name} is missing")
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def kv(case):
    """'N=2 S=8192 dtype=f32 --seq 8192' -> {'N': '2', 'S': '8192', 'dtype': 'f32'} (words without = ignored)."""
    return dict(w.split("=", 1) for w in case.split() if "=" in w and not w.startswith("-"))


def pick(rows, metric, **want):
    """The value of the one row with this metric whose case has every key=value of want."""
    got = [r for r in rows if r["metric"] == metric and all(kv(r["case"]).get(k) == str(v) for k, v in want.items())]
    if len(got) != 1:
        raise Missing(f"{len(got)} rows for {metric} {want}")
    return got[0]


def num(r, fmt):
    return format(float(r["value"]), fmt)


def md(header, lines, align):
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---:" if a == "r" else "---" for a in align) + " |"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return out


def provenance(rows, dated):
    """One line per distinct command: the command and, under docs/results/, commit, CPU, date."""
    seen, out = [], []
    for r in rows:
        key = (r["command"], r["commit"], r["cpu"], r["date"])
        if key not in seen:
            seen.append(key)
    for command, commit, cpu, date in seen:
        where = f" (commit {commit}, {cpu}, {date})" if dated else ""
        out.append(f"Made by `{command}`{where}.")
    return out


# ---- the tables -----------------------------------------------------------------------------------
def t_headline(dated):
    k, t, py, lay, mem, dt = (load(f) for f in ("kernel.csv", "vs-torch.csv", "python.csv", "layouts.csv",
                                                 "memory.csv", "dtype.csv"))
    kc = dict(selection="default", dtype="f32", S=4096, D=64)
    f, b = pick(k, "forward_of_peak", **kc), pick(k, "backward_of_peak", **kc)
    pc = dict(selection="default", dtype="f32", D=64)
    piece, typical = pick(k, "piece_of_peak", **pc), pick(k, "piece_median_of_peak", **pc)
    n2 = dict(impl="ringattn", N=2, selection="default")
    vt = pick(t, "speedup_vs_pytorch", **n2)
    n1 = pick(t, "speedup_vs_n1", **n2)
    pyr = pick(py, "python_over_cli")
    zz = pick(lay, "speedup_vs_contiguous", N=2, layout="zigzag")
    imb = pick(lay, "imbalance", N=2, layout="contiguous")
    mems = sorted((r for r in mem if r["metric"] == "peak_rss_mib"), key=lambda r: int(kv(r["case"])["S"]))
    bf = pick(dt, "time_over_f32", transport="shm", dtype="bf16")
    S = lambda r: kv(r["case"])["S"]  # noqa: E731
    lines = [
        [f"kernels, one core, f32, S={S(f)}, D=64, whole passes: forward, backward against the FMA peak",
         f"{num(f, '.0f')}%, {num(b, '.0f')}%", f"`{f['command']}`"],
        ["kernels, one forward piece on warm operands, f32, D=64, against the FMA peak: the best of 3000, the median",
         f"{num(piece, '.0f')}%, {num(typical, '.0f')}%", f"`{piece['command']}`"],
        [f"N=2 forward + backward against PyTorch eager on both cores (S={S(vt)}, H=8, D=64, f32)",
         f"{num(vt, '.2f')}×", f"`{vt['command']}`"],
        ["N=2 against N=1, and the most two N=1 jobs at once gained on the same cores",
         f"{num(n1, '.2f')}×, {num(pick(t, 'ceiling_vs_n1', **n2), '.2f')}×", f"`{n1['command']}`"],
        [f"causal, N=2, S={S(zz)}: zigzag against contiguous shards (contiguous imbalance {num(imb, '.2f')})",
         f"{num(zz, '.2f')}× faster", f"`{zz['command']}`"],
        ["`ringattn.attention` + backward from Python against `ringattn run`, N=2",
         f"{num(pyr, '.3f')}× the time", f"`{pyr['command']}`"],
        ["bf16 storage against f32, N=2, shared memory (causal, S=8192, GQA)", f"{num(bf, '.2f')}× the time",
         f"`{bf['command']}`"],
        [f"peak RSS per rank, causal N=2, S={S(mems[0])} → {S(mems[-1])}",
         f"{num(mems[0], '.0f')} → {num(mems[-1], '.0f')} MiB", f"`{mems[0]['command']}`"],
    ]
    return md(["result", "value", "reproduce with"], lines, "lll")


def t_kernel(dated):
    rows = load("kernel.csv")
    cases = []
    for r in rows:
        c = kv(r["case"])
        if "S" in c and r["case"] not in cases and "N" not in c:
            cases.append(r["case"])
    lines = []
    for c in cases:
        d = kv(c)
        g = lambda m: pick([r for r in rows if r["case"] == c], m)  # noqa: E731
        sel = "default" if d["selection"] == "default" else f"`{d['selection']}`"
        lines.append([g("forward_gflops")["simd"], sel, d["dtype"], d["S"], d["D"], num(g("forward_gflops"), ".1f"),
                      num(g("forward_of_peak"), ".1f") + "%", num(g("forward_best_of_peak"), ".1f") + "%",
                      num(g("backward_gflops"), ".1f"), num(g("backward_of_peak"), ".1f") + "%",
                      num(g("backward_best_of_peak"), ".1f") + "%", num(g("forward_peak_gflops"), ".1f")])
    out = md(["target", "selection", "dtype", "S", "D", "forward GFLOP/s", "of peak", "best", "backward GFLOP/s",
              "of peak", "best", "peak GFLOP/s"], lines, "lllrrrrrrrrr")
    pieces = [r for r in rows if "piece" in kv(r["case"])]
    if pieces:
        out.append("")
        plines = []
        cases = list(dict.fromkeys(r["case"] for r in pieces))
        # the tile start's and the median piece's columns where every case has them (tables measured
        # before them have not)
        has = lambda m: all(any(r["case"] == c and r["metric"] == m for r in pieces) for c in cases)  # noqa: E731
        start, typical = has("tile_start_of_products"), has("piece_median_of_peak")
        for c in cases:
            d = kv(c)
            g = lambda m: pick([r for r in pieces if r["case"] == c], m)  # noqa: E731
            plines.append([g("score_of_peak")["simd"], d["dtype"], d["D"], num(g("score_of_peak"), ".1f") + "%",
                           num(g("accumulate_of_peak"), ".1f") + "%", num(g("exp_of_products"), ".1f") + "%",
                           num(g("piece_of_peak"), ".1f") + "%"]
                          + ([num(g("tile_start_of_products"), ".1f") + "%"] if start else [])
                          + ([num(g("piece_median_of_peak"), ".1f") + "%"] if typical else []))
        out += md(["target", "dtype", "D", "score QKᵀ", "accumulate P·V", "exponentials, of the products' time",
                   "piece"] + (["K/V tile start, of the products' time"] if start else [])
                  + (["median piece"] if typical else []), plines,
                  "llrrrrr" + ("r" if start else "") + ("r" if typical else ""))
    causal = [r for r in rows if "N" in kv(r["case"])]
    if causal:
        c = kv(causal[0]["case"])
        out += ["", f"Causal zigzag against non-causal, N=2, S={c['S']}: "
                    f"{num(pick(causal, 'causal_over_full_time'), '.3f')} of the time for "
                    f"{num(pick(causal, 'causal_over_full_flops'), '.3f')} of the flops (median of {c['rounds']} rounds)."]
    return out + [""] + provenance(rows, dated)


def t_vs_torch(dated):
    rows = load("vs-torch.csv")
    lines = []
    for c in dict.fromkeys(r["case"] for r in rows):
        d = kv(c)
        sub = [r for r in rows if r["case"] == c]
        g = lambda m: pick(sub, m)  # noqa: E731
        if d["impl"] == "pytorch-eager":
            name, vs = f"PyTorch {d['torch']} eager, {d['threads']} threads", "1.00×"
        else:
            sel = "" if d["selection"] == "default" else f", `{d['selection']}`"
            name = f"ringattn N={d['N']}, kernels {sub[0]['simd']}{sel}"
            vs = num(g("speedup_vs_pytorch"), ".2f") + "×" if any(r["metric"] == "speedup_vs_pytorch" for r in sub) else ""
        lines.append([name, num(g("forward_s"), ".3f"), num(g("backward_s"), ".3f"), num(g("total_s"), ".3f"),
                      num(g("gflops"), ".1f"), vs])
    d = kv(rows[0]["case"])
    out = [f"S={d['S']}, H={d['H']}, D={d['D']}, {d['dtype']}, mask {d['mask']}, forward + backward:", ""]
    out += md(["", "forward s", "backward s", "total s", "GFLOP/s", "vs PyTorch"], lines, "lrrrrr")
    extra = [r for r in rows if r["metric"] in ("speedup_vs_n1", "ceiling_vs_n1", "of_ceiling", "slowest_rank_wait")]
    if extra:
        by = {r["metric"]: r for r in extra if kv(r["case"]).get("selection") == "default"}
        text = f"N=2 over N=1: {num(by['speedup_vs_n1'], '.2f')}×"
        if "ceiling_vs_n1" in by:
            text += (f"; two N=1 jobs at once allow at most {num(by['ceiling_vs_n1'], '.2f')}× on this machine, "
                     f"and the ring reached {num(by['of_ceiling'], '.0f')}% of that")
        text += f"; exposed wait of the slowest rank {num(by['slowest_rank_wait'], '.2f')}%."
        out += ["", text]
    return out + [""] + provenance(rows, dated)


def t_vs_sdpa(dated):
    rows = load("vs-sdpa.csv")
    lines = []
    for c in dict.fromkeys(r["case"] for r in rows if kv(r["case"])["impl"] == "ringattn"):
        d = kv(c)
        sub = [r for r in rows if r["case"] == c]
        want = dict(impl="pytorch-sdpa", threads=d["N"], S=d["S"], mask=d["mask"], dtype=d["dtype"])
        t = [r for r in rows if all(kv(r["case"]).get(k) == v for k, v in want.items())]
        lines.append([d["S"], d["mask"], d["dtype"], f"{d['N']}", num(pick(t, "total_s"), ".3f"),
                      num(pick(t, "gflops"), ".1f"), num(pick(sub, "total_s"), ".3f"), num(pick(sub, "gflops"), ".1f"),
                      num(pick(sub, "speedup_vs_sdpa"), ".2f") + "×", num(pick(sub, "speedup_vs_sdpa_paired"), ".2f") + "×"])
    d = kv(rows[0]["case"])
    ours = next(r for r in rows if kv(r["case"])["impl"] == "ringattn")
    out = [f"PyTorch {d['torch']} `scaled_dot_product_attention` on T threads against ringattn N=T "
           f"(kernels {ours['simd']}), H={d['H']}, D={d['D']}, forward + backward, medians of {d['rounds']} rounds:", ""]
    out += md(["S", "mask", "dtype", "threads = N", "SDPA s", "SDPA GFLOP/s", "ringattn s", "ringattn GFLOP/s",
               "speedup", "speedup, paired rounds"], lines, "rllrrrrrrr")
    return out + [""] + provenance(rows, dated)


def t_python(dated):
    rows = load("python.csv")
    d = kv(rows[0]["case"])
    out = md(["N", "S", "H", "D", "`ringattn run` s", "Python s", "Python / CLI"],
             [[d["N"], d["S"], d["H"], d["D"], num(pick(rows, "cli_total_s"), ".3f"),
               num(pick(rows, "python_total_s"), ".3f"), num(pick(rows, "python_over_cli"), ".4f")]], "rrrrrrr")
    return out + [""] + provenance(rows, dated)


def t_layouts(dated):
    rows = load("layouts.csv")
    lines = []
    for c in dict.fromkeys(r["case"] for r in rows):
        d = kv(c)
        sub = [r for r in rows if r["case"] == c]
        has = {r["metric"]: r for r in sub}
        get = lambda m, f: num(has[m], f) if m in has else ""  # noqa: E731
        lines.append([d["N"], d["layout"], get("imbalance", ".3f"), get("model_block", ".3f"),
                      get("model_pairs", ".3f"), get("total_s", ".3f"),
                      (get("speedup_vs_contiguous", ".2f") + "×") if "speedup_vs_contiguous" in has else "",
                      get("causal_over_full_flops", ".3f")])
    d = kv(rows[0]["case"])
    out = [f"Causal, S={d['S']}, H={d['H']}, D={d['D']}, {d['dtype']}; times at N={d['N']} only:", ""]
    out += md(["N", "layout", "imbalance", "2N/(N+1)", "(2N−1)/N", "total s", "vs contiguous", "causal / full flops"],
              lines, "rlrrrrrr")
    return out + [""] + provenance(rows, dated)


def t_memory(dated):
    rows = load("memory.csv")
    lines = []
    for c in dict.fromkeys(r["case"] for r in rows if r["metric"] == "peak_rss_mib"):
        d = kv(c)
        sub = [r for r in rows if r["case"] == c]
        lines.append([d["N"], d["S"], num(pick(sub, "budget_mib"), ".1f"), num(pick(sub, "peak_rss_mib"), ".1f")])
    out = md(["N", "S", "planned bytes per rank (MiB)", "peak RSS per rank (MiB)"], lines, "rrrr")
    g = [r for r in rows if r["metric"] == "rss_growth"]
    if g:
        out += ["", f"Peak RSS grew {num(g[0], '.2f')}× for {num(pick(rows, 'positions_growth'), '.0f')}× the positions."]
    return out + [""] + provenance(rows, dated)


def t_dtype(dated):
    rows = load("dtype.csv")
    lines = []
    for c in dict.fromkeys(r["case"] for r in rows):
        d = kv(c)
        sub = [r for r in rows if r["case"] == c]
        has = {r["metric"]: r for r in sub}
        shape = " ".join(w for w in c.split() if w.startswith("--") or "=" not in w)
        lines.append(["shared memory" if d["transport"] == "shm" else "TCP, two namespaces", f"`{shape}`", d["dtype"],
                      num(has["forward_s"], ".4f"), num(has["backward_s"], ".4f"), num(has["total_s"], ".4f"),
                      num(has["time_over_f32"], ".3f") if "time_over_f32" in has else "1.000",
                      num(has["recv_bytes_rank0"], ".2f") + " MiB", num(has["max_wait"], ".1f")])
    out = md(["transport", "shape", "dtype", "forward s", "backward s", "total s", "/ f32", "received by rank 0",
              "max wait %"], lines, "lllrrrrrr")
    return out + [""] + provenance(rows, dated)


def t_simulation(dated):
    sys.path.insert(0, SCRIPTS)
    sys.dont_write_bytecode = True
    from plot import simulated_table  # matplotlib is imported there; the table itself does not draw
    path = os.path.join(RESULTS, "simulate-infiniband.csv")
    if not os.path.exists(path):
        raise Missing("docs/results/simulate-infiniband.csv is missing")
    return simulated_table(path).splitlines()


TABLES = {"headline": t_headline, "kernel": t_kernel, "vs-torch": t_vs_torch, "vs-sdpa": t_vs_sdpa,
          "python": t_python,
          "layouts": t_layouts, "memory": t_memory, "dtype": t_dtype, "simulation": t_simulation}
MARK = re.compile(r"(<!-- results:([a-z-]+) -->\n)(.*?)(<!-- /results:\2 -->)", re.S)


def render(path):
    """The file's text with every marked table regenerated."""
    text = open(path).read()
    dated = os.path.abspath(path).startswith(RESULTS + os.sep)

    def one(m):
        name = m.group(2)
        if name not in TABLES:
            raise Missing(f"{os.path.relpath(path, ROOT)}: unknown table '{name}' (known: {', '.join(TABLES)})")
        return m.group(1) + "\n".join(TABLES[name](dated)) + "\n" + m.group(4)

    return MARK.sub(one, text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    ap.add_argument("files", nargs="*", help="markdown files (default: README.md and docs/**/*.md)")
    a = ap.parse_args()
    files = a.files or [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    stale = []
    for f in files:
        try:
            new = render(f)
        except Missing as e:
            print(f"results.py: error: {os.path.relpath(f, ROOT)}: {e}", file=sys.stderr)
            return 2
        if new != open(f).read():
            stale.append(os.path.relpath(f, ROOT))
            if not a.check:
                with open(f, "w") as fh:
                    fh.write(new)
    if a.check and stale:
        print(f"results.py: the tables of {', '.join(stale)} differ from docs/results/ "
              "(run scripts/results.py and commit)", file=sys.stderr)
        return 1
    if not a.check:
        for f in stale:
            print(f"results.py: rewrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
