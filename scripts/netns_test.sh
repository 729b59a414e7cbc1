#!/usr/bin/env bash
# Two "hosts" on one machine: a ringattn job whose ranks run in two network namespaces joined by
# a veth pair, talking TCP the way they would across nodes.
#
#   bash scripts/netns_test.sh [BINARY] [extra `ringattn run` options]
#   bash scripts/netns_test.sh BINARY probe [`ringattn probe` options]   (measure over TCP instead)
#
# Namespace A holds 10.200.0.1/24, namespace B 10.200.0.2/24, each on an interface named
# `raveth`, like eth0 on two nodes. mpirun starts inside A with `--host 10.200.0.1,10.200.0.2`;
# Open MPI launches its daemon for 10.200.0.2 through an rsh agent that runs the command inside B
# (`ip netns exec B /bin/sh -c "$*"`) instead of ssh. `--mca btl self,tcp` and the interface
# selection force the ranks onto TCP over the veth, as on a cluster without shared memory.
# The job runs with --check and must exit 0 and print PASSED.
#
# Exits 0 on success, 1 on failure, 77 (ctest SKIP_RETURN_CODE) with the reason where network
# namespaces cannot be made (not root, no iproute2, no veth support, a container without
# CAP_SYS_ADMIN/CAP_NET_ADMIN). Only the addresses inside the namespaces it creates are used, and
# the namespaces (with everything still running in them) are removed on exit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$(realpath "${1:-$ROOT/build/ringattn}")"
shift || true
MPIRUN="${MPIRUN:-mpirun}"
SKIP=77
skip() { echo "SKIP: $*"; exit "$SKIP"; }
fail() { echo "FAIL: $*"; exit 1; }

[ -x "$BIN" ] || fail "no ringattn binary at $BIN"
[ "$(id -u)" -eq 0 ] || skip "creating network namespaces needs root"
command -v ip >/dev/null || skip "iproute2 ('ip') is not installed (scripts/setup.sh installs it)"
command -v "$MPIRUN" >/dev/null || fail "no $MPIRUN"

tag="$$"
NS_A="ringattn-a-$tag" NS_B="ringattn-b-$tag"
HOST_A=10.200.0.1 HOST_B=10.200.0.2
IFACE=raveth
work="$(mktemp -d /tmp/ringattn-netns-XXXXXX)"

cleanup() {
  for ns in "$NS_A" "$NS_B"; do
    if ip netns list 2>/dev/null | grep -qw "$ns"; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true  # takes its end of the veth pair with it
    fi
  done
  ip link del "ra${tag}a" 2>/dev/null || true  # if we failed before moving it
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Namespaces of an earlier run that was killed before its trap ran (named after its pid).
for ns in $(ip netns list 2>/dev/null | grep -oE '^ringattn-[ab]-[0-9]+' || true); do
  if ! kill -0 "${ns##*-}" 2>/dev/null; then
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  fi
done

err="$work/ip.err"
ip netns add "$NS_A" 2>"$err" || skip "cannot create a network namespace: $(cat "$err")"
ip netns add "$NS_B" 2>"$err" || skip "cannot create a second network namespace: $(cat "$err")"
ip link add "ra${tag}a" type veth peer name "ra${tag}b" 2>"$err" || skip "cannot create a veth pair: $(cat "$err")"
ip link set "ra${tag}a" netns "$NS_A"
ip link set "ra${tag}b" netns "$NS_B"
# The same interface name on both "hosts", so one --mca ..._if_include fits both (like eth0).
ip -n "$NS_A" link set "ra${tag}a" name "$IFACE"
ip -n "$NS_B" link set "ra${tag}b" name "$IFACE"
ip -n "$NS_A" addr add "$HOST_A/24" dev "$IFACE"
ip -n "$NS_B" addr add "$HOST_B/24" dev "$IFACE"
for ns in "$NS_A" "$NS_B"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "$IFACE" up
done

# The rsh agent: Open MPI calls it as `agent HOST COMMAND...`, as it would call ssh.
agent="$work/netns_rsh"
cat >"$agent" <<EOF
#!/bin/sh
host="\$1"; shift
case "\$host" in
  $HOST_A) ns="$NS_A" ;;
  $HOST_B) ns="$NS_B" ;;
  *) echo "netns_rsh: unknown host \$host" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
chmod +x "$agent"

set -a
. "$(dirname "$0")/openmpi.env"  # root, oversubscription: the one definition the tests share
set +a
mpi=("$MPIRUN" -np 2 --host "$HOST_A,$HOST_B" --mca plm_rsh_agent "$agent"
     --mca btl self,tcp --mca btl_tcp_if_include "$IFACE" --mca oob_tcp_if_include "$IFACE")
in_a() { timeout --kill-after=5 120 ip netns exec "$NS_A" "$@"; }

# Where the two ranks run: each reports the address of its own namespace.
echo "# ranks' addresses"
where="$(in_a "${mpi[@]}" ip -o -4 addr show dev "$IFACE" 2>&1)" || fail "could not start ranks in both namespaces: $where"
echo "$where"
grep -q "$HOST_A/24" <<<"$where" && grep -q "$HOST_B/24" <<<"$where" ||
  fail "expected one rank at $HOST_A and one at $HOST_B"

if [ "${1:-}" = probe ]; then  # `ringattn probe` over the TCP link: print what it measures
  shift
  echo "# ringattn probe over TCP between the namespaces"
  echo "\$ ${mpi[*]} $BIN probe $*"
  in_a "${mpi[@]}" "$BIN" probe "$@" || fail "ringattn probe exited $?"
  exit 0
fi

echo "# ringattn over TCP between the namespaces"
# For benchmarks over the TCP transport: RINGATTN_NETNS_SHAPE replaces the shape options,
# RINGATTN_NETNS_NO_CHECK=1 runs without --check, RINGATTN_NETNS_REPORT=FILE keeps the report.
read -r -a shape <<<"${RINGATTN_NETNS_SHAPE:---seq 2048 --batch 1 --heads 4 --kv-heads 2 --head-dim 64 --causal}"
check_opt=(--check)
[ "${RINGATTN_NETNS_NO_CHECK:-0}" = 1 ] && check_opt=()
args=(run "${shape[@]}" "${check_opt[@]}" --timeout 60 --report "$work/report.json" "$@")
echo "\$ ${mpi[*]} $BIN ${args[*]}"
set +e
out="$(in_a "${mpi[@]}" "$BIN" "${args[@]}" 2>&1)"
rc=$?
set -e
echo "$out"
[ "$rc" -eq 0 ] || fail "ringattn exited $rc"
[ -z "${RINGATTN_NETNS_REPORT:-}" ] || cp "$work/report.json" "$RINGATTN_NETNS_REPORT"
[ "${#check_opt[@]}" -eq 0 ] || grep -q "PASSED" <<<"$out" || fail "no PASSED in the summary"
echo "PASSED: 2 ranks in 2 network namespaces, TCP over veth ($HOST_A, $HOST_B), checked against the reference"
