#!/usr/bin/env bash
# Block kernel rate against the Eigen GEMM rate measured in the same run on the same shapes
# (a benchmark, not a test; one core, f32, L=4096 queries x 4096 keys, D=64 by default).
# Medians of --reps repetitions, interleaved at random across the benchmarks so that a slow
# minute on the VM hits the GEMMs and the kernels alike; rates use CPU time.
# Two yardsticks: the best Eigen GEMM of the run (the issue's "GEMM rate"), and the same GEMMs
# the kernel does on the same tiles without the softmax ("own GEMMs").
#   scripts/bench_kernel.sh [--reps 9] [--min-time 0.5]
set -euo pipefail
source "$(dirname "$0")/common.sh"
REPS=9 MIN_TIME=0.5
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS=$2; shift 2 ;;
    --min-time) MIN_TIME=$2; shift 2 ;;
    *) echo "bench_kernel.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$BUILD/tests/bench/kernel_bench" ] || build >/dev/null
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
"$BUILD/tests/bench/kernel_bench" --benchmark_min_time="$MIN_TIME" --benchmark_repetitions="$REPS" \
  --benchmark_enable_random_interleaving=true \
  --benchmark_report_aggregates_only=true --benchmark_format=json >"$tmp" 2>/dev/null
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
rows = {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if b.get("aggregate_name") == "median":
        rows[b["run_name"]] = b["GFLOP/s"] / 1e9
gemm = max(v for k, v in rows.items() if k.startswith("BM_Gemm"))
own = {"BM_BlockForward": rows.get("BM_GemmForwardTiles<float>/4096/64/128/256"),
       "BM_BlockBackward": rows.get("BM_GemmBackwardTiles<float>/4096/64/128/256")}
print(f"{'benchmark (L/D/tile_q/tile_k)':46} {'GFLOP/s':>8} {'of GEMM':>8} {'of own GEMMs':>13}")
order = ["BM_GemmQK", "BM_GemmTiles", "BM_GemmForwardTiles", "BM_GemmBackwardTiles", "BM_BlockForward",
         "BM_BlockBackward"]
for k, v in sorted(rows.items(), key=lambda kv: (order.index(kv[0].split("<")[0].split("/")[0]), kv[0])):
    mine = own.get(k.split("/")[0])
    mine = f"{100 * v / mine:12.1f}%" if mine and k.endswith("/128/256") else ""
    print(f"{k:46} {v:8.1f} {100 * v / gemm:7.1f}% {mine}")
print(f"GEMM rate = the best Eigen GEMM above ({gemm:.1f} GFLOP/s, one core, f32); own GEMMs: the kernel's")
print("GEMMs on its default tiles (128 x 256) without the softmax")
PY
