#!/bin/sh
# run_fuzz.sh FUZZER SOURCE_DIR WORK_DIR RUNS [SECONDS]: fuzz for RUNS inputs (at most SECONDS,
# default 120) from the seed corpus; exit non-zero on a finding (its input is saved in
# WORK_DIR/artifacts/). The seed is fixed and the working corpus starts empty each time, so every
# run replays the same inputs: a CI failure reproduces here, and a pass is not luck of the draw.
# RINGATTN_FUZZ_SEED=N explores elsewhere; a finding then belongs in corpus/ as a regression seed.
set -eu
fuzzer="$1" src="$2" work="$3" runs="$4" seconds="${5:-120}"
rm -rf "$work/corpus"
mkdir -p "$work/corpus" "$work/artifacts"
exec "$fuzzer" -seed="${RINGATTN_FUZZ_SEED:-1}" -runs="$runs" -max_total_time="$seconds" -timeout=10 \
  -rss_limit_mb=2048 -print_final_stats=1 -dict="$src/npy.dict" -artifact_prefix="$work/artifacts/" \
  "$work/corpus" "$src/corpus"
