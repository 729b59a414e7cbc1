#!/usr/bin/env bash
# Build ringattn and run its tests on Debian 13 (trixie), in a debootstrap chroot: GCC 14, Open MPI 5
# (whose launcher is PRRTE), Highway 1.2, Python 3.13 and PyTorch 2.6, which is then the reference
# of the torch tests and the framework of the Python package's. scripts/test.sh covers Debian 12
# (GCC 12, Open MPI 4.1, PyTorch 1.13). This one is run by hand, not by CI: its chroot is a 2 GB
# download.
#
#   scripts/test_debian13.sh [--chroot DIR] [ctest args...]      e.g. -L python
#
# The netns label is always left out: `ip netns exec` cannot remount / inside a chroot. DIR (default
# /var/tmp/ringattn-trixie, shared with scripts/bench_sdpa.sh) is made when missing, from this
# machine's Debian mirror, with scripts/setup.sh's packages except clang-14 and libclang-rt-14-dev,
# which Debian 13 lacks (the fuzz target is then skipped). It needs root and debootstrap
# (scripts/setup.sh --debootstrap). The committed HEAD is checked out in DIR/ringattn/src and built
# in DIR/ringattn/build. Exit 2 on a bad option, 3 when the chroot cannot be made, else the build's
# or ctest's exit.
set -euo pipefail
. "$(dirname "$0")/common.sh"

DIR=$TRIXIE_DIR
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --chroot) DIR=$(opt_value "$@"); shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

LIST=$(bash "$ROOT/scripts/setup.sh" --list)
mapfile -t PACKAGES < <(grep -vx -e clang-14 -e libclang-rt-14-dev <<<"$LIST")
trixie_chroot "$DIR" "${PACKAGES[@]}" git  # git: the docs tests list the tracked files

SRC="$DIR/ringattn/src"
if [ -d "$SRC/.git" ]; then  # a checkout, not a copy: unchanged files keep their times, the build stays
  git -C "$SRC" fetch -q "$ROOT" HEAD
  git -C "$SRC" checkout -q --detach FETCH_HEAD
else
  mkdir -p "$DIR/ringattn"
  git clone -q "$ROOT" "$SRC"
fi
echo "test_debian13.sh: $(git -C "$SRC" log -1 --format='%h %s' | cut -c1-90)" >&2
chroot "$DIR" /bin/bash -c 'set -e
  cmake -S /ringattn/src -B /ringattn/build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build /ringattn/build -j "$1"
  cd /ringattn/build
  shift
  ctest --output-on-failure --timeout 900 -LE netns "$@"' bash "$JOBS" "${ARGS[@]}"
