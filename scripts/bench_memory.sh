#!/usr/bin/env bash
# Per-rank memory against the ring's byte budget (a benchmark, not a test). Causal, H=1, D=64,
# f32 on N=2 at S=16384 and S=65536: each rank's peak RSS (getrusage) must stay under 1 GiB and
# grow at most 4.5x while S grows 4x: resident state is O(L), never O(S^2) or O(S*L).
#   scripts/bench_memory.sh [--seqs "16384 65536"] [--ranks 2] [--layout contiguous]
set -euo pipefail
source "$(dirname "$0")/common.sh"
SEQS="16384 65536" N=2 LAYOUT=contiguous
while [ $# -gt 0 ]; do
  case "$1" in
    --seqs) SEQS=$(opt_value "$@"); shift 2 ;;
    --ranks) N=$(opt_value "$@"); shift 2 ;;
    --layout) LAYOUT=$(opt_value "$@"); shift 2 ;;
    *) echo "bench_memory.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
positive_ints --ranks "$N"
for s in $SEQS; do positive_ints --seqs "$s"; done
[ -x "$BIN" ] || build >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for S in $SEQS; do
  mpirun -np "$N" "$BIN" run --seq "$S" --heads 1 --head-dim 64 --dtype f32 --causal --layout "$LAYOUT" \
    --report "$tmp/s$S.json" >/dev/null
done
/usr/bin/python3 - "$tmp" $SEQS <<'PY'
import json, sys
d, seqs = sys.argv[1], [int(s) for s in sys.argv[2:]]
MiB = 2**20
print(f"{'S':>7} {'rank':>4} {'ring budget':>12} {'peak RSS':>10} {'RSS - budget':>13}")
peak = {}
for s in seqs:
    r = json.load(open(f"{d}/s{s}.json"))
    for x in r["ranks"]:
        m = x["memory"]
        print(f"{s:7} {x['rank']:4} {m['budget_bytes'] / MiB:10.1f} M {m['peak_rss_bytes'] / MiB:8.1f} M "
              f"{(m['peak_rss_bytes'] - m['budget_bytes']) / MiB:11.1f} M")
    peak[s] = max(x["memory"]["peak_rss_bytes"] for x in r["ranks"])
ok = all(p < 2**30 for p in peak.values())
print(f"largest peak RSS per rank: " + ", ".join(f"S={s}: {p / MiB:.1f} MiB" for s, p in peak.items()),
      "-> under 1 GiB" if ok else "-> OVER 1 GiB")
if len(seqs) >= 2:
    ratio = peak[seqs[-1]] / peak[seqs[0]]
    print(f"growth S={seqs[0]} -> S={seqs[-1]} ({seqs[-1] / seqs[0]:.0f}x positions): {ratio:.2f}x",
          "(<= 4.5x)" if ratio <= 4.5 else "(> 4.5x)")
    ok = ok and ratio <= 4.5
sys.exit(0 if ok else 1)
PY
