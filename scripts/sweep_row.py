#!/usr/bin/python3
"""One CSV row of scripts/sweep.sh: a run's report and trace, and `ringattn plan`'s step intensity.

    sweep_row.py N S MASK LAYOUT STRATEGY U STATUS REPORT TRACE BINARY H HKV D DTYPE "COLUMNS"

Prints the row's values for the space-separated COLUMNS (report_row.csv_line). A missing report or
trace (a run that failed) leaves its columns empty.
"""
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_row import csv_line, measured  # noqa: E402


def main(argv):
    N, S, mask, layout, strategy, U, status, report, trace, binary, H, HKV, D, dtype, cols = argv
    causal = mask == "causal"
    p = {"f64": 8, "f32": 4}.get(dtype, 2)  # bytes per stored element (bf16, f16: 2)
    planned = subprocess.run([binary, "plan", "--seq", S, "--ranks", N, "--heads", H, "--kv-heads", HKV, "--head-dim",
                              D, "--bytes", str(p)] + (["--causal"] if causal else []) + ["--json"],
                             capture_output=True, text=True)
    plan = json.loads(planned.stdout) if planned.returncode == 0 else {}
    # the plan's row for this strategy: I_step of the ring between the groups (none for ulysses and
    # allgather);
    # usp with U = 1 is the ring, with U = N ulysses
    same = {"1": "ring", N: "ulysses"}.get(U, strategy) if strategy == "usp" else strategy
    est = [x for x in plan.get("strategies", []) if x.get("strategy") == same and x.get("ulysses_degree") == int(U)]
    intensity = est[0].get("step_intensity") if est else ""
    if same == "ring":
        intensity = plan.get("step_intensity", "")
    row = dict(N=N, S=S, B=1, H=H, HKV=HKV, D=D, dtype=dtype, causal=int(causal), layout=layout, strategy=strategy,
               ulysses_degree=U, step_intensity="" if intensity is None else intensity, status=status)
    cols_measured, config = measured(report, trace)
    row.update(cols_measured)
    row["B"] = config.get("batch", row["B"])
    print(csv_line(row, cols))


if __name__ == "__main__":
    main(sys.argv[1:])
