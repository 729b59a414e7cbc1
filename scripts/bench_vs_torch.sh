#!/usr/bin/env bash
# ringattn at N=1 and N=2 against PyTorch eager (matmul + softmax + autograd, float32,
# threads = cores) on the same shape, forward + backward. A benchmark, not a test: run it on a
# quiet machine. Times are medians over --iters after a warm-up; ringattn's are the slowest rank's.
#   scripts/bench_vs_torch.sh [--seq 8192] [--heads 8] [--head-dim 64] [--iters 3] [--causal]
set -euo pipefail
source "$(dirname "$0")/common.sh"
SEQ=8192 HEADS=8 HEAD_DIM=64 ITERS=3 CAUSAL=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seq) SEQ=$2; shift 2 ;;
    --heads) HEADS=$2; shift 2 ;;
    --head-dim) HEAD_DIM=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --causal) CAUSAL="--causal"; shift ;;
    *) echo "bench_vs_torch.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || build >/dev/null
CORES=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "S=$SEQ H=$HEADS D=$HEAD_DIM f32 ${CAUSAL:-non-causal}, forward + backward, median of $ITERS; $CORES cores"
/usr/bin/python3 "$ROOT/tests/bench/torch_attention.py" --seq "$SEQ" --heads "$HEADS" --head-dim "$HEAD_DIM" \
  --threads "$CORES" --iters "$ITERS" $CAUSAL >"$tmp/torch.json"
for N in 1 2; do
  mpirun -np "$N" --bind-to core "$BIN" run --seq "$SEQ" --heads "$HEADS" --head-dim "$HEAD_DIM" $CAUSAL \
    --layout zigzag --iters "$ITERS" --warmup 1 --report "$tmp/n$N.json" >/dev/null
done
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
t = json.load(open(f"{d}/torch.json"))
flops = t["flops_forward"] + t["flops_backward"]
rows = [(f"PyTorch {t['torch']} eager, {t['threads']} threads", t["forward_s"], t["backward_s"], None)]
for n in (1, 2):
    r = json.load(open(f"{d}/n{n}.json"))
    slow = max(r["ranks"], key=lambda x: x["time"]["forward_s"] + x["time"]["backward_s"])
    wait = slow["time"]["wait_s"] / (slow["time"]["forward_s"] + slow["time"]["backward_s"])
    rows.append((f"ringattn N={n}", r["time"]["forward_s"], r["time"]["backward_s"], wait))
base = rows[0][1] + rows[0][2]
n1 = rows[1][1] + rows[1][2]
print(f"{'':34} {'forward s':>10} {'backward s':>11} {'total s':>8} {'GFLOP/s':>8} {'vs torch':>9} {'vs N=1':>7} {'wait':>7}")
for name, f, b, w in rows:
    tot = f + b
    print(f"{name:34} {f:10.3f} {b:11.3f} {tot:8.3f} {flops / tot * 1e-9:8.1f} {base / tot:8.2f}x "
          f"{n1 / tot:6.2f}x {'' if w is None else f'{100 * w:6.2f}%'}")
PY
