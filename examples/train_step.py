#!/usr/bin/python3
"""A tiny causal attention layer trained for a few steps with its sequence sharded over MPI ranks.

    PYTHONPATH=build/python mpirun -np 2 python3 examples/train_step.py
    python3 examples/train_step.py --reference     # the same model on one process, plain PyTorch

The layer: q = x Wq, k = x Wk, v = x Wv (H query heads, HKV key/value heads of size D), RoPE on
q and k at their global positions, causal attention, y = O Wo; the loss is the mean squared error
against a fixed target over the whole sequence. Every rank holds the zigzag shard of x and of the
target (ringattn.positions), the same weights (one seed), and runs ringattn.attention on its
shard; the loss is the sum of the ranks' parts, and the weight gradients are summed over the ranks
(an all-reduce), so every rank takes the same SGD step. --reference trains the same model on the
whole sequence with torch's own attention; the per-step losses agree to rounding.
"""

import argparse
import json
import math

import torch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seq", type=int, default=32, help="S, over all ranks")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--model-dim", type=int, default=16)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=8)
    p.add_argument("--rope", type=float, default=10000.0, help="RoPE theta")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--dtype", choices=["f32", "f64"], default="f64")
    p.add_argument("--reference", action="store_true", help="one process, plain PyTorch attention")
    p.add_argument("--losses", default=None, help="write the per-step losses here (JSON list)")
    return p.parse_args()


def init(a, dtype):
    """Weights, input and target, identical on every rank (one seed)."""
    g = torch.Generator().manual_seed(7)
    M, H, HKV, D = a.model_dim, a.heads, a.kv_heads, a.head_dim
    def w(rows, cols):
        return (torch.randn(rows, cols, generator=g, dtype=torch.float64) / math.sqrt(rows)).to(dtype)
    weights = {"wq": w(M, H * D), "wk": w(M, HKV * D), "wv": w(M, HKV * D), "wo": w(H * D, M)}
    x = torch.randn(a.batch, a.seq, M, generator=g, dtype=torch.float64).to(dtype)
    target = torch.randn(a.batch, a.seq, M, generator=g, dtype=torch.float64).to(dtype)
    return {k: t.requires_grad_(True) for k, t in weights.items()}, x, target


def rope(x, pos, theta):
    """Rotate-half RoPE of x [B, L, heads, D] at global positions pos [L]."""
    D = x.shape[-1]
    half = D // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / D)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang).to(x.dtype)[None, :, None, :], torch.sin(ang).to(x.dtype)[None, :, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def torch_attention(q, k, v):
    """Causal attention of whole tensors q [B, S, H, D], k, v [B, S, HKV, D] in plain PyTorch."""
    S, H, D = q.shape[1], q.shape[2], q.shape[3]
    G = H // k.shape[2]
    k, v = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(D)
    s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), v)


def layer(w, x, a, attend):
    B, L, _ = x.shape
    q = (x @ w["wq"]).view(B, L, a.heads, a.head_dim)
    k = (x @ w["wk"]).view(B, L, a.kv_heads, a.head_dim)
    v = (x @ w["wv"]).view(B, L, a.kv_heads, a.head_dim)
    return attend(q, k, v).reshape(B, L, a.heads * a.head_dim) @ w["wo"]


def train(a):
    dtype = torch.float64 if a.dtype == "f64" else torch.float32
    w, x, target = init(a, dtype)
    numel = target.numel()  # the loss is a mean over the whole sequence, on every rank
    if a.reference:
        comm, rank = None, 0
        pos = torch.arange(a.seq)
        def attend(q, k, v):
            return torch_attention(rope(q, pos, a.rope), rope(k, pos, a.rope), v)
    else:
        from mpi4py import MPI
        import ringattn
        comm, rank = MPI.COMM_WORLD, MPI.COMM_WORLD.rank
        pos = torch.from_numpy(ringattn.positions(a.seq, comm.size, rank, layout="zigzag"))
        x, target = x[:, pos], target[:, pos]  # this rank's shard
        def attend(q, k, v):
            return ringattn.attention(q, k, v, seq_len=a.seq, causal=True, layout="zigzag",
                                      rope=a.rope, comm=comm)
    losses = []
    for step in range(a.steps):
        for t in w.values():
            t.grad = None
        loss = ((layer(w, x, a, attend) - target) ** 2).sum() / numel  # this rank's part
        loss.backward()
        value = loss.item()
        if comm is not None:  # the whole loss and the whole gradients: sums over the ranks
            value = comm.allreduce(value)
            for t in w.values():
                comm.Allreduce(MPI.IN_PLACE, t.grad.numpy(), op=MPI.SUM)
        with torch.no_grad():
            for t in w.values():
                t -= a.lr * t.grad
        losses.append(value)
        if rank == 0:
            print(f"step {step}  loss {value:.15f}", flush=True)
    if rank == 0 and a.losses:
        with open(a.losses, "w") as f:
            json.dump(losses, f)
    return losses


if __name__ == "__main__":
    torch.set_num_threads(1)
    train(parse_args())
