#!/usr/bin/env bash
# The block kernels against the FMA peak of the core they run on (a benchmark, not a test).
#
# Part 1, kernel_bench on one core: before every repetition the FMA peak is measured (12
# independent chains of fused multiply-adds, the best 2 ms window of 0.2 s), then the kernel runs;
# each row shows the kernel's GFLOP/s, that peak and the percentage, medians over --reps; "best",
# the best repetition's rate over the best peak (other tenants of a shared machine only slow a
# repetition); and "% sust", the kernel's rate over the rate the same chains sustain for as long as
# the kernel ran, right after it (on a shared machine both lose the other tenants' turns; on an idle
# core it equals "% peak"). It runs twice: with the target the kernels use by default (the best
# this CPU runs) and with RINGATTN_SIMD=AVX2 forced, so one x86 machine with AVX-512 shows both x86
# paths (on a CPU without AVX-512 the two runs coincide). A second table per run shows the passes
# undisturbed: one forward piece of the default tiles on warm operands, the score product, the
# accumulate and the exponentials each timed apart, the best of 3000, over the better of the peaks
# measured just before and after (on a shared machine the first table moves with the other tenants;
# this one much less).
# Shapes: S = 4096 and 8192 queries x as many keys, H = 8, D = 64 and 128, f32; f64 at D = 64 and
# 128 for S = 4096. Flops as FlashAttention counts them (forward 4 S^2 H D, backward 2.5x).
#
# Part 2, the causal mask at N=2: `ringattn run` forward + backward with --causal --layout zigzag
# against the same run unmasked, alternating in --rounds rounds; the ratio of the two times per
# round, and its median. The causal run has 0.50x the flops (plus the diagonal).
#
#   scripts/bench_kernel.sh [--reps 5] [--rounds 3] [--targets default,AVX2] [--no-causal]
set -euo pipefail
source "$(dirname "$0")/common.sh"
REPS=5 ROUNDS=3 TARGETS="default,AVX2" CAUSAL=1
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS=$(opt_value "$@"); shift 2 ;;
    --rounds) ROUNDS=$(opt_value "$@"); shift 2 ;;
    --targets) TARGETS=$(opt_value "$@"); shift 2 ;;
    --no-causal) CAUSAL=0; shift ;;
    *) echo "bench_kernel.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
positive_ints --reps "$REPS" --rounds "$ROUNDS"
[ -x "$BUILD/tests/bench/kernel_bench" ] && [ -x "$BIN" ] || build >/dev/null
BENCH="$BUILD/tests/bench/kernel_bench"

echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); SIMD targets this CPU runs:" \
     "$("$BENCH" --targets all --seqs 64 --heads 1 --head-dims 8 --dtypes f32 --reps 1 --forward-only |
        awk 'NR > 2 {print $1}' | paste -sd' ')"
IFS=',' read -ra targets <<<"$TARGETS"
for t in "${targets[@]}"; do
  if [ "$t" = default ]; then
    echo "## default target"
    env -u RINGATTN_SIMD "$BENCH" --seqs 4096,8192 --heads 8 --head-dims 64,128 --dtypes f32 --reps "$REPS"
    env -u RINGATTN_SIMD "$BENCH" --seqs 4096 --heads 8 --head-dims 64,128 --dtypes f64 --reps "$REPS" | tail -n +3
    env -u RINGATTN_SIMD "$BENCH" --pieces --head-dims 64,128 --dtypes f32,f64
  else
    echo "## RINGATTN_SIMD=$t"
    if ! RINGATTN_SIMD="$t" "$BENCH" --seqs 64 --heads 1 --head-dims 8 --dtypes f32 --reps 1 --forward-only \
         >/dev/null 2>&1; then
      echo "(this CPU cannot run $t)"
      continue
    fi
    RINGATTN_SIMD="$t" "$BENCH" --seqs 4096,8192 --heads 8 --head-dims 64,128 --dtypes f32 --reps "$REPS"
    RINGATTN_SIMD="$t" "$BENCH" --seqs 4096 --heads 8 --head-dims 64,128 --dtypes f64 --reps "$REPS" | tail -n +3
    RINGATTN_SIMD="$t" "$BENCH" --pieces --head-dims 64,128 --dtypes f32,f64
  fi
done

[ "$CAUSAL" = 1 ] || exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
RUN=(run --seq 8192 --heads 8 --head-dim 64 --iters 3 --warmup 1)
echo "## causal zigzag against non-causal, N=2, S=8192 H=8 D=64 f32, forward + backward"
job() {  # job NAME ARGS...: one N=2 run, its progress lines kept out of the table
  local name=$1; shift
  mpirun -np 2 --bind-to core "$BIN" "${RUN[@]}" "$@" --report "$tmp/$name.json" >/dev/null 2>"$tmp/$name.log" ||
    { cat "$tmp/$name.log" >&2; exit 3; }
}
for r in $(seq 1 "$ROUNDS"); do
  job "full_$r"
  job "causal_$r" --causal --layout zigzag
done
/usr/bin/python3 - "$tmp" "$ROUNDS" <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
def load(name):
    r = json.load(open(f"{d}/{name}.json"))
    return r["time"]["forward_s"] + r["time"]["backward_s"], r["imbalance"]["total_flops"], r["config"]["simd"]
full = [load(f"full_{i}") for i in range(1, rounds + 1)]
causal = [load(f"causal_{i}") for i in range(1, rounds + 1)]
ratio = [c[0] / f[0] for f, c in zip(full, causal)]
print(f"kernels {full[0][2]}; non-causal {' '.join(f'{x[0]:.3f}' for x in full)} s; "
      f"causal zigzag {' '.join(f'{x[0]:.3f}' for x in causal)} s")
print(f"causal / non-causal time per round: {' '.join(f'{x:.3f}' for x in ratio)}; median {statistics.median(ratio):.3f} "
      f"(flops {causal[0][1] / full[0][1]:.3f})")
PY
