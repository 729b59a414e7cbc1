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

# The value after an option, for the scripts' option loops; one line and exit 2 when there is none:
#   --seq) SEQ=$(opt_value "$@"); shift 2 ;;
opt_value() {
  [ $# -ge 2 ] || { echo "$(basename "$0"): $1 needs a value" >&2; exit 2; }
  printf '%s' "$2"
}

# positive_ints OPTION VALUE [OPTION VALUE ...]: one line naming the option and exit 2 at the first
# VALUE that is not an integer >= 1.
positive_ints() {
  while [ $# -ge 2 ]; do
    [[ "$2" =~ ^[1-9][0-9]*$ ]] || { echo "$(basename "$0"): $1: expected a positive integer, got '$2'" >&2; exit 2; }
    shift 2
  done
}

# The strategy list of a sweep: ring, ulysses, allgather, usp:U with an integer U >= MIN_U. Prints the first
# problem as one line and returns 1; the caller exits with it (die).
check_strategies() {  # check_strategies "LIST" MIN_U
  local st
  for st in $1; do
    case "$st" in
      ring|ulysses|allgather) ;;
      usp:*) [[ "${st#usp:}" =~ ^[0-9]+$ ]] && [ "${st#usp:}" -ge "$2" ] ||
               { echo "--strategies: '$st' has no Ulysses degree (expected usp:U with an integer U >= $2)"; return 1; } ;;
      *) echo "--strategies: unknown strategy '$st' (expected ring, ulysses, allgather or usp:U)"; return 1 ;;
    esac
  done
}
