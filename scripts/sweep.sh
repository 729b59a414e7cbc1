#!/usr/bin/env bash
# Sweep attention over N ranks x S positions x layout x mask x strategy, one mpirun per point, and write
# one CSV row per run (then: scripts/plot.py FILE.csv). Defaults fit this 2-core machine in a few
# minutes; every option also reads an environment variable of the same name in capitals.
#
#   scripts/sweep.sh [--ranks "1 2 4"] [--seqs "1024 2048 4096 8192 16384"]
#                    [--layouts "contiguous zigzag striped"] [--masks "causal"] [--causal | --no-causal]
#                    [--strategies "ring ulysses usp:2 allgather"]
#                    [--heads 4] [--kv-heads H] [--head-dim 64] [--dtype f32] [--warmup 1] [--iters 2]
#                    [--check-max-seq 4096] [--oversub-max-seq 8192] [--run-args "..."] [--no-probe]
#                    [--build] [--out build/sweep/sweep.csv]
#
# Per point: `ringattn run ... --report --trace` (and --check when S <= --check-max-seq: the dense
# float64 reference is O(S^2) on rank 0: about 3 s at S = 4096, H = 4, against a second for the
# run).
# At N = 1 the layouts coincide, and so do the strategies: only the first of each runs.
# --strategies: ring (default), ulysses, usp:U (usp with --ulysses-degree U), allgather. Points whose
# shape a strategy's rules forbid (ulysses: H % N == 0; usp: U divides N and H) are skipped, and said so.
# With more ranks than cores (N > nproc) the ranks share cores and times mean little; those points
# stop at --oversub-max-seq (their counts, bytes and imbalance are still exact).
# Unless --no-probe, `ringattn probe` runs once first (N = 2) and writes FILE.probe.json next to the
# CSV; plot.py reads its beta for the model line.
#
# CSV columns (times in seconds, medians over --iters; "slowest" = max over ranks):
#   N S B H HKV D dtype causal layout
#   strategy ulysses_degree   ring, ulysses, usp or allgather, and its U (ring and allgather 1, ulysses N)
#   forward_s backward_s   the report's time: slowest rank, median over iterations
#   compute_s wait_s       slowest rank's kernel time and exposed wait (forward + backward)
#   a2a_wait_s             slowest rank's wait in all-to-alls (part of wait_s; 0 for ring and allgather)
#   wait_ratio             sum of wait / sum of compute over ranks (forward + backward)
#   fwd_wait_ratio         the same for the forward pass alone, from the last iteration's trace
#   bytes                  bytes sent by all ranks (forward, replay and gradient returns)
#   gflops                 FLOPs of all ranks / (forward_s + backward_s) / 1e9
#   tile_pairs             computed tile pairs, all ranks
#   imbalance              max / mean FLOPs over ranks (1 = balanced)
#   step_intensity         I_step from `ringattn plan` (FLOP/byte, halved when causal): of the ring
#                          between the groups for usp, empty for ulysses and allgather (no ring)
#   max_error              largest check.max_rel_err of o, lse, dq, dk, dv (empty without --check)
#   status                 ok, check-failed or exit-<code>
set -euo pipefail
source "$(dirname "$0")/common.sh"

RANKS="${RANKS:-1 2 4}"
SEQS="${SEQS:-1024 2048 4096 8192 16384}"
LAYOUTS="${LAYOUTS:-contiguous zigzag striped}"
MASKS="${MASKS:-causal}"
STRATEGIES="${STRATEGIES:-ring}"
HEADS="${HEADS:-4}"
KV_HEADS="${KV_HEADS:-}"
HEAD_DIM="${HEAD_DIM:-64}"
DTYPE="${DTYPE:-f32}"
WARMUP="${WARMUP:-1}"
ITERS="${ITERS:-2}"
CHECK_MAX_SEQ="${CHECK_MAX_SEQ:-4096}"
OVERSUB_MAX_SEQ="${OVERSUB_MAX_SEQ:-8192}"
RUN_ARGS="${RUN_ARGS:-}"
PROBE="${PROBE:-1}"
DO_BUILD=0
OUT="${OUT:-$BUILD/sweep/sweep.csv}"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "sweep.sh: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --causal) MASKS="causal"; shift; continue ;;
    --no-causal) MASKS="none"; shift; continue ;;
    --no-probe) PROBE=0; shift; continue ;;
    --build) DO_BUILD=1; shift; continue ;;
    -h|--help) usage; exit 0 ;;
  esac
  [ $# -ge 2 ] || die "$1: needs a value (see --help)"
  case "$1" in
    --ranks) RANKS="$2" ;;
    --seqs) SEQS="$2" ;;
    --layouts) LAYOUTS="$2" ;;
    --masks) MASKS="$2" ;;
    --strategies) STRATEGIES="$2" ;;
    --heads) HEADS="$2" ;;
    --kv-heads) KV_HEADS="$2" ;;
    --head-dim) HEAD_DIM="$2" ;;
    --dtype) DTYPE="$2" ;;
    --warmup) WARMUP="$2" ;;
    --iters) ITERS="$2" ;;
    --check-max-seq) CHECK_MAX_SEQ="$2" ;;
    --oversub-max-seq) OVERSUB_MAX_SEQ="$2" ;;
    --run-args) RUN_ARGS="$2" ;;
    --out) OUT="$2" ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift 2
done
KV_HEADS="${KV_HEADS:-$HEADS}"
for m in $MASKS; do
  case "$m" in none|causal) ;; *) die "--masks: unknown mask '$m' (expected none or causal)" ;; esac
done
# Everything is checked before the first run: a sweep must not fail an hour in.
positive() {  # positive OPTION VALUES...
  local opt="$1" v
  shift
  [ $# -gt 0 ] || die "$opt: no value (expected one or more integers >= 1)"
  for v in "$@"; do
    [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -ge 1 ] || die "$opt: '$v' is not an integer >= 1"
  done
}
positive --ranks $RANKS
positive --seqs $SEQS
positive --heads "$HEADS"
positive --kv-heads "$KV_HEADS"
positive --head-dim "$HEAD_DIM"
positive --iters "$ITERS"
positive --check-max-seq "$CHECK_MAX_SEQ"
positive --oversub-max-seq "$OVERSUB_MAX_SEQ"
[[ "$WARMUP" =~ ^[0-9]+$ ]] || die "--warmup: '$WARMUP' is not an integer >= 0"
[ "$((HEADS % KV_HEADS))" -eq 0 ] || die "--kv-heads: H=$HEADS is not a multiple of HKV=$KV_HEADS"
[ -n "$LAYOUTS" ] || die "--layouts: no layout (expected contiguous, striped, zigzag or auto)"
for l in $LAYOUTS; do
  case "$l" in contiguous|striped|zigzag|auto) ;; *) die "--layouts: unknown layout '$l' (expected contiguous, striped, zigzag or auto)" ;; esac
done
case "$DTYPE" in f32|f64|bf16|f16) ;; *) die "--dtype: unknown dtype '$DTYPE' (expected bf16, f16, f32 or f64)" ;; esac
[ -n "$STRATEGIES" ] || die "--strategies: no strategy (expected ring, ulysses, allgather or usp:U)"
why="$(check_strategies "$STRATEGIES" 1)" || die "$why"

[ "$DO_BUILD" = 1 ] && build >/dev/null
[ -x "$BIN" ] || die "$BIN not found (build first, or pass --build)"
# Idle ranks yield their core instead of spinning: with more ranks than cores, spinning starves
# the rank that computes.
export OMPI_MCA_mpi_yield_when_idle=1
CORES="$(nproc 2>/dev/null || echo 2)"
mkdir -p "$(dirname "$OUT")"
TMP="$(mktemp -d)"
# A sweep that stops early leaves no half-written CSV.
trap 'rm -rf "$TMP" "$OUT.partial"' EXIT

CSV_COLUMNS="N S B H HKV D dtype causal layout strategy ulysses_degree forward_s backward_s compute_s wait_s a2a_wait_s \
wait_ratio fwd_wait_ratio bytes gflops tile_pairs imbalance step_intensity max_error status"

# One CSV row from a run's report, trace and the cost model (scripts/sweep_row.py).
row() {  # row N S mask layout strategy U status report trace
  /usr/bin/python3 "$ROOT/scripts/sweep_row.py" "$@" "$BIN" "$HEADS" "$KV_HEADS" "$HEAD_DIM" "$DTYPE" "$CSV_COLUMNS"
}

points=()
skipped=""
for N in $RANKS; do
  [ "$N" -ge 1 ] || die "--ranks: $N is not a rank count (expected >= 1)"
  for st in $STRATEGIES; do
    case "$st" in ring|allgather) U=1 ;; ulysses) U=$N ;; usp:*) U="${st#usp:}" ;; esac
    if [ $((N % U)) -ne 0 ] || [ $((HEADS % U)) -ne 0 ]; then
      skipped="$skipped N=$N:$st"
      continue
    fi
    for S in $SEQS; do
      [ "$N" -gt "$CORES" ] && [ "$S" -gt "$OVERSUB_MAX_SEQ" ] && continue
      for mask in $MASKS; do
        for layout in $LAYOUTS; do
          points+=("$N $S $mask $layout ${st%%:*} $U")
          [ "$N" -eq 1 ] && break  # one rank: every layout is the same
        done
      done
    done
    [ "$N" -eq 1 ] && break  # one rank: every strategy is the same
  done
done
[ -z "$skipped" ] || echo "sweep: skipped (the strategy's rules forbid the shape: H=$HEADS):$skipped" >&2

t_start=$SECONDS
if [ "$PROBE" = 1 ]; then
  probe_out="${OUT%.csv}.probe.json"
  echo "sweep: probe (N=2, S=4096) -> $probe_out" >&2
  # probe times f32 or f64 kernels; a 16-bit sweep's compute is f32 arithmetic
  probe_dtype=$([ "$DTYPE" = f64 ] && echo f64 || echo f32)
  if ! mpirun -np 2 "$BIN" probe --seq 4096 --heads "$HEADS" --kv-heads "$KV_HEADS" --head-dim "$HEAD_DIM" \
      --dtype "$probe_dtype" --json >"$TMP/probe.json" 2>"$TMP/probe.err"; then
    echo "sweep: probe failed: $(tail -1 "$TMP/probe.err")" >&2
  else
    mv "$TMP/probe.json" "$probe_out"
  fi
fi

echo "${CSV_COLUMNS// /,}" >"$OUT.partial"
failed=0
k=0
for pt in "${points[@]}"; do
  read -r N S mask layout strategy U <<<"$pt"
  k=$((k + 1))
  args=(run --seq "$S" --heads "$HEADS" --kv-heads "$KV_HEADS" --head-dim "$HEAD_DIM" --dtype "$DTYPE"
        --layout "$layout" --warmup "$WARMUP" --iters "$ITERS" --report "$TMP/report.json" --trace "$TMP/trace.jsonl")
  [ "$mask" = causal ] && args+=(--causal)
  [ "$strategy" = ring ] || args+=(--strategy "$strategy")
  [ "$strategy" = usp ] && args+=(--ulysses-degree "$U")
  [ "$S" -le "$CHECK_MAX_SEQ" ] && args+=(--check)
  # shellcheck disable=SC2206  # --run-args is split into words on purpose
  [ -n "$RUN_ARGS" ] && args+=($RUN_ARGS)
  rm -f "$TMP/report.json" "$TMP/trace.jsonl"
  t0=$SECONDS
  rc=0
  mpirun -np "$N" "$BIN" "${args[@]}" >"$TMP/out.txt" 2>"$TMP/err.txt" || rc=$?
  case $rc in 0) status=ok ;; 1) status=check-failed ;; *) status="exit-$rc" ;; esac
  if [ $rc -ne 0 ]; then
    failed=$((failed + 1))
    echo "sweep: N=$N S=$S $mask $layout $strategy U=$U: $status: $(grep -m1 ringattn "$TMP/err.txt" || tail -1 "$TMP/err.txt")" >&2
  fi
  line="$(row "$N" "$S" "$mask" "$layout" "$strategy" "$U" "$status" "$TMP/report.json" "$TMP/trace.jsonl")"
  echo "$line" >>"$OUT.partial"
  printf 'sweep: [%d/%d] N=%s S=%-6s %-6s %-10s %-7s U=%-2s %s  (%ds, %ds total)\n' "$k" "${#points[@]}" "$N" "$S" \
    "$mask" "$layout" "$strategy" "$U" "$status" $((SECONDS - t0)) $((SECONDS - t_start)) >&2
done
mv "$OUT.partial" "$OUT"
echo "sweep: ${#points[@]} runs, $failed failed, $((SECONDS - t_start)) s -> $OUT" >&2
[ "$failed" -eq 0 ]
