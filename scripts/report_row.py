"""The measured columns of one CSV row of scripts/sweep.sh and scripts/simulate.sh, read from a
`ringattn run --report FILE --trace FILE` pair (python3 from Debian; no jq here).

    sys.path.insert(0, SCRIPTS_DIR); from report_row import measured, csv_line
"""
import json
import os


def measured(report, trace):
    """(columns, config) of a run: times of the slowest rank, sums over ranks, the check's largest
    error, the forward's wait ratio from the trace; config is the report's "config". Both are empty
    where a file is missing (a run that failed)."""
    row, config = {}, {}
    if os.path.exists(report):
        with open(report) as f:
            rep = json.load(f)
        config = rep["config"]
        ranks = rep["ranks"]
        fwd, bwd = rep["time"]["forward_s"], rep["time"]["backward_s"]
        comp = [r["time"]["compute_s"] for r in ranks]
        wait = [r["time"]["wait_s"] for r in ranks]
        flops = [r["work"]["flops"] for r in ranks]
        mean = sum(flops) / len(flops)
        busy = [r for r in ranks if r["time"]["forward_s"] + r["time"]["backward_s"] > 0]
        row.update(forward_s=fwd, backward_s=bwd, compute_s=max(comp), wait_s=max(wait),
                   a2a_wait_s=max(r["time"].get("a2a_wait_s", 0) for r in ranks),
                   wait_ratio=sum(wait) / sum(comp) if sum(comp) > 0 else "",
                   # the largest share of a rank's forward + backward spent waiting
                   exposed_wait=max((r["time"]["wait_s"] / (r["time"]["forward_s"] + r["time"]["backward_s"])
                                     for r in busy), default=""),
                   bytes=sum(r["ledger"]["send_bytes"] for r in ranks),
                   gflops=sum(flops) / (fwd + bwd) * 1e-9 if fwd + bwd > 0 else "",
                   tile_pairs=sum(r["work"]["tile_pairs"] for r in ranks),
                   imbalance=max(flops) / mean if mean > 0 else "")
        if "check" in rep:
            errs = [e for e in rep["check"]["max_rel_err"].values() if e is not None]
            row["max_error"] = max(errs) if errs else ""
    if os.path.exists(trace):
        with open(trace) as f:
            steps = [json.loads(line) for line in f if line.strip()]
        fw = [s for s in steps if s.get("pass") == "forward"]
        c = sum(s["compute_s"] for s in fw if s.get("phase") != "all-to-all")
        row["fwd_wait_ratio"] = sum(s["wait_s"] for s in fw) / c if c > 0 else ""
    return row, config


def csv_line(row, cols):
    """The row's values for the space-separated column names `cols` (floats to 6 significant
    digits, a missing column empty)."""
    fmt = lambda v: f"{v:.6g}" if isinstance(v, float) else str(v)  # noqa: E731
    return ",".join(fmt(row.get(k, "")) for k in cols.split())
