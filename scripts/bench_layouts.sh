#!/usr/bin/env bash
# Causal load balance by layout (a benchmark, not a test). Causal S=8192, H=4, D=64, f32:
# timed on N=2 (median of --iters, the slowest rank's), counted on N=4 and N=8 (oversubscribed
# on a small machine: their times mean little, their work counts are exact).
#   scripts/bench_layouts.sh [--seq S] [--heads H] [--head-dim D] [--iters K] [--timed "2"] [--counted "4 8"]
set -euo pipefail
source "$(dirname "$0")/common.sh"
SEQ=8192 HEADS=4 HEAD_DIM=64 ITERS=3 TIMED="2" COUNTED="4 8"
while [ $# -gt 0 ]; do
  case "$1" in
    --seq) SEQ=$2; shift 2 ;;
    --heads) HEADS=$2; shift 2 ;;
    --head-dim) HEAD_DIM=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --timed) TIMED=$2; shift 2 ;;
    --counted) COUNTED=$2; shift 2 ;;
    *) echo "bench_layouts.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || build >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf "causal S=%s H=%s D=%s f32; imbalance = max/mean of per-rank flops (seed model for contiguous: 2N/(N+1))\n" \
  "$SEQ" "$HEADS" "$HEAD_DIM"
printf "%3s  %-10s  %9s  %7s  %11s  %11s  %11s  %9s\n" N layout imbalance model "fwd (s)" "bwd (s)" "total (s)" "speedup"
for N in $TIMED $COUNTED; do
  iters=$ITERS warm=1
  case " $COUNTED " in *" $N "*) iters=1 warm=0 ;; esac
  base=""
  for layout in contiguous striped zigzag; do
    mpirun -np "$N" "$BIN" run --seq "$SEQ" --heads "$HEADS" --head-dim "$HEAD_DIM" --causal --layout "$layout" \
      --iters "$iters" --warmup "$warm" --report "$tmp/r.json" >/dev/null
    line=$(/usr/bin/python3 - "$tmp/r.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
b = r["imbalance"]
print(b["flops_max_over_mean"], b["model_contiguous_causal"], r["time"]["forward_s"], r["time"]["backward_s"])
PY
)
    read -r imb model fwd bwd <<<"$line"
    total=$(/usr/bin/python3 -c "print($fwd + $bwd)")
    [ -z "$base" ] && base=$total
    speed=$(/usr/bin/python3 -c "print(f'{$base / $total:.2f}x')")
    case " $COUNTED " in *" $N "*) speed="(counted)" ;; esac
    printf "%3s  %-10s  %9.3f  %7.3f  %11.3f  %11.3f  %11.3f  %9s\n" "$N" "$layout" "$imb" "$model" "$fwd" "$bwd" "$total" "$speed"
  done
done
