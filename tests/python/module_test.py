#!/usr/bin/python3
"""ringattn.nn.DistributedAttention trained for a few steps against the same model on one process.

    PYTHONPATH=build/python mpirun -np N python3 tests/python/module_test.py

The model: q, k, v projections (torch.nn.Linear), DistributedAttention, an output projection; the
loss is the mean squared error against a fixed target over the whole sequence, trained with Adam.
Every rank holds its shard of x and of the target (the module's positions()), the same initial
weights (one seed), sums its projections' gradients over the ranks (the loss is a sum of the
ranks' parts) and steps. Every rank also trains the same model on the whole sequence with plain
PyTorch attention (float64, mask materialised, no code shared with ringattn). Per-step losses and
the final weights must agree within 1e-10 (relative), and the loss must fall. Cases: causal zigzag
with RoPE and GQA; a window with documents that change every step (given to forward); ulysses where
N divides the heads; learnable sinks, alone, with documents as cu_seqlens given to forward each
step, and with softcap too; a bfloat16 model (O in bfloat16, multiplied by bfloat16 weights; losses
within 5e-3 of the float64 reference on the same weights); a copy.deepcopy of the module (it shares
the communicator). Then the module's own checks: an unknown keyword raises at construction or in
forward, and a bad precision (one rank's) raises on every rank. Exit 0 only when every case passes on every rank.
"""

import copy
import math
import sys

import torch
from mpi4py import MPI

import ringattn
from ringattn.nn import DistributedAttention
from mpi_checks import visible

COMM = MPI.COMM_WORLD
RANK, N = COMM.rank, COMM.size
TOL = 1e-10


def rope_ref(x, theta):
    """Rotate-half RoPE of x [B, S, heads, D] at positions 0..S-1."""
    B, S, Hx, D = x.shape
    half = D // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / D)
    ang = torch.arange(S, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang)[None, :, None, :].to(x.dtype), torch.sin(ang)[None, :, None, :].to(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def reference_attention(q, k, v, *, seq_len, causal=False, window=None, doc_lens=None, cu_seqlens=None,
                        scale=None, softcap=None, rope=None, sinks=None, **_):
    """Whole-sequence attention in plain PyTorch: q [B, S, H, D], k, v [B, S, HKV, D]."""
    B, S, H, D = q.shape
    G = H // k.shape[2]
    if rope is not None:
        q, k = rope_ref(q, rope), rope_ref(k, rope)
    k, v = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * (1 / math.sqrt(D) if scale is None else scale)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if cu_seqlens is not None:  # flash-attn's offsets: the documents are their differences
        doc_lens = torch.diff(torch.as_tensor(cu_seqlens)).tolist()
    s = s.masked_fill(~visible(S, causal, window, doc_lens), float("-inf"))
    if sinks is not None:  # one more logit per head in every row's denominator, attending to nothing
        s = torch.cat([s, sinks.to(s.dtype)[None, :, None, None].expand(B, H, S, 1)], dim=-1)
        return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1)[..., :S], v)
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), v)


class Model(torch.nn.Module):
    def __init__(self, attend, M, H, HKV, D):
        super().__init__()
        self.H, self.HKV, self.D = H, HKV, D
        self.wq, self.wk = torch.nn.Linear(M, H * D, bias=False), torch.nn.Linear(M, HKV * D, bias=False)
        self.wv, self.wo = torch.nn.Linear(M, HKV * D, bias=False), torch.nn.Linear(H * D, M, bias=False)
        self.attend = attend

    def forward(self, x, **kw):
        B, L, _ = x.shape
        q = self.wq(x).view(B, L, self.H, self.D)
        k = self.wk(x).view(B, L, self.HKV, self.D)
        v = self.wv(x).view(B, L, self.HKV, self.D)
        return self.wo(self.attend(q, k, v, **kw).reshape(B, L, self.H * self.D))


def train(name, *, S=24, B=2, M=12, H=4, HKV=2, D=8, steps=4, docs_per_step=None, dtype=torch.float64,
          tol=TOL, deepcopy=False, cu_seqlens_per_step=None, **options):
    g = torch.Generator().manual_seed(len(name))
    x = torch.randn(B, S, M, generator=g, dtype=torch.float64)
    target = torch.randn(B, S, M, generator=g, dtype=torch.float64)
    sinks0 = options.pop("sinks", None)
    attn = DistributedAttention(S, **options, **({} if sinks0 is None else {"sinks": sinks0}))
    if deepcopy:  # the copy trains, over the same communicator (the original's sinks stay as they were)
        attn = copy.deepcopy(attn)
        assert attn.comm is (options.get("comm") or MPI.COMM_WORLD)
    dist = Model(attn, M, H, HKV, D).to(torch.float64)
    ref = Model(lambda q, k, v, **kw: reference_attention(q, k, v, seq_len=S, **{**options, **kw},
                                                          sinks=ref_sinks), M, H, HKV, D).to(torch.float64)
    ref_sinks = None if sinks0 is None else torch.nn.Parameter(sinks0.clone().double())
    with torch.no_grad():
        for n, p in dist.named_parameters():  # one seed on every rank; the sinks start as given
            if n != "attend.sinks":
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(p.shape[-1]))
        dist = dist.to(dtype)  # the reference starts from the same (rounded) weights and inputs
        ref.load_state_dict({n: t.double() for n, t in dist.state_dict().items() if n != "attend.sinks"})
        x, target = x.to(dtype).double(), target.to(dtype).double()
    ref_model = ref
    pos = torch.from_numpy(attn.positions())
    assert (attn.positions() == ringattn.positions(S, N, RANK, options.get("layout", "auto"),
                                                   causal=options.get("causal", False),
                                                   window=options.get("window"))).all()
    xs, ts = x[:, pos].to(dtype), target[:, pos].to(dtype)
    ref_params = list(ref_model.parameters()) + ([ref_sinks] if ref_sinks is not None else [])
    opt_d, opt_r = torch.optim.Adam(dist.parameters(), lr=0.02), torch.optim.Adam(ref_params, lr=0.02)
    projections = [p for n, p in dist.named_parameters() if n != "attend.sinks"]
    worst, losses_d, losses_r = 0.0, [], []
    for step in range(steps):
        kw = {}
        if docs_per_step:  # documents of this batch, given to forward
            kw["doc_lens"] = docs_per_step[step % len(docs_per_step)]
        if cu_seqlens_per_step:
            kw["cu_seqlens"] = torch.tensor(cu_seqlens_per_step[step % len(cu_seqlens_per_step)], dtype=torch.int32)
        opt_d.zero_grad()
        y = dist(xs, **kw)
        if dtype != torch.float64:
            assert y.dtype == dtype, y.dtype
        loss = ((y.double() - ts.double()) ** 2).sum() / target.numel()  # this rank's part
        loss.backward()
        for p in projections:  # the whole gradient: the sum of the ranks' parts (sinks' already is)
            p.grad = torch.from_numpy(COMM.allreduce(p.grad.double().numpy(), op=MPI.SUM)).to(p.dtype)
        opt_d.step()
        losses_d.append(COMM.allreduce(loss.item()))
        opt_r.zero_grad()
        loss_r = ((ref_model(x, **kw) - target) ** 2).sum() / target.numel()
        loss_r.backward()
        opt_r.step()
        losses_r.append(loss_r.item())
        worst = max(worst, abs(losses_d[-1] - losses_r[-1]) / abs(losses_r[-1]))
    if dtype == torch.float64:  # the trained weights too
        for (n, p), r in zip(dist.named_parameters(), ref_params):
            worst = max(worst, ((p - r).abs().max() / r.abs().max()).item())
    worst = COMM.allreduce(worst, op=MPI.MAX)
    ok = worst <= tol and losses_d[-1] < losses_d[0]
    if RANK == 0:
        print(f"{'ok ' if ok else 'BAD'} N={N} {name:<44} loss {losses_d[0]:.6f} -> {losses_d[-1]:.6f}, "
              f"max rel diff {worst:.2e} (tol {tol:.0e})", flush=True)
    return ok


def raises(name, fn, needle):
    try:
        fn()
        msg = None
    except ringattn.InputError as e:
        msg = str(e)
    ok = COMM.allreduce(int(msg is not None and needle in msg), op=MPI.MIN) == 1
    if RANK == 0:
        print(f"{'ok ' if ok else 'BAD'} N={N} raises: {name}: {msg!r}", flush=True)
    return ok


def main():
    torch.set_num_threads(1)
    results = [
        train("causal zigzag rope gqa", causal=True, layout="zigzag", rope=10000.0, comm=COMM),
        train("window 5, documents per step (forward's)", S=22, window=5, layout="contiguous",
              docs_per_step=[[10, 12], [22], [3, 7, 12]]),
        train("striped full, scale 0.25", S=21, layout="striped", scale=0.25),
        train("bfloat16 model, causal", causal=True, dtype=torch.bfloat16, tol=5e-3),
    ]
    if 4 % N == 0:
        results.append(train("ulysses causal", causal=True, strategy="ulysses", HKV=4))
    results += [
        train("learnable sinks, causal", causal=True, sinks=torch.tensor([0.5, -1.0, 0.0, 2.0])),
        train("sinks, cu_seqlens per step (forward's)", S=22, layout="zigzag", causal=True,
              sinks=torch.tensor([1.0, 0.0, -0.5, 0.25]), cu_seqlens_per_step=[[0, 9, 22], [0, 22], [0, 4, 5, 22]]),
        train("softcap 2, sinks, cu_seqlens per step (forward's)", S=22, softcap=2.0, layout="zigzag", causal=True,
              sinks=torch.tensor([1.0, 0.0, -0.5, 0.25]), cu_seqlens_per_step=[[0, 9, 22], [0, 22], [0, 4, 5, 22]]),
    ]
    results.append(train("a deep copy of the module, causal", causal=True, comm=COMM, deepcopy=True))
    results += [
        raises("unknown keyword", lambda: DistributedAttention(16, casual=True), "unknown keyword 'casual'"),
        raises("unknown forward keyword", lambda: DistributedAttention(16)(*(torch.zeros(1, 1, 1, 1),) * 3,
                                                                          widow=3), "unknown keyword 'widow'"),
        raises("precision bf16 with float32 tensors",
               lambda: DistributedAttention(16, precision="bf16")(*(torch.zeros(1, 1, 1, 1),) * 3),
               "precision bf16 needs dtype bf16"),
        # one rank's bad value: every rank raises it
        raises("precision torch.float16 on rank 0 only",
               lambda: DistributedAttention(16, precision=torch.float16 if RANK == 0 else torch.bfloat16)(
                   *(torch.zeros(1, 1, 1, 1, dtype=torch.bfloat16),) * 3),
               "precision: torch.float16 is not a precision"),
    ]
    if N > 1:  # window= makes layout "auto" contiguous where the causal module's is zigzag
        m = DistributedAttention(16, causal=True)
        L = len(m.positions())
        results.append(raises("window= that moves the positions", lambda: m(*(torch.zeros(1, L, 1, 1),) * 3, window=3),
                              "window=3 gives rank"))
    ok = all(results)
    if RANK == 0:
        print("all cases passed" if ok else "failures", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
