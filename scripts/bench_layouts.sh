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
    --seq) SEQ=$(opt_value "$@"); shift 2 ;;
    --heads) HEADS=$(opt_value "$@"); shift 2 ;;
    --head-dim) HEAD_DIM=$(opt_value "$@"); shift 2 ;;
    --iters) ITERS=$(opt_value "$@"); shift 2 ;;
    --timed) TIMED=$(opt_value "$@"); shift 2 ;;
    --counted) COUNTED=$(opt_value "$@"); shift 2 ;;
    *) echo "bench_layouts.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
positive_ints --seq "$SEQ" --heads "$HEADS" --head-dim "$HEAD_DIM" --iters "$ITERS"
for n in $TIMED; do positive_ints --timed "$n"; done
for n in $COUNTED; do positive_ints --counted "$n"; done
[ -x "$BIN" ] || build >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf "causal S=%s H=%s D=%s f32; imbalance = max/mean of per-rank flops; models for contiguous shards:\n" \
  "$SEQ" "$HEADS" "$HEAD_DIM"
printf "the cost model's 2N/(N+1) (the diagonal block computed whole) and (2N-1)/N (visible pairs only)\n"
printf "%3s  %-10s  %9s  %7s  %7s  %11s  %11s  %11s  %9s  %s\n" N layout imbalance "2N/(N+1)" "(2N-1)/N" "fwd (s)" \
  "bwd (s)" "total (s)" "speedup" "flops causal/full"
for N in $TIMED $COUNTED; do
  iters=$ITERS warm=1
  case " $COUNTED " in *" $N "*) iters=1 warm=0 ;; esac
  base=""
  for layout in contiguous striped zigzag; do
    mpirun -np "$N" "$BIN" run --seq "$SEQ" --heads "$HEADS" --head-dim "$HEAD_DIM" --causal --layout "$layout" \
      --iters "$iters" --warmup "$warm" --report "$tmp/r.json" >/dev/null 2>&1
    # the same layout without the mask, forward only: its flops are the non-causal total
    mpirun -np "$N" "$BIN" run --seq "$SEQ" --heads "$HEADS" --head-dim "$HEAD_DIM" --layout "$layout" \
      --iters 1 --warmup 0 --no-backward --report "$tmp/full.json" >/dev/null 2>&1
    line=$(/usr/bin/python3 - "$tmp/r.json" "$tmp/full.json" <<'PY'
import json, sys
r, full = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
b = r["imbalance"]
# backward flops are 2.5x forward: the causal pass's forward share is 1/3.5 of its total
ratio = b["total_flops"] / 3.5 / full["imbalance"]["total_flops"]
print(b["flops_max_over_mean"], b["model_contiguous_causal"], b["model_contiguous_causal_pairs"],
      r["time"]["forward_s"], r["time"]["backward_s"], ratio)
PY
)
    read -r imb model pairs fwd bwd ratio <<<"$line"
    total=$(/usr/bin/python3 -c "print($fwd + $bwd)")
    [ -z "$base" ] && base=$total
    speed=$(/usr/bin/python3 -c "print(f'{$base / $total:.2f}x')")
    case " $COUNTED " in *" $N "*) speed="(counted)" ;; esac
    printf "%3s  %-10s  %9.3f  %7.3f  %7.3f  %11.3f  %11.3f  %11.3f  %9s  %.4f\n" "$N" "$layout" "$imb" "$model" \
      "$pairs" "$fwd" "$bwd" "$total" "$speed" "$ratio"
  done
done
