#!/usr/bin/env bash
# Install what is missing, build, and run every test (unit, MPI at N=1..5, CLI, PyTorch, the
# installed package, the Python package), then the core's unit tests cross-compiled for aarch64
# under qemu (scripts/test_aarch64.sh; skipped with RINGATTN_AARCH64=0) and the SimGrid
# simulation build (scripts/test_simgrid.sh; skipped with RINGATTN_SIMGRID=0). Extra arguments go
# to ctest (e.g. -L torch).
#   scripts/test.sh --sanitize [ctest args]: AddressSanitizer + UndefinedBehaviorSanitizer build
#   in build-sanitize/ (RINGATTN_SANITIZE=ON), running the unit and MPI tests there.
set -euo pipefail
source "$(dirname "$0")/common.sh"
bash "$ROOT/scripts/setup.sh"
if [ "${1:-}" = "--sanitize" ]; then
  shift
  BUILD="$ROOT/build-sanitize"
  # No Python package there: a sanitized extension loads only with libasan preloaded into python.
  build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRINGATTN_SANITIZE=ON -DRINGATTN_FUZZ=OFF -DRINGATTN_BENCHMARKS=OFF \
        -DRINGATTN_PYTHON=OFF
  # Any report fails the test: UBSan halts (the build also has -fno-sanitize-recover), ASan
  # exits non-zero. Open MPI's own allocations from MPI_Init are never freed: LeakSanitizer
  # skips stacks through Open MPI's libraries (tests/robust/lsan_openmpi.supp) and still
  # reports ringattn's leaks; the full unwinder is needed to see through Open MPI's frames.
  export ASAN_OPTIONS="fast_unwind_on_malloc=0:detect_stack_use_after_return=1:strict_string_checks=1"
  export LSAN_OPTIONS="suppressions=$ROOT/tests/robust/lsan_openmpi.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  cd "$BUILD"
  ctest --output-on-failure --timeout 900 -L 'unit|mpi' "$@"
  exit
fi
build
cd "$BUILD"
ctest --output-on-failure --timeout 900 "$@"
if [ "${RINGATTN_AARCH64:-1}" != 0 ] && [ $# -eq 0 ]; then
  bash "$ROOT/scripts/test_aarch64.sh"
fi
# The SimGrid/SMPI simulation build and its jobs at N = 8 ... 64 (build-smpi/; about a minute
# once built); skipped with RINGATTN_SIMGRID=0.
if [ "${RINGATTN_SIMGRID:-1}" != 0 ] && [ $# -eq 0 ]; then
  bash "$ROOT/scripts/test_simgrid.sh"
fi
