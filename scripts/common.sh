# Sourced by the scripts: where things are, how to build, how to run MPI here.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${RINGATTN_BUILD:-$ROOT/build}"
BIN="$BUILD/ringattn"
JOBS="$(nproc 2>/dev/null || echo 2)"

# Open MPI refuses root unless told twice; more ranks than cores need oversubscription.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1

build() {  # build [extra cmake args...]
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  cmake --build "$BUILD" -j "$JOBS"
}
