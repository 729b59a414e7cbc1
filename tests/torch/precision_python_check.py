#!/usr/bin/python3
"""precision= through the Python package under mpirun: it reaches the kernels, and a plan made for
one precision is never reused for the other.

    PYTHONPATH=BUILD/python /usr/bin/python3 tests/torch/precision_python_check.py --mpirun mpiexec --np 1,2,3

The driver runs `mpirun -np N python3 precision_python_check.py --worker` for every N. Every rank
builds the whole bfloat16 q, k, v, dO from one seed and calls ringattn.attention on its shard with
precision "f32", "bf16", torch.bfloat16 and "f32" again, the other arguments the same (so the binding's
plan cache would hand back the previous call's plan if it ignored the precision), for ring, allgather
and ulysses (where N divides H = 4), causal, GQA. On every rank:

- "bf16" gives another O than "f32" (float32 out_dtype): P was rounded;
- torch.bfloat16 gives the bits of "bf16", and the second "f32" the bits of the first;
- O and dq, dk, dv of "bf16" are within --check's tolerance of PyTorch's float64 autograd on the same
  rounded inputs: 1e-2 of max|ref| (the gradients come back in bfloat16: plus 2^-8).
"""

import argparse
import math
import os
import signal
import subprocess
import sys

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from harness import MPI_ENV  # noqa: E402

sys.path.insert(0, os.path.dirname(HERE))
from torch_check import _signal_session  # noqa: E402

B, S, H, HKV, D = 2, 37, 4, 2, 32


def worker():
    import torch
    from mpi4py import MPI

    import ringattn

    comm = MPI.COMM_WORLD
    n, rank = comm.size, comm.rank
    g = torch.Generator().manual_seed(7)
    whole = {name: torch.randn(shape, generator=g, dtype=torch.float64).to(torch.bfloat16)
             for name, shape in (("q", (B, S, H, D)), ("k", (B, S, HKV, D)), ("v", (B, S, HKV, D)),
                                 ("dout", (B, S, H, D)))}
    # float64 reference on the rounded inputs
    q, k, v = (whole[x].double().requires_grad_() for x in ("q", "k", "v"))
    s = torch.einsum("bihd,bjhd->bhij", q, k.repeat_interleave(H // HKV, dim=2)) / math.sqrt(D)
    s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    o = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), v.repeat_interleave(H // HKV, dim=2))
    o.backward(whole["dout"].double())
    ref = {"o": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}

    pos = torch.as_tensor(ringattn.positions(S, n, rank, "auto", causal=True))
    ok, lines = True, []
    for strategy in ["ring", "allgather"] + (["ulysses"] if H % n == 0 else []):
        got = []
        for precision in ("f32", "bf16", torch.bfloat16, "f32"):
            qs, ks, vs = (whole[x][:, pos].clone().requires_grad_() for x in ("q", "k", "v"))
            out = ringattn.attention(qs, ks, vs, seq_len=S, causal=True, strategy=strategy, precision=precision,
                                     out_dtype=torch.float32)
            out.backward(whole["dout"][:, pos].float())
            got.append({"o": out.detach(), "dq": qs.grad, "dk": ks.grad, "dv": vs.grad})
        f32, bf16, dtype_bf16, f32_again = got
        checks = [("bf16 gives another O than f32", not torch.equal(bf16["o"], f32["o"])),
                  ("torch.bfloat16 gives the bits of bf16", all(torch.equal(dtype_bf16[x], bf16[x]) for x in ref)),
                  ("f32 after bf16 gives the bits of f32", all(torch.equal(f32_again[x], f32[x]) for x in ref))]
        for name in ref:
            r = ref[name][:, pos]
            err = float((bf16[name].double() - r).abs().max() / ref[name].abs().max())
            tol = 1e-2 + (0 if name == "o" else 2 ** -8)
            checks.append((f"{name} error {err:.2e} <= {tol:.2e}", err <= tol))
        for what, good in checks:
            lines.append(f"{'ok  ' if good else 'FAIL'} N={n} rank {rank} {strategy}: {what}")
            ok &= good
    all_ok = comm.allreduce(int(ok), op=MPI.MIN) == 1
    for r in range(n):
        if r == rank:
            print("\n".join(lines), flush=True)
        comm.Barrier()
    return 0 if all_ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help="(internal) one rank of a run")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--np", default="1,2,3")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds allowed for each mpirun")
    a = ap.parse_args()
    if a.worker:
        return worker()
    failed = 0
    for n in (int(x) for x in a.np.split(",")):
        cmd = [a.mpirun, "-np", str(n), "--oversubscribe", a.python, HERE, "--worker"]
        # its own session, so that a timeout ends mpirun and every rank it started
        p = subprocess.Popen(cmd, env=dict(os.environ, **MPI_ENV), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
        try:
            out, err = p.communicate(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            _signal_session(p.pid, signal.SIGKILL)
            p.wait()
            print(f"FAIL N={n}: timed out after {a.timeout:g} s")
            failed += 1
            continue
        print(out, end="")
        if p.returncode != 0:
            print(f"FAIL N={n}: exit {p.returncode}\n{err[-2000:]}")
            failed += 1
    print("PASS" if not failed else f"FAIL ({failed} runs)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
