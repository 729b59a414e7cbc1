# Sourced by the scripts: where things are, how to build, how to run MPI here.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${RINGATTN_BUILD:-$ROOT/build}"
BIN="$BUILD/ringattn"
JOBS="$(nproc 2>/dev/null || echo 2)"

# Open MPI refuses root unless told twice; more ranks than cores need oversubscription
# (scripts/openmpi.env, shared with the tests).
set -a
# shellcheck source=openmpi.env
. "$ROOT/scripts/openmpi.env"
set +a

build() {  # build [extra cmake args...]
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  cmake --build "$BUILD" -j "$JOBS"
}

# The strategy list of a sweep: ring, ulysses, usp:U with an integer U >= MIN_U. Prints the first
# problem as one line and returns 1; the caller exits with it (die).
check_strategies() {  # check_strategies "LIST" MIN_U
  local st
  for st in $1; do
    case "$st" in
      ring|ulysses) ;;
      usp:*) [[ "${st#usp:}" =~ ^[0-9]+$ ]] && [ "${st#usp:}" -ge "$2" ] ||
               { echo "--strategies: '$st' has no Ulysses degree (expected usp:U with an integer U >= $2)"; return 1; } ;;
      *) echo "--strategies: unknown strategy '$st' (expected ring, ulysses or usp:U)"; return 1 ;;
    esac
  done
}
