#!/usr/bin/python3
"""What scripts/simulate.sh computes in Python, one subcommand each:

    simulate_tools.py rate                     probe's --json on stdin -> its compute_flops
    simulate_tools.py platform FILE hosts|flops|bandwidth
                                               a SimGrid platform's hosts (one line per rank it holds),
                                               node flop rate or ring-neighbour bandwidth
    simulate_tools.py busiest-flops S N H D CAUSAL
                                               the busiest rank's forward + backward flops,
                                               3.5 x 4 (S/N) S H D, halved when causal
    simulate_tools.py above X LIMIT            exit 0 when X > LIMIT, else 1
    simulate_tools.py calibrate S REAL.json SIM.json
                                               one line: the real job against the simulated one
    simulate_tools.py row N S H HKV D DTYPE CAUSAL STATUS STRATEGY U PLATFORM MODE WALL PFLOPS PBW P
                          BINARY REPORT TRACE "COLUMNS"
                                               one sweep CSV row: the run's report and trace with
                                               `ringattn plan`'s prediction for the strategy
    simulate_tools.py recommend POINT.csv "COLUMNS"
                                               the point's rows with "recommended" filled in: the
                                               least simulated forward + backward of the strategies
"""
import csv
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_row import csv_line, measured  # noqa: E402


def rate():
    print("%.6g" % json.load(sys.stdin)["compute_flops"])


def platform(path, what):
    def num(v):
        m = re.fullmatch(r"([0-9.eE+-]+)\s*([a-zA-Z]*)", v.strip())
        x, u = float(m.group(1)), m.group(2)
        scale = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
        for suffix in ("Bps", "f", "s"):
            if u.endswith(suffix):
                u = u[: -len(suffix)]
        return x * scale[u]

    root = ET.parse(path).getroot()
    hosts, flops, bw = [], None, None
    for c in root.iter("cluster"):
        a, b = (int(x) for x in c.get("radical").split("-"))
        cores = int(c.get("core", "1"))
        # one line per rank (smpirun would otherwise write an unrolled copy into the working directory)
        hosts += [f'{c.get("prefix")}{i}{c.get("suffix", "")}' for i in range(a, b + 1) for _ in range(cores)]
        flops = flops or num(c.get("speed"))
        # ring neighbours share a node when nodes hold several ranks
        bw = bw or num(c.get("loopback_bw") if cores > 1 and c.get("loopback_bw") else c.get("bw"))
    for h in root.iter("host"):
        hosts += [h.get("id")] * int(h.get("core", "1"))
        flops = flops or num(h.get("speed"))
    if what == "hosts":
        print("\n".join(hosts))
    elif what == "flops":
        print("%.6g" % flops)
    else:
        print("%.6g" % bw)


def busiest_flops(S, N, H, D, causal):
    print(3.5 * 4 * (int(S) / int(N)) * int(S) * int(H) * int(D) * (0.5 if causal == "1" else 1))


def above(x, limit):
    return 0 if float(x) > float(limit) else 1


def calibrate(S, real_path, sim_path):
    real, sim = json.load(open(real_path)), json.load(open(sim_path))

    def fig(r):
        return r["time"]["forward_s"], r["time"]["backward_s"], max(x["time"]["compute_s"] for x in r["ranks"])

    a, b = fig(real), fig(sim)
    print(f"S={S}: real N=2 forward {a[0]*1e3:.1f} ms backward {a[1]*1e3:.1f} ms compute {a[2]*1e3:.1f} ms | "
          f"simulated forward {b[0]*1e3:.1f} ms backward {b[1]*1e3:.1f} ms compute {b[2]*1e3:.1f} ms | "
          f"simulated/real: forward {b[0]/a[0]:.3f} backward {b[1]/a[1]:.3f} compute {b[2]/a[2]:.3f}")


def row(N, S, H, HKV, D, dtype, causal, status, strategy, U, platform_name, mode, wall, pflops, pbw, p, binary, report,
        trace, cols):
    causal = causal == "1"
    plan = subprocess.run([binary, "plan", "--seq", S, "--ranks", N, "--heads", H, "--kv-heads", HKV, "--head-dim", D,
                           "--bytes", p, "--flops", pflops, "--bandwidth", pbw, "--json"] + (["--causal"] if causal else []),
                          capture_output=True, text=True)
    pj = json.loads(plan.stdout) if plan.returncode == 0 else {}
    r = dict(N=N, S=S, B=1, H=H, HKV=HKV, D=D, dtype=dtype, causal=int(causal), status=status, strategy=strategy,
             ulysses_degree=U, platform=platform_name, mode=mode, wall_s=wall, plan_flops=pflops, plan_bandwidth=pbw)
    # plan's row for this strategy and U; the least predicted time of the strategies it can run
    est = [x for x in pj.get("strategies", []) if x.get("possible")]
    mine = [x for x in est if x["strategy"] == strategy and x["ulysses_degree"] == int(U)]
    if mine:
        e = mine[0]
        ring_part = strategy not in ("ulysses", "allgather")
        ratio = e["step_comm_ratio"] if ring_part else e["comm_ratio"]  # beta / I_step of the ring part
        # perfect overlap waits for what compute cannot cover in each ring step (max(0, comm - compute)
        # of a step's max(comm, compute)) and for the whole all-to-all: 1 - compute / predicted
        r.update(step_intensity=e.get("step_intensity") or "", plan_comm_ratio=ratio,
                 plan_exposed=max(0.0, 1.0 - pj["compute_s"] / e["predicted_s"]), plan_predicted_s=e["predicted_s"],
                 plan_verdict=e.get("verdict", ""))
        if ring_part:  # the ring between R = N/U groups: I_step(R) R / beta
            r["plan_max_ranks_bound"] = e["step_intensity"] * int(N) / pj["beta"]
    if est:
        best = min(est, key=lambda x: x["predicted_s"])
        r["plan_recommended"] = best["strategy"] + (f":{best['ulysses_degree']}" if best["strategy"] == "usp" else "")
    cols_measured, config = measured(report, trace)
    r.update(cols_measured)
    if config:
        r["layout"] = config["layout"]
    print(csv_line(r, cols))


def recommend(point, cols):
    cols = cols.split()
    rows = list(csv.DictReader(open(point, newline=""), fieldnames=cols))
    ok = [r for r in rows if r["status"] == "ok" and r["forward_s"]]
    if ok:
        best = min(ok, key=lambda r: float(r["forward_s"]) + float(r["backward_s"]))
        name = best["strategy"] + (":" + best["ulysses_degree"] if best["strategy"] == "usp" else "")
        for r in rows:
            r["recommended"] = name
    csv.DictWriter(sys.stdout, fieldnames=cols, lineterminator="\n").writerows(rows)


COMMANDS = {"rate": rate, "platform": platform, "busiest-flops": busiest_flops, "above": above,
            "calibrate": calibrate, "row": row, "recommend": recommend}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(f"simulate_tools.py: error: expected one of {', '.join(COMMANDS)}", file=sys.stderr)
        sys.exit(2)
    sys.exit(COMMANDS[sys.argv[1]](*sys.argv[2:]) or 0)
