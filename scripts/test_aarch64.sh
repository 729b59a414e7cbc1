#!/usr/bin/env bash
# The MPI-free core and its unit tests on 64-bit Arm without Arm hardware: cross-compiled with
# Debian's g++-aarch64-linux-gnu (build-aarch64/, RINGATTN_CORE_ONLY=ON) and run under qemu-user
# on four emulated CPUs: NEON only, and SVE at 128, 256 and 512 bits. On each, the kernel tests run
# every SIMD target that CPU has (NEON, SVE, SVE2 and Highway's fixed-length SVE_256 / SVE2_128)
# against the dense references. Installs what is missing first (scripts/setup.sh --aarch64).
# Extra arguments go to ctest.
#   scripts/test_aarch64.sh [ctest args]
set -euo pipefail
source "$(dirname "$0")/common.sh"
bash "$ROOT/scripts/setup.sh" --aarch64
ARM_BUILD="$ROOT/build-aarch64"
cmake -S "$ROOT" -B "$ARM_BUILD" -DCMAKE_BUILD_TYPE=Release -DRINGATTN_CORE_ONLY=ON -DRINGATTN_BENCHMARKS=OFF \
  -DCMAKE_TOOLCHAIN_FILE="$ROOT/scripts/toolchains/aarch64-linux-gnu.cmake" >/dev/null
cmake --build "$ARM_BUILD" -j "$JOBS"
cd "$ARM_BUILD"
status=0
# qemu-user reads the CPU model from QEMU_CPU; sve-max-vq is the vector length in 128-bit units.
for cpu in "max,sve=off" "max,sve-max-vq=1" "max,sve-max-vq=2" "max,sve-max-vq=4"; do
  echo "== qemu-aarch64 -cpu $cpu"
  QEMU_CPU="$cpu" qemu-aarch64-static tests/block_attention_test --gtest_filter='*DispatchPicks*' |
    grep 'SIMD targets' || true
  if ! QEMU_CPU="$cpu" ctest --output-on-failure --timeout 900 "$@"; then
    status=1
  fi
done
exit "$status"
