#!/usr/bin/env bash
# Install what is missing, build, and run every test (unit, MPI at N=1..5, CLI, PyTorch).
# Extra arguments go to ctest (e.g. -L torch).
set -euo pipefail
source "$(dirname "$0")/common.sh"
bash "$ROOT/scripts/setup.sh"
build
cd "$BUILD"
ctest --output-on-failure --timeout 900 "$@"
