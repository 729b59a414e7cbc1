#!/usr/bin/env bash
# The Python binding's overhead against the command line on one shape at N=2: forward + backward
# of `ringattn run` (its report's median, slowest rank) against ringattn.attention + backward
# from Python (tests/bench/python_attention.py: the whole call, plan agreement and loading
# included; median of the slowest rank). The two are interleaved in --rounds rounds and the ratio
# is taken inside each round; the median ratio is printed. A benchmark, not a test: run it on a
# quiet machine.
#   scripts/bench_python.sh [--seq 8192] [--heads 8] [--head-dim 64] [--iters 3] [--rounds 3]
set -euo pipefail
source "$(dirname "$0")/common.sh"
SEQ=8192 HEADS=8 HEAD_DIM=64 ITERS=3 ROUNDS=3
while [ $# -gt 0 ]; do
  case "$1" in
    --seq) SEQ=$(opt_value "$@"); shift 2 ;;
    --heads) HEADS=$(opt_value "$@"); shift 2 ;;
    --head-dim) HEAD_DIM=$(opt_value "$@"); shift 2 ;;
    --iters) ITERS=$(opt_value "$@"); shift 2 ;;
    --rounds) ROUNDS=$(opt_value "$@"); shift 2 ;;
    *) echo "bench_python.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
positive_ints --seq "$SEQ" --heads "$HEADS" --head-dim "$HEAD_DIM" --iters "$ITERS" --rounds "$ROUNDS"
[ -x "$BIN" ] && [ -d "$BUILD/python/ringattn" ] || build >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "S=$SEQ H=$HEADS D=$HEAD_DIM B=1 f32 non-causal contiguous, N=2, forward + backward, median of $ITERS" \
     "after 1 warm-up; $ROUNDS rounds"
for r in $(seq 1 "$ROUNDS"); do
  mpirun -np 2 --bind-to core "$BIN" run --seq "$SEQ" --heads "$HEADS" --head-dim "$HEAD_DIM" --layout contiguous \
    --iters "$ITERS" --warmup 1 --report "$tmp/cli_$r.json" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  PYTHONPATH="$BUILD/python" mpirun -np 2 --bind-to core /usr/bin/python3 "$ROOT/tests/bench/python_attention.py" \
    --seq "$SEQ" --heads "$HEADS" --head-dim "$HEAD_DIM" --iters "$ITERS" --warmup 1 >"$tmp/py_$r.json" 2>"$tmp/err" \
    || { cat "$tmp/err" >&2; exit 1; }
  echo "  round $r/$ROUNDS done" >&2
done
/usr/bin/python3 - "$tmp" "$ROUNDS" <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
cli, py = [], []
for r in range(1, rounds + 1):
    t = json.load(open(f"{d}/cli_{r}.json"))["time"]
    cli.append(t["forward_s"] + t["backward_s"])
    py.append(json.load(open(f"{d}/py_{r}.json"))["forward_backward_s"])
ratio = [p / c for p, c in zip(py, cli)]
print(f"{'round':>5} {'CLI s':>8} {'Python s':>9} {'ratio':>7}")
for r, (c, p, x) in enumerate(zip(cli, py, ratio), 1):
    print(f"{r:5d} {c:8.3f} {p:9.3f} {x:7.4f}")
m = statistics.median(ratio)
print(f"median: CLI {statistics.median(cli):.3f} s, Python {statistics.median(py):.3f} s, "
      f"ratio {m:.4f} (overhead {100 * (m - 1):+.2f}%)")
PY
