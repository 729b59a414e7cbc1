#!/usr/bin/python3
"""`ringattn run --dtype bf16 --precision bf16` against PyTorch (one case per invocation).

With --precision bf16 the kernels round P and dS to bf16 before the products P V, P^T dO, dS K and
dS^T Q, as FlashAttention does. FlashAttention's rule for such a kernel: its error against a float64
reference is at most twice the error of the framework's own attention in the same 16-bit type. So,
on the same bf16-rounded inputs (q, k, v, dout: seeded standard normals, rounded once by torch):

  ref    float64 autograd (torch_check.reference);
  torch  PyTorch's eager bf16 attention: softmax((q k^T) * scale, masked) v with bfloat16 tensors,
         autograd for dq, dk, dv;
  ours   ringattn at each N, strategy as given, --precision bf16;

error = max|x - ref| / max|ref| per tensor, and for o, dq, dk, dv: error(ours) <= 2 x error(torch).
The run with --precision f32 on the same inputs must give other o, dq, dk and dv: equal bits would
mean the option never reached the kernels. Exit 0 when every check holds, 1 otherwise.

  precision_check.py --binary build/ringattn --np 1,2,3 --seq 48 --heads 4 --kv-heads 2 --causal
"""

import argparse
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_check import int_list, load_outputs, reference, run_mpi, visibility_mask  # noqa: E402

CHECKED = ("o", "dq", "dk", "dv")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", required=True)
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--np", type=int_list, required=True, dest="nranks_list", help="N, a list: one run each")
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--strategy", default="ring")
    p.add_argument("--ulysses-degree", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=240, help="seconds per mpirun")
    a = p.parse_args()
    a.kv_heads = a.kv_heads or a.heads
    return a


def torch_bf16_attention(used, mask, scale):
    """PyTorch's own eager attention in bfloat16: o, dq, dk, dv as float64 numpy."""
    q, k, v = (torch.tensor(used[n]).to(torch.bfloat16).requires_grad_() for n in ("q", "k", "v"))
    dout = torch.tensor(used["dout"]).to(torch.bfloat16)
    g = q.shape[2] // k.shape[2]
    qh = q.transpose(1, 2)                                    # [B, H, S, D]
    kh = k.repeat_interleave(g, dim=2).transpose(1, 2)
    vh = v.repeat_interleave(g, dim=2).transpose(1, 2)
    scores = (qh @ kh.transpose(-1, -2)) * scale
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    o = (p @ vh).transpose(1, 2)                              # [B, S, H, D]
    o.backward(dout)
    return {"o": o.detach().double().numpy(), "dq": q.grad.double().numpy(), "dk": k.grad.double().numpy(),
            "dv": v.grad.double().numpy()}


def error(x, ref):
    return float(np.max(np.abs(np.asarray(x, np.float64) - ref)) / np.max(np.abs(ref)))


def run(a, n, precision, in_dir, out_dir):
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    cmd = [a.mpirun, "-np", str(n), "--oversubscribe", os.path.abspath(a.binary), "run", "--inputs", in_dir,
           "--out", out_dir, "--dtype", "bf16", "--precision", precision, "--strategy", a.strategy]
    if a.causal:
        cmd.append("--causal")
    if a.ulysses_degree is not None:
        cmd += ["--ulysses-degree", str(a.ulysses_degree)]
    print("run:", " ".join(cmd), flush=True)
    ok, msg = run_mpi(cmd, a.timeout)
    if not ok:
        raise RuntimeError(f"ringattn run failed at N={n} with --precision {precision}: {msg}")
    return load_outputs(out_dir, CHECKED)


def main():
    a = parse_args()
    rng = np.random.default_rng(a.seed)
    b, s, h, hkv, d = a.batch, a.seq, a.heads, a.kv_heads, a.head_dim
    shapes = {"q": (b, s, h, d), "k": (b, s, hkv, d), "v": (b, s, hkv, d), "dout": (b, s, h, d)}
    scratch = tempfile.mkdtemp(prefix="precision_check_")
    in_dir, out_dir = os.path.join(scratch, "in"), os.path.join(scratch, "out")
    os.makedirs(in_dir)
    used = {}
    for name, shape in shapes.items():
        x = rng.standard_normal(shape)
        np.save(os.path.join(in_dir, name + ".npy"), x)  # float64: ringattn rounds to bf16 on load, as torch does
        used[name] = torch.from_numpy(x).to(torch.bfloat16).double().numpy()
    scale = 1.0 / math.sqrt(d)
    mask = visibility_mask(s, a.causal)
    ref = reference(used["q"], used["k"], used["v"], used["dout"], mask, scale)
    bound = {name: 2 * error(x, ref[name]) for name, x in torch_bf16_attention(used, mask, scale).items()}
    print("PyTorch bf16 eager attention vs float64: " +
          "  ".join(f"{name} {bound[name] / 2:.3e}" for name in CHECKED), flush=True)

    ok = True
    try:
        for n in a.nranks_list:
            ours, exact = run(a, n, "bf16", in_dir, out_dir), run(a, n, "f32", in_dir, out_dir)
            print(f"N={n}:")
            for name in CHECKED:
                e, e32 = error(ours[name], ref[name]), error(exact[name], ref[name])
                good = e <= bound[name]  # NaN fails
                print(f"  {'ok  ' if good else 'FAIL'} {name}: precision bf16 error {e:.3e} (at most {bound[name]:.3e},"
                      f" 2x PyTorch bf16's); precision f32 {e32:.3e}")
                ok &= good
            same = [name for name in CHECKED if np.array_equal(ours[name], exact[name])]
            if same:
                print(f"  FAIL --precision bf16 gave the same {', '.join(same)} as --precision f32, bit for bit: "
                      f"P and dS were not rounded to bf16")
                ok = False
    except (RuntimeError, OSError, ValueError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        ok = False
    print("PASS" if ok else f"FAIL (files kept in {scratch})")
    if ok:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
