#!/usr/bin/env bash
# The simulation build under test: builds build-smpi/ (SimGrid/SMPI) if needed, then
#   - N = 8, 32, 64 simulated ranks on the InfiniBand platform (and 40 on Ethernet, 16 on shared-
#     memory nodes) with real compute and --check
#     (causal zigzag, GQA, f64 and f32, uneven shards), each against the dense float64 reference;
#   - the same under the ulysses, usp and allgather strategies (and bf16);
#   - a timing-only job of each strategy, whose counted work and bytes must equal the same job
#     computed for real;
#   - the options a timing-only job refuses (exit 2);
#   - decode: the sharded KV cache at N = 8 with --check, a timing-only 1M-token cache at N = 64.
# Needs SimGrid (scripts/setup.sh --simgrid). Prints its wall time.
set -euo pipefail
source "$(dirname "$0")/common.sh"
bash "$ROOT/scripts/setup.sh" --simgrid
SIM="$ROOT/scripts/simulate.sh"
IB="$ROOT/scripts/platforms/infiniband.xml"
SMP="$ROOT/scripts/platforms/smp-nodes.xml"
t_start=$SECONDS
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# A fixed host speed: the checks do not depend on it, and no probe has to run first.
export RINGATTN_HOST_SPEED="${RINGATTN_HOST_SPEED:-8e10}"
failed=0
fail() { echo "test_simgrid: FAIL: $*" >&2; failed=$((failed + 1)); }

check_run() {  # check_run NAME PLATFORM N [run options]: --check must pass, the report must say so
  local name="$1" platform="$2" n="$3"
  shift 3
  local t0=$SECONDS rc=0
  bash "$SIM" --platform "$platform" --ranks "$n" "$@" --check --report "$tmp/$name.json" >"$tmp/$name.out" 2>&1 || rc=$?
  if [ $rc -ne 0 ]; then
    fail "$name: exit $rc"
    tail -5 "$tmp/$name.out" >&2
    return
  fi
  /usr/bin/python3 "$ROOT/scripts/simgrid_checks.py" checked "$tmp/$name.json" "$n" || fail "$name: report"
  grep -q "simulated by SimGrid/SMPI" "$tmp/$name.out" || fail "$name: the summary does not say it was simulated"
  echo "test_simgrid: $name: N=$n passed --check ($((SECONDS - t0)) s)"
}

# Build first; every rank must get its own copy of ringattn's globals: no STB_GNU_UNIQUE symbol,
# which the loader would share between the per-rank copies of the executable.
bash "$SIM" --platform "$IB" --ranks 1 --seq 8 --heads 1 --head-dim 8 >/dev/null 2>&1 || fail "a one-rank job"
if nm -D "$ROOT/build-smpi/ringattn" | grep -q " u "; then
  fail "unique symbols in build-smpi/ringattn (shared by all simulated ranks): $(nm -D "$ROOT/build-smpi/ringattn" | grep -c " u ")"
fi

check_run n8-f64 "$IB" 8 --seq 203 --heads 4 --kv-heads 2 --head-dim 16 --dtype f64 --causal
check_run n32-f32 "$IB" 32 --seq 512 --heads 4 --kv-heads 1 --head-dim 32 --causal
check_run n64-f64 "$IB" 64 --seq 640 --heads 2 --kv-heads 1 --head-dim 16 --dtype f64 --causal
check_run n64-f32-window "$IB" 64 --seq 700 --heads 2 --head-dim 16 --window 40
check_run n40-ethernet "$ROOT/scripts/platforms/ethernet.xml" 40 --seq 256 --heads 2 --head-dim 16 --causal
check_run n16-smp-docs "$SMP" 16 --seq 333 --heads 2 --head-dim 16 --doc-lens 100,200,33 --causal --dtype f64
check_run n32-usp "$IB" 32 --seq 512 --heads 8 --kv-heads 2 --head-dim 16 --causal --strategy usp --ulysses-degree 4
check_run n8-ulysses-bf16 "$IB" 8 --seq 256 --heads 8 --kv-heads 2 --head-dim 32 --causal --strategy ulysses --dtype bf16
check_run n16-allgather "$IB" 16 --seq 256 --heads 4 --kv-heads 2 --head-dim 16 --causal --strategy allgather --kv-head-group 1

# Timing-only: the same job's counted work and ledger as when computed, no check, marked; for each
# strategy (ulysses needs N | H: 8 ranks for H = 8).
args=(--seq 2048 --heads 8 --kv-heads 2 --head-dim 64 --causal)
for point in "ring 16" "usp 16 --ulysses-degree 4" "ulysses 8" "allgather 16 --kv-head-group 1"; do
  # shellcheck disable=SC2086  # the point's words: strategy, N, options
  set -- $point
  strategy="$1" n="$2"
  shift 2
  t0=$SECONDS
  sargs=("${args[@]}" --strategy "$strategy" "$@")
  bash "$SIM" --platform "$IB" --ranks "$n" "${sargs[@]}" --report "$tmp/real.json" >/dev/null 2>&1 ||
    fail "$strategy real $n: exit $?"
  bash "$SIM" --platform "$IB" --ranks "$n" "${sargs[@]}" --timing-only --report "$tmp/timing.json" \
    >"$tmp/timing.out" 2>&1 || fail "$strategy timing-only $n: exit $?"
  /usr/bin/python3 "$ROOT/scripts/simgrid_checks.py" timing "$tmp/real.json" "$tmp/timing.json" ||
    fail "$strategy: timing-only against real"
  grep -q "timing-only" "$tmp/timing.out" || fail "$strategy timing-only: the summary does not say so"
  echo "test_simgrid: $strategy timing-only N=$n matches the computed job's work and ledger ($((SECONDS - t0)) s)"
done

# decode: the sharded KV cache on N = 8 simulated ranks against float64 (prefill and decode rows,
# T = 4, GQA, a window), then a timing-only 1M-token cache on 64 ranks.
t0=$SECONDS
rc=0
bash "$SIM" --platform "$IB" --ranks 8 decode --cache-len 203 --new-tokens 4 --steps 3 --heads 4 --kv-heads 2 \
  --head-dim 16 --dtype f64 --window 50 --check --report "$tmp/decode.json" >"$tmp/decode.out" 2>&1 || rc=$?
[ $rc -eq 0 ] || { fail "decode N=8: exit $rc"; tail -5 "$tmp/decode.out" >&2; }
/usr/bin/python3 "$ROOT/scripts/simgrid_checks.py" decode "$tmp/decode.json" 8 215 || fail "decode N=8: report"
grep -q "simulated by SimGrid/SMPI" "$tmp/decode.out" || fail "decode: the summary does not say it was simulated"
echo "test_simgrid: decode N=8 passed --check ($((SECONDS - t0)) s)"
t0=$SECONDS
rc=0
bash "$SIM" --platform "$IB" --ranks 64 decode --prefill load --cache-len 1048576 --new-tokens 1 --steps 4 \
  --heads 32 --kv-heads 8 --head-dim 128 --dtype bf16 --timing-only --report "$tmp/decode-t.json" \
  >"$tmp/decode-t.out" 2>&1 || rc=$?
[ $rc -eq 0 ] || { fail "decode timing-only N=64: exit $rc"; tail -5 "$tmp/decode-t.out" >&2; }
/usr/bin/python3 "$ROOT/scripts/simgrid_checks.py" decode "$tmp/decode-t.json" 64 1048580 ||
  fail "decode timing-only N=64: report"
grep -q "timing-only" "$tmp/decode-t.out" || fail "decode timing-only: the summary does not say so"
echo "test_simgrid: decode timing-only N=64, a 1M-token cache ($((SECONDS - t0)) s)"
for bad in --check "--out $tmp/o"; do
  rc=0
  # shellcheck disable=SC2086  # $bad is an option and its value
  bash "$SIM" --platform "$IB" --ranks 4 decode --cache-len 64 --timing-only $bad >"$tmp/bad.out" 2>&1 || rc=$?
  [ $rc -eq 2 ] || fail "decode --timing-only $bad: exit $rc (expected 2)"
  [ ! -e "$tmp/o" ] || fail "decode --timing-only $bad: left $tmp/o"
done

for bad in --check "--out $tmp/o" --layer "--rope 10000"; do
  rc=0
  # shellcheck disable=SC2086  # $bad is an option and its value
  bash "$SIM" --platform "$IB" --ranks 4 --seq 64 --timing-only $bad >"$tmp/bad.out" 2>&1 || rc=$?
  [ $rc -eq 2 ] || fail "--timing-only $bad: exit $rc (expected 2)"
  [ ! -e "$tmp/o" ] || fail "--timing-only $bad: left $tmp/o"
done
echo "test_simgrid: --timing-only refuses --check, --out, --layer, --rope (exit 2)"

echo "test_simgrid: $failed failed, $((SECONDS - t_start)) s wall"
[ "$failed" -eq 0 ]
