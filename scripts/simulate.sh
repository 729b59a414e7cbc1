#!/usr/bin/env bash
# Run ringattn on simulated clusters with SimGrid's SMPI: the same sources built with smpicxx
# (RINGATTN_SMPI=ON, in build-smpi/), N simulated ranks on a platform file, the usual summary.
#
#   scripts/simulate.sh --platform FILE --ranks N [ringattn run options]
#       one job: `ringattn run` on N simulated ranks; --report, --trace, --check work as usual;
#       --timing-only charges the kernels' counted flops instead of computing (no outputs, no check)
#   scripts/simulate.sh --platform FILE --ranks N decode [ringattn decode options]
#       `ringattn decode` instead (the KV cache sharded over N simulated ranks); --timing-only
#       charges each step's K/V bytes at --memory-bandwidth GB/s per rank (default 200)
#   scripts/simulate.sh --sweep --platform FILE [--ranks "8 16 32 64 128 256 512 1024"]
#       [--seqs "32768 131072 524288"] [--strategies "ring ulysses usp:8 allgather"] [--heads 32]
#       [--kv-heads 8] [--head-dim 128] [--dtype bf16] [--causal | --no-causal]
#       [--real-max-flops F] [--run-args "..."] [--out build-smpi/simulate/sweep.csv]
#       one simulated job per point and strategy, one CSV row each (then: scripts/plot.py FILE.csv);
#       strategies: ring, ulysses, usp:U (usp with --ulysses-degree U), allgather; a strategy whose rules
#       forbid the point (U must divide N and H) is skipped and said so
#   scripts/simulate.sh --calibrate
#       measure this host's kernel rate (`ringattn probe`), then compare a real N=2 job under
#       mpirun with the same job simulated on a two-rank twin of this machine
#
# Options of every mode:
#   --host-speed FLOPS   this host's kernel rate, what SMPI scales measured compute by
#                        (default: measured once by `ringattn probe` with the normal build and
#                        kept in build-smpi/host-speed; also RINGATTN_HOST_SPEED)
#   --platform FILE      a SimGrid platform (scripts/platforms/: infiniband.xml, ethernet.xml,
#                        smp-nodes.xml; each says what it assumes)
#
# Calibration: SMPI measures the real time of the compute between two MPI calls and charges the
# simulated host t * host_speed / platform_speed, so compute on the platform takes what its flop
# rate says. Timing-only jobs charge the counted flops at the platform's speed directly.
# The watchdog (--timeout) is off under simulation: times are simulated seconds, and SimGrid
# itself reports a deadlock (every rank blocked) and ends the run.
#
# Sweep CSV columns: those of scripts/sweep.sh (N S B H HKV D dtype causal layout strategy
# ulysses_degree forward_s backward_s compute_s wait_s a2a_wait_s wait_ratio fwd_wait_ratio bytes
# gflops tile_pairs imbalance step_intensity max_error status), times in simulated seconds, then
#   platform mode (real | timing-only) wall_s (wall time of the simulation)
#   exposed_wait  slowest rank's wait / its forward + backward time
#   plan_flops plan_bandwidth   the platform's speed and ring-neighbour bandwidth given to `plan`
#   plan_comm_ratio             plan's per-step receive / compute of the strategy's ring (beta /
#                               I_step; for ulysses its all-to-all time / compute)
#   plan_exposed                1 - compute / plan's predicted time: what perfect overlap still
#                               waits, the ring step's max(0, comm - compute) and the whole
#                               all-to-all (comparable with exposed_wait)
#   plan_predicted_s            plan's predicted forward time of the strategy
#   plan_max_ranks_bound        plan's bound on N for I_step >= beta (the ring between the groups)
#   plan_verdict                plan's verdict for the strategy at the point
#   plan_recommended            the strategy plan predicts fastest (of all it can run at the point)
#   recommended                 the strategy probe --strategies would recommend: the least
#                               simulated forward + backward of the strategies swept at the point
# Points run with real compute while the busiest rank's forward + backward is at most
# --real-max-flops (default 2e9: seconds of real compute per rank here); above, timing-only.
set -euo pipefail
source "$(dirname "$0")/common.sh"

SMPI_BUILD="${RINGATTN_SMPI_BUILD:-$ROOT/build-smpi}"
SMPI_BIN="$SMPI_BUILD/ringattn"
TOOLS="$ROOT/scripts/simulate_tools.py"  # what this script computes in Python
die() { echo "simulate.sh: error: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

MODE=run
SUBCOMMAND=run  # the ringattn subcommand a one-job run simulates: run or decode
PLATFORM=""
RANKS=""
HOST_SPEED="${RINGATTN_HOST_SPEED:-}"
SEQS="32768 131072 524288"
STRATEGIES="ring ulysses usp:8"
HEADS=32 KV_HEADS=8 HEAD_DIM=128 DTYPE=bf16 CAUSAL=1
REAL_MAX_FLOPS=2e9
SWEEP_RUN_ARGS=""
OUT=""
RUN_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --sweep) MODE=sweep; shift; continue ;;
    --calibrate) MODE=calibrate; shift; continue ;;
  esac
  if [ "$MODE" = run ]; then
    case "$1" in
      --platform|--ranks|--host-speed) [ $# -ge 2 ] || die "$1: needs a value" ;;
    esac
    case "$1" in
      --platform) PLATFORM="$2"; shift 2 ;;
      --ranks) RANKS="$2"; shift 2 ;;
      --host-speed) HOST_SPEED="$2"; shift 2 ;;
      decode) if [ ${#RUN_ARGS[@]} -eq 0 ]; then SUBCOMMAND=decode; else RUN_ARGS+=("$1"); fi; shift ;;
      *) RUN_ARGS+=("$1"); shift ;;
    esac
    continue
  fi
  case "$1" in
    --causal) CAUSAL=1; shift; continue ;;
    --no-causal) CAUSAL=0; shift; continue ;;
  esac
  [ $# -ge 2 ] || die "$1: needs a value (see --help)"
  case "$1" in
    --platform) PLATFORM="$2" ;;
    --ranks) RANKS="$2" ;;
    --host-speed) HOST_SPEED="$2" ;;
    --seqs) SEQS="$2" ;;
    --strategies) STRATEGIES="${2//,/ }" ;;
    --heads) HEADS="$2" ;;
    --kv-heads) KV_HEADS="$2" ;;
    --head-dim) HEAD_DIM="$2" ;;
    --dtype) DTYPE="$2" ;;
    --real-max-flops) REAL_MAX_FLOPS="$2" ;;
    --run-args) SWEEP_RUN_ARGS="$2" ;;
    --out) OUT="$2" ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift 2
done

# ---- the simulation build -------------------------------------------------------------------
build_smpi() {
  command -v smpicxx >/dev/null || die "smpicxx not found (scripts/setup.sh --simgrid installs SimGrid)"
  if [ ! -f "$SMPI_BUILD/CMakeCache.txt" ]; then
    echo "simulate: configuring the SimGrid/SMPI build in $SMPI_BUILD" >&2
    cmake -S "$ROOT" -B "$SMPI_BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=smpicxx \
      -DRINGATTN_SMPI=ON >/dev/null
  fi
  nice cmake --build "$SMPI_BUILD" -j "$JOBS" --target ringattn_app >"$SMPI_BUILD/build.log" 2>&1 ||
    { tail -20 "$SMPI_BUILD/build.log" >&2; die "the SimGrid/SMPI build failed (log: $SMPI_BUILD/build.log)"; }
}

# This host's kernel rate (FLOP/s): probe's compute_flops, f32, S=4096, H=8, D=128, one rank.
host_speed() {
  if [ -n "$HOST_SPEED" ]; then echo "$HOST_SPEED"; return; fi
  if [ -s "$SMPI_BUILD/host-speed" ]; then cat "$SMPI_BUILD/host-speed"; return; fi
  if [ ! -x "$BIN" ]; then
    echo "simulate: building the normal binary for probe ($BUILD)" >&2
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    nice cmake --build "$BUILD" -j "$JOBS" --target ringattn_app >/dev/null
  fi
  echo "simulate: measuring this host's kernel rate (ringattn probe)" >&2
  local rate
  rate="$(mpirun -np 1 "$BIN" probe --seq 4096 --heads 8 --head-dim 128 --json |
    /usr/bin/python3 "$TOOLS" rate)"
  echo "$rate" >"$SMPI_BUILD/host-speed"
  echo "$rate"
}

# Facts of a platform file: "hosts" (one line per rank it holds) or the cost model's machine figures.
platform_info() {  # platform_info FILE hosts|flops|bandwidth
  /usr/bin/python3 "$TOOLS" platform "$1" "$2"
}

# simulate PLATFORM N [ringattn run options]: one simulated job of $SUBCOMMAND; its exit code.
simulate() {
  local platform="$1" n="$2"
  shift 2
  [ -f "$platform" ] || die "--platform: $platform not found (expected a SimGrid platform file, see scripts/platforms/)"
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] || die "--ranks: '$n' is not a rank count (expected N >= 1)"
  local speed hostfile cap timing=0 a
  speed="$(host_speed)"
  for a in "$@"; do [ "$a" = --timing-only ] && timing=1; done
  hostfile="$(mktemp)"
  platform_info "$platform" hosts >"$hostfile"
  cap="$(wc -l <"$hostfile")"
  [ "$n" -le "$cap" ] || { rm -f "$hostfile"; die "--ranks: $n is more than the $cap ranks $platform holds"; }
  local cfg=(
    "--cfg=smpi/host-speed:${speed}f"
    # ringattn polls MPI_Test between tiles: no simulated time per poll or clock read
    --cfg=smpi/test:0 --cfg=smpi/wtime:0
    # Open MPI's choice of collective algorithms; SMPI's default ones are naive point-to-point
    # fan-outs (an all-gather of 1024 ranks: a million messages)
    --cfg=smpi/coll-selector:ompi
    # folded (timing-only) buffers map one 4 MiB block repeatedly (src/comm/simulation.cpp rounds
    # them to whole blocks): a quarter of the mappings of the 1 MiB default
    --cfg=smpi/shared-malloc-blocksize:4194304
    "--log=root.thres:warning" "--log=xbt_cfg.thres:warning"
  )
  # timing-only: nothing real is charged, only the counted flops (smpi_execute_flops)
  [ "$timing" = 1 ] && cfg+=(--cfg=smpi/simulate-computation:no)
  local rc=0
  nice smpirun -np "$n" -platform "$platform" -hostfile "$hostfile" "${cfg[@]}" "$SMPI_BIN" "$SUBCOMMAND" "$@" || rc=$?
  rm -f "$hostfile"
  return $rc
}

case "$MODE" in
run)
  [ -n "$PLATFORM" ] || die "--platform: missing (e.g. --platform scripts/platforms/infiniband.xml)"
  [ -n "$RANKS" ] || die "--ranks: missing (the number of simulated ranks)"
  build_smpi
  simulate "$PLATFORM" "$RANKS" "${RUN_ARGS[@]}"
  ;;

calibrate)
  build_smpi
  rm -f "$SMPI_BUILD/host-speed"
  speed="$(host_speed)"
  echo "simulate: this host's kernel rate: $speed FLOP/s (smpi/host-speed)"
  # A twin of this machine: two ranks on one host at the host's own speed, so that simulated
  # compute equals measured compute; the link is shared memory as measured here.
  twin="$SMPI_BUILD/this-machine.xml"
  cat >"$twin" <<EOF
<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<!-- This machine: one host of 2 cores at its measured kernel rate; shared memory 3 GB/s, 1 us. -->
<platform version="4.1">
  <zone id="world" routing="Full">
    <cluster id="here" prefix="here-" suffix="" radical="0-0" speed="${speed}f" core="2"
             bw="3GBps" lat="1us" loopback_bw="3GBps" loopback_lat="1us"/>
  </zone>
</platform>
EOF
  [ -x "$BIN" ] || die "$BIN not found (build the normal binary first)"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  for S in 4096 8192; do
    args=(--seq "$S" --heads 8 --head-dim 128 --causal --warmup 1 --iters 3)
    mpirun -np 2 "$BIN" run "${args[@]}" --report "$tmp/real.json" >/dev/null
    simulate "$twin" 2 "${args[@]}" --report "$tmp/sim.json" >/dev/null
    /usr/bin/python3 "$TOOLS" calibrate "$S" "$tmp/real.json" "$tmp/sim.json"
  done
  ;;

sweep)
  [ -n "$PLATFORM" ] || die "--platform: missing"
  [ -f "$PLATFORM" ] || die "--platform: $PLATFORM not found"
  RANKS="${RANKS:-8 16 32 64 128 256 512 1024}"
  OUT="${OUT:-$SMPI_BUILD/simulate/sweep.csv}"
  for v in $RANKS $SEQS "$HEADS" "$KV_HEADS" "$HEAD_DIM"; do
    [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -ge 1 ] || die "'$v' is not an integer >= 1"
  done
  [ "$((HEADS % KV_HEADS))" -eq 0 ] || die "--kv-heads: H=$HEADS is not a multiple of HKV=$KV_HEADS"
  case "$DTYPE" in f32) p=4 ;; f64) p=8 ;; bf16|f16) p=2 ;; *) die "--dtype: '$DTYPE' (expected bf16, f16, f32 or f64)" ;; esac
  why="$(check_strategies "$STRATEGIES" 2)" || die "$why"
  build_smpi
  host_speed >/dev/null
  [ -x "$BIN" ] || die "$BIN not found: the normal build gives plan's predictions"
  PLAN_FLOPS="$(platform_info "$PLATFORM" flops)"
  PLAN_BW="$(platform_info "$PLATFORM" bandwidth)"
  mkdir -p "$(dirname "$OUT")"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  COLS="N S B H HKV D dtype causal layout strategy ulysses_degree forward_s backward_s compute_s wait_s a2a_wait_s \
wait_ratio fwd_wait_ratio bytes gflops tile_pairs imbalance step_intensity max_error status platform mode wall_s \
exposed_wait plan_flops plan_bandwidth plan_comm_ratio plan_exposed plan_predicted_s plan_max_ranks_bound \
plan_verdict plan_recommended recommended"
  # Rows are written as the points finish (N ascending, every S at each N, the strategies of a
  # point together), so a sweep stopped early keeps the points it ran.
  echo "${COLS// /,}" >"$OUT"
  t_start=$SECONDS
  for N in $RANKS; do
    for S in $SEQS; do
      : >"$tmp/point.csv"
      for st in $STRATEGIES; do
        case "$st" in
          ring) strategy=ring U=1 ;;
          ulysses) strategy=ulysses U=$N ;;
          allgather) strategy=allgather U=1 ;;
          usp:*) strategy=usp U="${st#usp:}" ;;
        esac
        if [ $((N % U)) -ne 0 ] || [ $((HEADS % U)) -ne 0 ] || { [ "$strategy" = usp ] && [ "$U" -ge "$N" ]; }; then
          echo "simulate: $st S=$S N=$N: skipped (U=$U must divide N=$N and H=$HEADS, usp needs U < N)" >&2
          continue
        fi
        # The busiest rank's forward + backward flops (3.5 x 4 B (S/N) S H D, halved when causal).
        flops="$(/usr/bin/python3 "$TOOLS" busiest-flops "$S" "$N" "$HEADS" "$HEAD_DIM" "$CAUSAL")"
        args=(--seq "$S" --heads "$HEADS" --kv-heads "$KV_HEADS" --head-dim "$HEAD_DIM" --dtype "$DTYPE"
              --report "$tmp/report.json")
        [ "$strategy" != ring ] && args+=(--strategy "$strategy")
        [ "$strategy" = usp ] && args+=(--ulysses-degree "$U")
        [ "$CAUSAL" = 1 ] && args+=(--causal)
        mode=real
        if /usr/bin/python3 "$TOOLS" above "$flops" "$REAL_MAX_FLOPS"; then
          mode=timing-only
          args+=(--timing-only)
        fi
        [ "$N" -le 128 ] && args+=(--trace "$tmp/trace.jsonl")
        # shellcheck disable=SC2206  # --run-args is split into words on purpose
        [ -n "$SWEEP_RUN_ARGS" ] && args+=($SWEEP_RUN_ARGS)
        rm -f "$tmp/report.json" "$tmp/trace.jsonl"
        t0=$SECONDS
        rc=0
        simulate "$PLATFORM" "$N" "${args[@]}" >"$tmp/out.txt" 2>"$tmp/err.txt" || rc=$?
        wall=$((SECONDS - t0))
        case $rc in 0) status=ok ;; 1) status=check-failed ;; *) status="exit-$rc" ;; esac
        [ $rc -ne 0 ] && echo "simulate: N=$N S=$S $st: $status: $(grep -m1 -i error "$tmp/err.txt" || tail -1 "$tmp/err.txt")" >&2
        /usr/bin/python3 "$TOOLS" row "$N" "$S" "$HEADS" "$KV_HEADS" "$HEAD_DIM" "$DTYPE" "$CAUSAL" "$status" \
            "$strategy" "$U" "$(basename "$PLATFORM" .xml)" "$mode" "$wall" "$PLAN_FLOPS" "$PLAN_BW" "$p" "$BIN" \
            "$tmp/report.json" "$tmp/trace.jsonl" "$COLS" >>"$tmp/point.csv"
        printf 'simulate: %-7s S=%-7s N=%-5s %-11s %s (%ds wall, %ds total)\n' "$st" "$S" "$N" "$mode" "$status" \
          "$wall" $((SECONDS - t_start)) >&2
      done
      # What probe --strategies would recommend: the least simulated forward + backward of the point.
      /usr/bin/python3 "$TOOLS" recommend "$tmp/point.csv" "$COLS" >>"$OUT"
    done
  done
  echo "simulate: $OUT" >&2
  ;;
esac
