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
