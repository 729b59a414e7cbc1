#!/usr/bin/env bash
# Block kernel rate against the Eigen GEMM rate measured in the same run on the same shapes
# (a benchmark, not a test; one core, f32, L=4096 queries x 4096 keys, D=64 by default).
# Medians of --reps repetitions; rates use CPU time, so a busy machine skews them less.
#   scripts/bench_kernel.sh [--reps 5] [--min-time 1]
set -euo pipefail
source "$(dirname "$0")/common.sh"
REPS=5 MIN_TIME=1
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
  --benchmark_report_aggregates_only=true --benchmark_format=json >"$tmp" 2>/dev/null
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
rows = {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if b.get("aggregate_name") == "median":
        rows[b["run_name"]] = b["GFLOP/s"] / 1e9
gemm = max(v for k, v in rows.items() if k.startswith("BM_Gemm"))
print(f"{'benchmark (L/D/tile_q/tile_k)':42} {'GFLOP/s':>8} {'of GEMM':>8}")
for k, v in rows.items():
    print(f"{k:42} {v:8.1f} {100 * v / gemm:7.1f}%")
print(f"GEMM rate = the best Eigen GEMM above ({gemm:.1f} GFLOP/s, one core, f32)")
PY
