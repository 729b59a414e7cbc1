#!/usr/bin/python3
"""Charts of a scripts/sweep.sh CSV (Debian python3-matplotlib, Agg backend, no display needed).

    scripts/plot.py FILE.csv [--outdir DIR] [--beta B | --probe FILE.probe.json] [--cores N]

Writes four PNGs next to the CSV (or in --outdir), named after it:
  STEM_time.png       the ring's forward + backward time against S, one line per N and layout (log-log);
  STEM_strategies.png the strategies compared over S (N > 1): forward + backward time, and the exposed
                      wait with its all-to-all part; colour and marker name the strategy (the layout
                      when the sweep has one strategy), the line style names N;
  STEM_wait.png       the ring's exposed wait / compute against the cost model's step intensity
                      I_step, forward and forward + backward, with the model's line beta / I_step;
  STEM_imbalance.png  max / mean FLOPs over ranks per layout and N (causal rows of the ring), with the
                      block models 2N/(N+1) and (2N-1)/N for contiguous shards.
Every chart keeps its legend beside the axes, and every strategy has one colour and one marker in
all of them (ring blue circles, ulysses orange squares, allgather grey stars, usp by its U).

beta is the machine's FLOP/byte ratio measured by `ringattn probe` (compute rate / ring bandwidth at
one K/V block): --beta, or the "beta" of --probe, or of STEM.probe.json next to the CSV when sweep.sh
wrote one. Without it the wait chart says so and draws no model line.

A CSV of scripts/simulate.sh --sweep (it has plan_comm_ratio) gives STEM_simulated.png instead:
simulated exposed wait against N, one panel per S and a line per strategy, beside plan's prediction;
with --table, the markdown table of docs/simulation.md (no matplotlib needed).
"""
import argparse
import csv
import json
import math
import os
import sys
from collections import defaultdict

plt = None  # matplotlib.pyplot, imported by the charts only (the --table needs no matplotlib)


def pyplot():
    global plt
    if plt is None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot

        plt = matplotlib.pyplot
    return plt


LAYOUT_STYLE = {"contiguous": ("o", "-"), "zigzag": ("s", "--"), "striped": ("^", ":")}
# matplotlib's default cycle, written out so that the charts and the table need no import
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
# One colour and one marker per strategy, the same in every chart: ring blue circles, ulysses
# orange squares, allgather grey stars, usp a green/red/purple/brown triangle or diamond by its U.
STRATEGY_STYLE = {"ring": ("#1f77b4", "o"), "ulysses": ("#ff7f0e", "s"), "allgather": ("#7f7f7f", "*"),
                  "usp:2": ("#2ca02c", "^"), "usp:4": ("#d62728", "v"), "usp:8": ("#9467bd", "D"),
                  "usp:16": ("#8c564b", "P")}


def strategy_style(name):
    """(colour, marker) of a strategy named ring, ulysses, allgather or usp:U (usp U=U also accepted)."""
    name = name.replace(" U=", ":")
    return STRATEGY_STYLE.get(name, ("#e377c2", "X"))


def legend_outside(fig, ax_or_handles, ncol=1):
    """One legend to the right of the axes, so that it covers no data."""
    handles, labels = ax_or_handles.get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, ncol=ncol, frameon=False)


def num(v):
    try:
        x = float(v)
        return x if math.isfinite(x) else None
    except (TypeError, ValueError):
        return None


def load(path):
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("status") not in ("ok", "check-failed"):
                continue
            for k in ("N", "S", "H", "HKV", "D", "causal"):
                r[k] = int(r[k])
            for k in ("forward_s", "backward_s", "compute_s", "wait_s", "a2a_wait_s", "wait_ratio", "fwd_wait_ratio",
                      "bytes", "gflops", "tile_pairs", "imbalance", "step_intensity", "max_error"):
                r[k] = num(r.get(k))
            r["strategy"] = r.get("strategy") or "ring"  # sweeps before strategies: the ring
            r["ulysses_degree"] = int(r.get("ulysses_degree") or 1)
            rows.append(r)
    return rows


def strategy_label(r):
    return f"usp U={r['ulysses_degree']}" if r["strategy"] == "usp" else r["strategy"]


def shape_title(rows):
    r = rows[0]
    masks = sorted({"causal" if x["causal"] else "non-causal" for x in rows})
    return f"H={r['H']} HKV={r['HKV']} D={r['D']} {r['dtype']}, {' and '.join(masks)}"


def s_ticks(ax, ss):
    """The swept S values as plain numbers on a log2 axis."""
    ss = sorted(set(ss))
    ax.set_xticks(ss, [str(x) for x in ss])
    ax.minorticks_off()


def color_of(ns):
    return {n: COLORS[i % len(COLORS)] for i, n in enumerate(sorted(ns))}


def n_label(n, cores):
    return f"N={n}" + (f" (oversubscribed: {cores} cores)" if n > cores else "")


def plot_time(rows, out, cores):
    """Forward + backward time against S per N and layout, for the ring (the strategies chart compares
    strategies)."""
    rows = [r for r in rows if r["strategy"] == "ring"] or rows
    masks = sorted({r["causal"] for r in rows})
    fig, axes = plt.subplots(1, len(masks), figsize=(6.5 * len(masks), 5), squeeze=False)
    colors = color_of({r["N"] for r in rows})
    for ax, causal in zip(axes[0], masks):
        groups = defaultdict(list)
        for r in rows:
            if r["causal"] == causal and r["forward_s"] is not None and r["backward_s"] is not None:
                groups[(r["N"], r["layout"])].append((r["S"], r["forward_s"] + r["backward_s"]))
        for (n, layout), pts in sorted(groups.items()):
            pts.sort()
            marker, ls = LAYOUT_STYLE.get(layout, ("x", "-."))
            label = n_label(n, cores) + ("" if n == 1 else f", {layout}")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, linestyle=ls, color=colors[n],
                    label=label)
        # an S^2 guide through the median of the N=1 (or smallest N) points
        base = sorted((k for k in groups), key=lambda k: k[0])
        if base:
            pts = sorted(groups[base[0]])
            s0, t0 = pts[len(pts) // 2]
            xs = [p[0] for p in pts]
            ax.plot(xs, [t0 * (x / s0) ** 2 for x in xs], color="gray", linewidth=0.8, alpha=0.6, label="~S² (guide)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        s_ticks(ax, [r["S"] for r in rows if r["causal"] == causal])
        ax.set_xlabel("S (positions)")
        ax.set_ylabel("forward + backward time (s), slowest rank")
        ax.set_title(("causal" if causal else "non-causal") + ": time against S", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    legend_outside(fig, axes[0][0])
    fig.suptitle(f"ringattn sweep, ring: {shape_title(rows)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_wait(rows, out, beta, beta_note, cores):
    panels = (("fwd_wait_ratio", "forward pass (last iteration's trace)"),
              ("wait_ratio", "forward + backward (median over iterations)"))
    # the ring's steps (usp's ring between groups has another I_step and would share the markers)
    pts = [r for r in rows if r["N"] > 1 and r["step_intensity"] and r["strategy"] == "ring"]
    # log axes: an exposed wait of exactly 0 is drawn a little below the smallest measured one, so
    # that the axis spans the data and not decades of nothing
    nonzero = [r[c] for r in pts for c, _ in panels if r[c]]
    floor = float(f"{min(nonzero) / 3:.1g}") if nonzero else 1e-4
    fig, axes = plt.subplots(1, 2, figsize=(15, 6), sharey=True)
    colors = color_of({r["N"] for r in pts} or {2})
    layouts = sorted({r["layout"] for r in pts})
    xs = sorted(r["step_intensity"] for r in pts) or [1, 1e4]
    lo, hi = xs[0] / 2, xs[-1] * 2
    for ax, (col_name, what) in zip(axes, panels):
        seen = set()
        for r in pts:
            if r[col_name] is None:
                continue
            marker, _ = LAYOUT_STYLE.get(r["layout"], ("x", "-"))
            # layouts share I_step: offset them a little so the markers do not hide each other
            shift = 1 + 0.04 * (layouts.index(r["layout"]) - (len(layouts) - 1) / 2)
            key = (r["N"], r["layout"], r["causal"])
            label = None if key in seen else (f"{n_label(r['N'], cores)}, {r['layout']}" +
                                              (", causal" if r["causal"] else ", non-causal"))
            seen.add(key)
            c = colors[r["N"]]  # filled: causal, hollow: non-causal
            ax.scatter([r["step_intensity"] * shift], [max(r[col_name], floor)], marker=marker, edgecolors=c,
                       facecolors=c if r["causal"] else "none", s=40, label=label)
        if beta:
            grid = [lo * (hi / lo) ** (i / 50) for i in range(51)]
            ax.plot(grid, [beta / x for x in grid], color="black", linewidth=1.2,
                    label=f"model, nothing overlapped: comm/compute = β / I_step (β = {beta:.3g} FLOP/byte)")
        for y, name in ((0.05, "5%"), (0.15, "15%")):
            ax.axhline(y, color="gray", linestyle="--", linewidth=0.8)
            ax.text(hi, y, f" {name}", va="center", ha="left", fontsize=8, color="gray")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_xlabel("step intensity I_step (FLOP/byte)")
        ax.set_title(what, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel(f"exposed wait / compute, all ranks (0 drawn at {floor:g})")
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.06, 1), borderaxespad=0)
    fig.suptitle(f"Exposed communication against step intensity ({shape_title(rows)})\n{beta_note}\n"
                 "I_step = (H/HKV)(S/N)(2/p), halved when causal; layouts offset ±4% along x so they stay visible",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_strategies(rows, out, cores):
    """Each strategy over S: forward + backward time, and the exposed wait with its all-to-all part.
    Colour and marker name the strategy; the line style names N."""
    use = [r for r in rows if r["N"] > 1 and r["forward_s"] is not None and r["backward_s"] is not None]
    # usp with U = N is ulysses: drawn once, as ulysses, where the sweep ran both
    uly = {r["N"] for r in use if r["strategy"] == "ulysses"}
    use = [r for r in use if not (r["strategy"] == "usp" and r["ulysses_degree"] == r["N"] and r["N"] in uly)]
    masks = sorted({r["causal"] for r in use}) or [0]
    fig, axes = plt.subplots(len(masks), 2, figsize=(12, 4.8 * len(masks)), squeeze=False)
    styles = ["-", "--", ":", "-."]
    ns = sorted({r["N"] for r in use})
    for row_axes, causal in zip(axes, masks):
        groups = defaultdict(list)
        for r in use:
            if r["causal"] == causal:
                groups[(strategy_label(r), r["N"], r["layout"])].append(r)
        order = lambda k: (list(STRATEGY_STYLE).index(k[0].replace(" U=", ":"))  # noqa: E731
                           if k[0].replace(" U=", ":") in STRATEGY_STYLE else 99, k[1], k[2])
        layouts = sorted({k[2] for k in groups})
        one_strategy = len({k[0] for k in groups}) == 1
        for (st, n, layout) in sorted(groups, key=order):
            rs = sorted(groups[(st, n, layout)], key=lambda r: r["S"])
            if one_strategy:  # nothing to tell apart but the layouts: colour and marker name the layout
                color, marker = COLORS[layouts.index(layout) % len(COLORS)], LAYOUT_STYLE.get(layout, ("x", ""))[0]
                fill = color
            else:  # colour and marker name the strategy; a layout after the first is drawn hollow
                color, marker = strategy_style(st)
                fill = color if layout == layouts[0] else "white"
            ls = styles[ns.index(n) % len(styles)]
            label = f"{st}, {n_label(n, cores)}" + (f", {layout}" if len(layouts) > 1 else "")
            row_axes[0].plot([r["S"] for r in rs], [r["forward_s"] + r["backward_s"] for r in rs], marker=marker,
                             linestyle=ls, color=color, markerfacecolor=fill, label=label, markersize=7)
            waits = [(r["S"], r["wait_s"], r["a2a_wait_s"]) for r in rs if r["wait_s"] is not None]
            row_axes[1].plot([w[0] for w in waits], [max(w[1], 1e-5) for w in waits], marker=marker, linestyle=ls,
                             color=color, markerfacecolor=fill, markersize=7)
            a2a = [w for w in waits if w[2]]
            if a2a:
                row_axes[1].plot([w[0] for w in a2a], [max(w[2], 1e-5) for w in a2a], marker=marker,
                                 linestyle="none", color=color, markerfacecolor="none", markersize=11, alpha=0.8)
        what = "causal" if causal else "non-causal"
        for ax, ylabel in ((row_axes[0], "forward + backward time (s), slowest rank"),
                           (row_axes[1], "exposed wait (s), slowest rank")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            s_ticks(ax, [r["S"] for r in use if r["causal"] == causal])
            ax.set_xlabel("S (positions)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        row_axes[0].set_title(f"{what}: time against S", fontsize=10)
        a2a_note = "\n(large hollow markers: the part spent in all-to-alls)" if any(
            r["a2a_wait_s"] for r in use if r["causal"] == causal) else ""
        row_axes[1].set_title(f"{what}: wait that overlap did not hide{a2a_note}", fontsize=10)
    if not use:
        axes[0][0].set_title("no runs with N > 1: nothing to compare")
    legend_outside(fig, axes[0][0])
    fig.suptitle(f"ringattn strategies: {shape_title(use or rows)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_imbalance(rows, out, cores):
    rows = [r for r in rows if r["strategy"] == "ring"] or rows  # the layouts' balance, as the ring sees it
    causal = [r for r in rows if r["causal"] and r["N"] > 1 and r["imbalance"] is not None]
    use = causal or [r for r in rows if r["N"] > 1 and r["imbalance"] is not None]
    fig, ax = plt.subplots(figsize=(7, 5))
    ns = sorted({r["N"] for r in use})
    layouts = [l for l in LAYOUT_STYLE if any(r["layout"] == l for r in use)]
    layouts += sorted({r["layout"] for r in use} - set(layouts))
    width = 0.8 / max(1, len(layouts))
    for i, layout in enumerate(layouts):
        xs, ys, labels = [], [], []
        for j, n in enumerate(ns):
            cand = [r for r in use if r["N"] == n and r["layout"] == layout]
            if not cand:
                continue
            r = max(cand, key=lambda r: r["S"])  # the largest S: tiles are finest relative to the shard
            xs.append(j + (i - (len(layouts) - 1) / 2) * width)
            ys.append(r["imbalance"])
            labels.append(f"S={r['S']}")
        bars = ax.bar(xs, ys, width=width * 0.95, label=layout, color=COLORS[i % len(COLORS)])
        if causal and layout == "contiguous":  # that model is about contiguous shards
            present = [n for n in ns if any(r["N"] == n and r["layout"] == layout for r in use)]
            for k, (x, n) in enumerate(zip(xs, present)):
                # 1 / utilization: diagonal block counted whole (N+1)/2N, or as a triangle N/(2N-1)
                ax.hlines(2 * n / (n + 1), x - width / 2, x + width / 2, colors="black", linestyles="--",
                          linewidth=2, label="block model, diagonal block whole: 2N/(N+1)" if k == 0 else None)
                ax.hlines((2 * n - 1) / n, x - width / 2, x + width / 2, colors="black", linestyles=":",
                          linewidth=2, label="block model, diagonal as a triangle: (2N-1)/N" if k == 0 else None)
        for b, t in zip(bars, labels):
            ax.text(b.get_x() + b.get_width() / 2, b.get_height() / 2, f"{b.get_height():.2f}\n{t}", ha="center",
                    va="center", fontsize=8, color="white")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(range(len(ns)), [n_label(n, cores) for n in ns], fontsize=8)
    ax.set_ylabel("max / mean FLOPs over ranks (forward + backward)")
    # room for the tallest bar or model line, no more
    ax.set_ylim(0, max([r["imbalance"] for r in use] + [(2 * n - 1) / n for n in ns if causal] + [1.0]) * 1.08)
    ax.set_title(f"Load imbalance per layout{'' if causal else ' (no causal rows: every layout is balanced)'}\n"
                 f"{shape_title(use or rows)}", fontsize=10)
    legend_outside(fig, ax)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_simulated(path, out):
    """A scripts/simulate.sh --sweep CSV: simulated exposed wait against plan's prediction, one panel
    per S; colour and marker name the strategy, solid the simulation, dashed plan."""
    rows = [r for r in csv.DictReader(open(path, newline="")) if r.get("status") == "ok"]
    if not rows:
        return False
    panels = defaultdict(lambda: defaultdict(list))  # S -> strategy (usp:U) -> rows
    for r in rows:
        name = r["strategy"]
        if name == "usp" and r.get("ulysses_degree"):
            name = f"usp:{r['ulysses_degree']}"
        panels[int(r["S"])][name].append(r)
    floor = 1e-4
    order = lambda name: list(STRATEGY_STYLE).index(name) if name in STRATEGY_STYLE else 99  # noqa: E731
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.4), squeeze=False, sharey=True)
    for ax, (S, groups) in zip(axes[0], sorted(panels.items())):
        for strategy in sorted(groups, key=order):
            g = sorted(groups[strategy], key=lambda r: int(r["N"]))
            c, marker = strategy_style(strategy)
            ns = [int(r["N"]) for r in g]
            ax.plot(ns, [max(floor, num(r["exposed_wait"]) or 0) for r in g], marker=marker, linestyle="-", color=c,
                    label=f"{strategy}: simulated", markersize=6)
            # plan predicts no wait at all while I_step >= beta: those points are left out (log axis)
            plan = [(n, num(r["plan_exposed"])) for n, r in zip(ns, g) if (num(r["plan_exposed"]) or 0) > 0]
            ax.plot([p[0] for p in plan], [p[1] for p in plan], linestyle="--", color=c, lw=1,
                    label=f"{strategy}: plan's prediction")
            if strategy == "ring":
                bound = num(g[0]["plan_max_ranks_bound"])
                if bound:
                    ax.axvline(bound, color=c, lw=0.8, alpha=0.5, linestyle=":",
                               label="ring: plan's bound on N (I_step = β)")
        ax.axhline(0.05, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        allns = sorted({int(r["N"]) for g in groups.values() for r in g})
        ax.set_xticks(allns, [str(n) for n in allns], fontsize=8)
        ax.minorticks_off()
        ax.set_title(f"S = {S // 1024}K positions" if S % 1024 == 0 else f"S = {S} positions", fontsize=10)
        ax.set_xlabel("simulated ranks N")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("exposed wait / forward + backward time\n(slowest rank; grey line: 5%)")
    # the legend of the panel with the most strategies: every strategy once
    richest = max(range(len(panels)), key=lambda i: len(list(sorted(panels.items()))[i][1]))
    legend_outside(fig, axes[0][richest])
    r = rows[0]
    fig.suptitle(f"Simulated on {r['platform']}.xml: H={r['H']} HKV={r['HKV']} D={r['D']} {r['dtype']}"
                 f"{', causal' if r['causal'] == '1' else ''}, forward + backward; dashed: plan's prediction "
                 "(left out where it predicts no wait)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def simulated_table(path):
    """docs/simulation.md's table of a scripts/simulate.sh --sweep CSV (markdown): rows S, columns N; each
    cell the ring's simulated exposed wait, plan's beta/I_step with its verdict, and the fastest
    simulated strategy with its forward + backward time against the ring's."""
    rows = [r for r in csv.DictReader(open(path, newline="")) if r.get("status") == "ok"]
    if not rows:
        return None
    short = {"room": "room", "depends": "depends", "not": "not negl."}
    cells, ns, ss = {}, set(), set()
    for r in rows:
        N, S = int(r["N"]), int(r["S"])
        ns.add(N)
        ss.add(S)
        cells.setdefault((S, N), {})[r["strategy"] + (f":{r['ulysses_degree']}" if r["strategy"] == "usp" else "")] = r

    at_n = defaultdict(set)  # the strategies simulated at each N, over every S
    for (S, N), point in cells.items():
        at_n[N] |= set(point)

    def cell(point, N):
        ring = point.get("ring")
        if not ring:
            return "–"
        t = lambda r: float(r["forward_s"]) + float(r["backward_s"])
        verdict = next((v for k, v in short.items() if k in ring["plan_verdict"]), ring["plan_verdict"])
        best = min(point, key=lambda k: t(point[k]))
        rec = "ring" if best == "ring" else f"{best} ({t(point[best]) / t(ring):.2f}×)"
        if set(point) != at_n[N]:  # a point with fewer strategies than its column says so
            rec += f" (of {', '.join(sorted(point))} only)"
        return (f"{float(ring['exposed_wait']) * 100:.1f}% · {float(ring['plan_comm_ratio']) * 100:.0f}% {verdict}"
                f" · {rec}")

    cols = sorted(ns)
    out = ["| S \\ N | " + " | ".join(str(n) for n in cols) + " |", "| --- |" + " ---: |" * len(cols)]
    for S in sorted(ss):
        name = f"{S // 1024}K" if S % 1024 == 0 else str(S)
        out.append(f"| {name} | " + " | ".join(cell(cells.get((S, n), {}), n) for n in cols) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--outdir", help="directory of the PNGs (default: the CSV's)")
    ap.add_argument("--beta", type=float, help="machine FLOP/byte for the model line (from ringattn probe)")
    ap.add_argument("--probe", help="ringattn probe --json output to read beta from")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores of the machine the sweep ran on")
    ap.add_argument("--table", action="store_true",
                    help="a simulate.sh --sweep CSV: print its markdown table (S x N) instead of drawing")
    a = ap.parse_args()
    if os.path.isfile(a.csv) and "plan_comm_ratio" in open(a.csv).readline().split(","):  # simulate.sh --sweep
        if a.table:
            table = simulated_table(a.csv)
            if table is None:
                print(f"plot.py: error: {a.csv}: no successful simulated runs", file=sys.stderr)
                return 2
            print(table)
            return 0
        pyplot()
        out = os.path.join(a.outdir or os.path.dirname(os.path.abspath(a.csv)),
                           os.path.splitext(os.path.basename(a.csv))[0] + "_simulated.png")
        if not plot_simulated(a.csv, out):
            print(f"plot.py: error: {a.csv}: no successful simulated runs to plot", file=sys.stderr)
            return 2
        print(out)
        return 0

    if not os.path.isfile(a.csv):
        print(f"plot.py: error: {a.csv}: no such file (expected a CSV written by scripts/sweep.sh)", file=sys.stderr)
        return 2
    try:
        rows = load(a.csv)
    except (KeyError, ValueError, csv.Error) as e:
        print(f"plot.py: error: {a.csv}: not a sweep CSV ({e})", file=sys.stderr)
        return 2
    if not rows:
        print(f"plot.py: error: {a.csv}: no successful runs to plot", file=sys.stderr)
        return 2
    stem = os.path.splitext(os.path.basename(a.csv))[0]
    outdir = a.outdir or os.path.dirname(os.path.abspath(a.csv))
    os.makedirs(outdir, exist_ok=True)

    beta, note = a.beta, ""
    probe = a.probe or os.path.join(os.path.dirname(os.path.abspath(a.csv)), stem + ".probe.json")
    if beta:
        note = "β given with --beta"
    elif os.path.exists(probe):
        p = json.load(open(probe))
        beta = p.get("beta")
        c = p.get("config", {})
        note = (f"β measured by ringattn probe (N={c.get('ranks')}, S={c.get('seq')}): "
                f"{(p.get('compute_flops') or 0) * 1e-9:.1f} GFLOP/s / {p.get('block_gbps') or 0:.2f} GB/s "
                f"at one {int(p.get('block_bytes') or 0) >> 20} MiB K/V block")
    if not beta:
        note = "no β: pass --beta or --probe (ringattn probe --json) to draw the model line"

    pyplot()
    outs = [os.path.join(outdir, f"{stem}_{k}.png") for k in ("time", "wait", "imbalance", "strategies")]
    plot_time(rows, outs[0], a.cores)
    plot_wait(rows, outs[1], beta, note, a.cores)
    plot_imbalance(rows, outs[2], a.cores)
    plot_strategies(rows, outs[3], a.cores)
    for o in outs:
        print(o)
    return 0


if __name__ == "__main__":
    sys.exit(main())
