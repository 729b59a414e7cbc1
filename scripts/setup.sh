#!/usr/bin/env bash
# Install the Debian packages ringattn needs, only those that are missing. Idempotent; silent
# when everything is present. Run as root (or with sudo available).
#   scripts/setup.sh            what the build, the tests and the benchmarks need
#   scripts/setup.sh --aarch64  also the cross compiler, qemu-user and the arm64 libraries of the
#                               core (scripts/test_aarch64.sh)
#   scripts/setup.sh --simgrid  also SimGrid (smpicxx, smpirun) for simulated clusters
#                               (scripts/simulate.sh, scripts/test_simgrid.sh)
#   scripts/setup.sh --debootstrap  also debootstrap, which scripts/bench_sdpa.sh and
#                               scripts/test_debian13.sh use to make their Debian 13 chroots
#   scripts/setup.sh --list     print the packages, one per line, and install nothing
set -euo pipefail

packages=(
  g++ cmake make pkg-config
  libopenmpi-dev openmpi-bin          # MPI
  libeigen3-dev libspdlog-dev libfmt-dev libcli11-dev
  libhwy-dev                          # Google Highway: the SIMD kernels, dispatched at run time
  googletest libgtest-dev
  python3-numpy python3-torch python3-matplotlib   # independent reference, plots
  python3-dev pybind11-dev python3-mpi4py          # the Python package (python/)
  python3-setuptools python3-wheel python3-pip python3-venv   # pip install into a virtual environment
  libopenblas0-pthread  # Debian's torch calls libblas.so.3: without this it is the slow reference BLAS
  clang-14 libclang-rt-14-dev         # libFuzzer target of the npy reader (tests/fuzz)
  iproute2                            # two-namespace TCP test (scripts/netns_test.sh)
)
arm=0
list=0
for a in "$@"; do
  case "$a" in
    --aarch64) arm=1 ;;
    --simgrid) packages+=(libsimgrid-dev) ;;  # smpicxx, smpirun and the SimGrid library
    --debootstrap) packages+=(debootstrap) ;;  # the Debian 13 chroots
    --list) list=1 ;;
    *) echo "setup.sh: unknown option $a (expected --aarch64, --simgrid, --debootstrap or --list)" >&2; exit 2 ;;
  esac
done
if [ "$arm" = 1 ]; then
  packages+=(g++-aarch64-linux-gnu qemu-user-static
             libhwy-dev:arm64 libgtest-dev:arm64 libfmt-dev:arm64)
fi
if [ "$list" = 1 ]; then printf '%s\n' "${packages[@]}"; exit 0; fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$arm" = 1 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $SUDO dpkg --add-architecture arm64
fi
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done" >&2
