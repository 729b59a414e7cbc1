#!/usr/bin/env bash
# The MPI-free core and its unit tests on 64-bit Arm without Arm hardware: cross-compiled with
# Debian's g++-aarch64-linux-gnu (build-aarch64/, RINGATTN_CORE_ONLY=ON) and run under qemu-user
# on four emulated CPUs: NEON only, and SVE at 128, 256 and 512 bits. The kernel tests run every
# SIMD target (NEON, SVE, SVE2 and Highway's fixed-length SVE_256 / SVE2_128) against the dense
# references, each on at least one of those CPUs. Installs what is missing first (scripts/setup.sh --aarch64).
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
# qemu-user reads the CPU model from QEMU_CPU; sve-max-vq is the vector length in 128-bit units.
# Each SIMD target is tested once over the four CPUs (RINGATTN_TEST_TARGETS; empty means all the
# CPU runs): every target at 128 bits, where qemu emulates SVE fast, then the fixed-length SVE_256
# at 256 bits and the scalable SVE2 at 512. Wider SVE costs qemu some ten minutes per target.
# Every emulated process is one thread: the CPUs run side by side, as many at once as there are
# cores, the slowest first; each one's output is printed whole when it ends.
runs=("max,sve-max-vq=4:SVE2" "max,sve-max-vq=2:SVE_256" "max,sve-max-vq=1:" "max,sve=off:")
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
emulate() {  # emulate INDEX: one CPU's ctest into $logs/INDEX.log, its status into $logs/INDEX.rc
  local run="${runs[$1]}" rc=0
  local cpu="${run%%:*}" targets="${run#*:}"
  {
    echo "== qemu-aarch64 -cpu $cpu, kernel tests on ${targets:-every target it runs}"
    QEMU_CPU="$cpu" qemu-aarch64-static tests/block_attention_test --gtest_filter='*DispatchPicks*' |
      grep 'SIMD targets' || true
    QEMU_CPU="$cpu" RINGATTN_TEST_TARGETS="$targets" ctest --output-on-failure --timeout 1200 "${@:2}" || rc=1
  } > "$logs/$1.log" 2>&1
  echo "$rc" > "$logs/$1.rc"
}
for i in "${!runs[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  emulate "$i" "$@" &
done
wait
status=0
for i in "${!runs[@]}"; do
  cat "$logs/$i.log"
  [ "$(cat "$logs/$i.rc" 2>/dev/null)" = 0 ] || status=1
done
exit "$status"
