#!/bin/sh
# run_fuzz.sh FUZZER SOURCE_DIR WORK_DIR SECONDS: fuzz for SECONDS from the seed corpus; exit
# non-zero on a finding (its input is saved in WORK_DIR/artifacts/).
set -eu
fuzzer="$1" src="$2" work="$3" seconds="$4"
mkdir -p "$work/corpus" "$work/artifacts"
exec "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -dict="$src/npy.dict" -artifact_prefix="$work/artifacts/" "$work/corpus" "$src/corpus"
