#!/usr/bin/env bash
# ringattn against PyTorch 2.x's scaled_dot_product_attention (its CPU flash-attention kernel),
# forward + backward, in one command:
#
#   scripts/bench_sdpa.sh [--chroot DIR] [--python "CMD"] [--out CSV] [bench.py vs-sdpa options...]
#
# SDPA runs under --python CMD (any Python with torch >= 2.1), or, without it, under Debian 13
# (trixie)'s python3-torch 2.6 with OpenBLAS in a debootstrap chroot at DIR (default
# /var/tmp/ringattn-trixie, shared with scripts/test_debian13.sh). The chroot is created when
# missing, from the Debian mirror that /etc/apt/sources.list* names (needs root and debootstrap:
# scripts/setup.sh --debootstrap); /proc, /sys and /dev are mounted into it while the benchmark
# runs. OPENBLAS_NUM_THREADS=1 and torch's threads pinned per case. Then `scripts/bench.py vs-sdpa`
# (S=4096 on one thread against ringattn N=1, S=8192 on two threads against N=2, causal and not,
# f32, medians over rounds) writes --out (default docs/results/vs-sdpa.csv) and scripts/results.py
# re-renders the tables. Not a test: it takes minutes. Exit 2 on a bad option, 3 when the chroot
# cannot be made or a run fails.
set -euo pipefail
. "$(dirname "$0")/common.sh"

COMMAND="scripts/bench_sdpa.sh${*:+ $*}"
DIR=$TRIXIE_DIR
PY=""
OUT="$ROOT/docs/results/vs-sdpa.csv"
PASS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --chroot) DIR=$(opt_value "$@"); shift 2 ;;
    --python) PY=$(opt_value "$@"); shift 2 ;;
    --out) OUT=$(opt_value "$@"); shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) PASS+=("$1"); shift ;;
  esac
done

# The options bench.py takes: a bad one is one line and exit 2 before anything is made or mounted.
/usr/bin/python3 "$ROOT/scripts/bench.py" vs-sdpa --parse-only "${PASS[@]}"

if [ -z "$PY" ]; then
  trixie_chroot "$DIR" python3-torch python3-numpy libopenblas0-pthread
  PY="chroot $DIR /usr/bin/env OPENBLAS_NUM_THREADS=1 /usr/bin/python3"
fi

RINGATTN_BENCH_COMMAND="$COMMAND" /usr/bin/python3 "$ROOT/scripts/bench.py" vs-sdpa --python "$PY" --out "$OUT" "${PASS[@]}"
/usr/bin/python3 "$ROOT/scripts/results.py"
