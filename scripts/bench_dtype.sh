#!/usr/bin/env bash
# bf16 against f32 storage, side by side: forward + backward at N=2 over shared memory, and over
# TCP between two network namespaces (scripts/netns_test.sh), where the bytes cost.
#
#   bash scripts/bench_dtype.sh [--rounds R] [--shm-shape "OPTS"] [--tcp-shape "OPTS"]
#
# Each round runs bf16 then f32 (alternating, so drift of the machine hits both alike); the
# figures are medians over the rounds of the slowest rank's forward + backward (median of the
# job's --iters). Prints a table and writes bench_dtype.csv in the current directory.
set -euo pipefail
source "$(dirname "$0")/common.sh"
rounds=5
shm_shape="--seq 8192 --heads 4 --kv-heads 2 --head-dim 64 --causal --layout zigzag"
tcp_shape="--seq 1024 --heads 2 --kv-heads 2 --head-dim 64"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$(opt_value "$@"); shift 2 ;;
    --shm-shape) shm_shape=$(opt_value "$@"); shift 2 ;;
    --tcp-shape) tcp_shape=$(opt_value "$@"); shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "bench_dtype.sh: unknown option $1 (expected --rounds, --shm-shape, --tcp-shape)" >&2; exit 2 ;;
  esac
done
positive_ints --rounds "$rounds"
[ -x "$BIN" ] || build
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
csv=bench_dtype.csv
echo "transport,dtype,round,forward_s,backward_s,total_s,recv_bytes_rank0,max_wait_fraction" >"$csv"

row() {  # row TRANSPORT DTYPE ROUND REPORT
  /usr/bin/python3 - "$@" <<'PY' >>"$csv"
import json, sys
t, dt, rnd, path = sys.argv[1:]
r = json.load(open(path))
f, b = r["time"]["forward_s"], r["time"]["backward_s"]
w = max(x["time"]["wait_s"] / max(x["time"]["forward_s"] + x["time"]["backward_s"], 1e-12) for x in r["ranks"])
print(f"{t},{dt},{rnd},{f:.6f},{b:.6f},{f + b:.6f},{r['ranks'][0]['ledger']['recv_bytes']},{w:.4f}")
PY
}

for i in $(seq 1 "$rounds"); do
  for dt in bf16 f32; do
    echo "round $i/$rounds: shared memory, $dt" >&2
    # shellcheck disable=SC2086
    mpirun -np 2 --bind-to core "$BIN" run $shm_shape --dtype "$dt" --iters 3 --report "$work/r.json" >/dev/null
    row shm "$dt" "$i" "$work/r.json"
    echo "round $i/$rounds: TCP between two namespaces, $dt" >&2
    if RINGATTN_NETNS_SHAPE="$tcp_shape" RINGATTN_NETNS_NO_CHECK=1 RINGATTN_NETNS_REPORT="$work/t.json" \
        bash "$ROOT/scripts/netns_test.sh" "$BIN" --dtype "$dt" --iters 5 >"$work/netns.log" 2>&1; then
      row tcp "$dt" "$i" "$work/t.json"
    else
      echo "  (TCP run skipped or failed: $(tail -1 "$work/netns.log"))" >&2
    fi
  done
done

/usr/bin/python3 - "$csv" "$shm_shape" "$tcp_shape" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
shapes = {"shm": sys.argv[2], "tcp": sys.argv[3]}
print("| transport | shape | dtype | forward s | backward s | total s | bf16 / f32 | received by rank 0 | max wait % |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for t in ("shm", "tcp"):
    med = {}
    for dt in ("bf16", "f32"):
        rs = [r for r in rows if r["transport"] == t and r["dtype"] == dt]
        if not rs:
            continue
        m = {k: statistics.median(float(r[k]) for r in rs) for k in ("forward_s", "backward_s", "total_s",
                                                                      "max_wait_fraction")}
        m["bytes"] = int(rs[0]["recv_bytes_rank0"])
        med[dt] = m
    for dt, m in med.items():
        ratio = f"{m['total_s'] / med['f32']['total_s']:.3f}" if "f32" in med else ""
        name = "shared memory" if t == "shm" else "TCP, two namespaces"
        print(f"| {name} | `{shapes[t]}` | {dt} | {m['forward_s']:.4f} | {m['backward_s']:.4f} | "
              f"{m['total_s']:.4f} | {ratio if dt == 'bf16' else '1.000'} | {m['bytes'] / 2**20:.2f} MiB | "
              f"{100 * m['max_wait_fraction']:.1f} |")
PY
