#!/usr/bin/env bash
# Block kernel rate against the Eigen GEMM rate measured in the same run on the same shapes
# (a benchmark, not a test; one core, f32, L=4096 queries x 4096 keys, D=64 by default).
# Medians of --reps repetitions, interleaved at random across the benchmarks so that a slow
# minute on the VM hits the GEMMs and the kernels alike; rates use CPU time.
# Two yardsticks: the best Eigen GEMM of the run (the issue's "GEMM rate"), and the same GEMMs
# the kernel does on the same tiles without the softmax ("own GEMMs"). Then the paired runs: the
# kernel and the best GEMM alternate every ~50 ms, and each repetition gives their ratio.
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
  --benchmark_enable_random_interleaving=true --benchmark_format=json >"$tmp" 2>/dev/null
/usr/bin/python3 - "$tmp" <<'PY'
import json, statistics, sys
runs = {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if b.get("run_type") == "iteration":
        runs.setdefault(b["run_name"], []).append(b)
med = lambda name, key: statistics.median(x[key] for x in runs[name])
rows = {k: med(k, "GFLOP/s") / 1e9 for k in runs if "GFLOP/s" in runs[k][0]}
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
print()
print("Paired (each iteration: the kernel, then the Q K^T GEMM tiles, back to back; per repetition):")
for key in sorted((k for k in runs if k.startswith("BM_Paired")), key=lambda k: ("Backward" in k, len(k), k)):
    r = sorted(x["of_gemm"] for x in runs[key])
    print(f"  {key:40} kernel {med(key, 'kernel_GFLOPs'):6.1f} GFLOP/s, GEMM {med(key, 'gemm_GFLOPs'):6.1f}; "
          f"kernel/GEMM min {100 * r[0]:.0f}%, median {100 * statistics.median(r):.0f}%, max {100 * r[-1]:.0f}%")
PY
