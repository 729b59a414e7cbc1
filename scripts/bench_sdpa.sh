#!/usr/bin/env bash
# ringattn against PyTorch 2.x's scaled_dot_product_attention (its CPU flash-attention kernel),
# forward + backward, in one command:
#
#   scripts/bench_sdpa.sh [--chroot DIR] [--python "CMD"] [--out CSV] [bench.py vs-sdpa options...]
#
# SDPA runs under --python CMD (any Python with torch >= 2.1), or, without it, under Debian 13
# (trixie)'s python3-torch 2.6 with OpenBLAS in a debootstrap chroot at DIR (default
# /var/tmp/ringattn-sdpa/trixie). The chroot is created when missing, from the Debian mirror that
# /etc/apt/sources.list* names (needs root and debootstrap: scripts/setup.sh --debootstrap); /proc,
# /sys and /dev are mounted into it while the benchmark runs. OPENBLAS_NUM_THREADS=1 and torch's
# threads pinned per case. Then `scripts/bench.py vs-sdpa` (S=4096 on one thread against ringattn
# N=1, S=8192 on two threads against N=2, causal and not, f32, medians over rounds) writes --out
# (default docs/results/vs-sdpa.csv) and scripts/results.py re-renders the tables. Not a test: it
# takes minutes. Exit 2 on a bad option, 3 when the chroot cannot be made or a run fails.
set -euo pipefail
. "$(dirname "$0")/common.sh"

COMMAND="scripts/bench_sdpa.sh${*:+ $*}"
DIR=/var/tmp/ringattn-sdpa/trixie
PY=""
OUT="$ROOT/docs/results/vs-sdpa.csv"
PASS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --chroot) DIR=$(opt_value "$@"); shift 2 ;;
    --python) PY=$(opt_value "$@"); shift 2 ;;
    --out) OUT=$(opt_value "$@"); shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) PASS+=("$1"); shift ;;
  esac
done

# The options bench.py takes: a bad one is one line and exit 2 before anything is made or mounted.
/usr/bin/python3 "$ROOT/scripts/bench.py" vs-sdpa --parse-only "${PASS[@]}"

# The first Debian mirror of this machine's apt sources (deb822 or one-line), else deb.debian.org.
mirror() {
  local url
  url=$(grep -hs -m1 -E '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -m1 debian | grep -v security || true)
  [ -n "$url" ] || url=$(grep -hs -E '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}' |
                         grep -v security | head -n1 || true)
  echo "${url:-http://deb.debian.org/debian}"
}

MOUNTED=()
cleanup() {
  local i
  for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do umount -l "${MOUNTED[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT

if [ -z "$PY" ]; then
  if [ ! -x "$DIR/usr/bin/python3" ] || [ ! -d "$DIR/usr/lib/python3/dist-packages/torch" ]; then
    command -v debootstrap >/dev/null || { echo "bench_sdpa.sh: debootstrap is missing (scripts/setup.sh --debootstrap)" >&2; exit 3; }
    [ "$(id -u)" = 0 ] || { echo "bench_sdpa.sh: making the chroot needs root" >&2; exit 3; }
    URL=$(mirror)
    echo "bench_sdpa.sh: debootstrap trixie with python3-torch into $DIR from $URL" >&2
    mkdir -p "$DIR"
    debootstrap --variant=minbase --include=python3-torch,python3-numpy,libopenblas0-pthread trixie "$DIR" "$URL" \
      >"$DIR.debootstrap.log" 2>&1 || { echo "bench_sdpa.sh: debootstrap failed (log: $DIR.debootstrap.log)" >&2; exit 3; }
  fi
  for m in proc sys dev; do
    if ! mountpoint -q "$DIR/$m"; then
      mount --bind "/$m" "$DIR/$m" || { echo "bench_sdpa.sh: cannot mount /$m into $DIR" >&2; exit 3; }
      MOUNTED+=("$DIR/$m")
    fi
  done
  PY="chroot $DIR /usr/bin/env OPENBLAS_NUM_THREADS=1 /usr/bin/python3"
fi

RINGATTN_BENCH_COMMAND="$COMMAND" /usr/bin/python3 "$ROOT/scripts/bench.py" vs-sdpa --python "$PY" --out "$OUT" "${PASS[@]}"
/usr/bin/python3 "$ROOT/scripts/results.py"
