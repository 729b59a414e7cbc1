#!/usr/bin/env bash
# Install the Debian packages ringattn needs, only those that are missing. Idempotent; silent
# when everything is present. Run as root (or with sudo available).
set -euo pipefail

packages=(
  g++ cmake make pkg-config
  libopenmpi-dev openmpi-bin          # MPI
  libeigen3-dev libspdlog-dev libfmt-dev libcli11-dev
  googletest libgtest-dev libbenchmark-dev
  python3-numpy python3-torch python3-matplotlib   # independent reference, plots
  libopenblas0-pthread  # Debian's torch calls libblas.so.3: without this it is the slow reference BLAS
  clang-14 libclang-rt-14-dev         # libFuzzer target of the npy reader (tests/fuzz)
  iproute2                            # two-namespace TCP test (scripts/netns_test.sh)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done" >&2
