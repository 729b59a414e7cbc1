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

# The first Debian mirror of this machine's apt sources (deb822 or one-line), else deb.debian.org.
debian_mirror() {
  local url
  url=$(grep -hs -E '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | grep -m1 debian || true)
  [ -n "$url" ] || url=$(grep -hs -E '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}' |
                         grep -v security | head -n1 || true)
  echo "${url:-http://deb.debian.org/debian}"
}

# The Debian 13 chroot that scripts/bench_sdpa.sh and scripts/test_debian13.sh share by default.
TRIXIE_DIR=/var/tmp/ringattn-trixie

# trixie_chroot DIR PACKAGE...: a Debian 13 (trixie) chroot at DIR, with PACKAGES installed when any is missing,
# and /proc, /sys and /dev mounted into it until the script exits. Needs root. One line and exit 3 when any of
# that fails.
# - DIR is made with debootstrap from this machine's mirror when missing, in DIR.partial, renamed to DIR once
#   complete; a DIR.partial left by an earlier failure is reported, not reused or removed (debootstrap may have
#   left mounts in it).
# - The mounts are recursive (Open MPI's shared memory needs the chroot's /dev/shm) and slaves, so that
#   unmounting them never propagates to the host's own. They are unmounted by the EXIT trap this sets: a
#   caller must not set an EXIT trap of its own.
CHROOT_MOUNTS=()
unmount_chroot() {
  local i
  for ((i = ${#CHROOT_MOUNTS[@]} - 1; i >= 0; i--)); do umount -l "${CHROOT_MOUNTS[i]}" 2>/dev/null || true; done
}
trixie_chroot() {
  local dir=$1 me p m url missing=()
  me=$(basename "$0")
  shift
  [ "$(id -u)" = 0 ] || { echo "$me: a chroot needs root" >&2; exit 3; }
  if [ ! -d "$dir" ]; then
    [ ! -e "$dir.partial" ] ||
      { echo "$me: $dir.partial is an unfinished debootstrap: unmount what is mounted in it, remove it, run again" >&2; exit 3; }
    command -v debootstrap >/dev/null || { echo "$me: debootstrap is missing (scripts/setup.sh --debootstrap)" >&2; exit 3; }
    url=$(debian_mirror)
    echo "$me: debootstrap trixie into $dir from $url (log: $dir.debootstrap.log)" >&2
    mkdir -p "$dir.partial"
    debootstrap --variant=minbase --include="$(IFS=,; echo "$*")" trixie "$dir.partial" "$url" >"$dir.debootstrap.log" 2>&1 ||
      { echo "$me: debootstrap failed (log: $dir.debootstrap.log)" >&2; exit 3; }
    mv "$dir.partial" "$dir"
  fi
  trap unmount_chroot EXIT
  for m in proc sys dev; do
    if ! mountpoint -q "$dir/$m"; then
      mount --rbind "/$m" "$dir/$m" || { echo "$me: cannot mount /$m into $dir" >&2; exit 3; }
      CHROOT_MOUNTS+=("$dir/$m")
      mount --make-rslave "$dir/$m"
    fi
  done
  for p in "$@"; do
    chroot "$dir" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "$me: installing ${missing[*]} into $dir (log: $dir.apt.log)" >&2
  cp -L /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
  chroot "$dir" /usr/bin/env DEBIAN_FRONTEND=noninteractive /bin/sh -c \
    'apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@"' sh "${missing[@]}" >"$dir.apt.log" 2>&1 ||
    { echo "$me: apt-get install failed in $dir (log: $dir.apt.log)" >&2; exit 3; }
}
