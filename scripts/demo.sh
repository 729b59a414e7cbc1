#!/usr/bin/env bash
# Install what is missing, build, and run a 2-rank ring attention job checked against the
# dense float64 reference. Extra arguments go to `ringattn run`.
set -euo pipefail
source "$(dirname "$0")/common.sh"
bash "$ROOT/scripts/setup.sh"
build >/dev/null
echo "== mpirun -np 2 $BIN run --seq 2048 --heads 4 --head-dim 64 --causal --check $*"
mpirun -np 2 "$BIN" run --seq 2048 --heads 4 --head-dim 64 --causal --check "$@"
