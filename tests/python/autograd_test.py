#!/usr/bin/python3
"""ringattn.attention's autograd contract under mpirun: a backward that is differentiated once.

    PYTHONPATH=build/python mpirun -np N python3 tests/python/autograd_test.py

- Double backward raises: the gradient of q made with create_graph=True carries a grad_fn that
  refuses to be differentiated, so a penalty on it cannot silently add nothing to q.grad.
- retain_graph=True works: a second backward through one call gives the same gradients (the
  forward runs again, collectively); a backward after the graph was freed raises autograd's error,
  which names retain_graph.
- torch.autograd.gradcheck passes in float64 on the whole-sequence function: every rank holds the
  same global Q, K, V, takes its shard, runs ringattn.attention and gathers O. The shard's backward
  sums the gradient over the ranks and the gather's backward takes the rank's own rows, so every
  rank checks the same global Jacobian, and the ranks call forward and backward in lockstep.
Exit 0 only when every case passes on every rank.
"""

import sys
import traceback

import torch
from mpi4py import MPI

import ringattn
from mpi_checks import COMM, N, RANK, agreed

TIMEOUT = 60  # seconds: a rank left waiting ends the job instead of the test hanging


class _Shard(torch.autograd.Function):
    """The rows of the global [B, S, ...] tensor at this rank's positions; the backward is the sum
    over the ranks of each rank's gradient, scattered back to its rows."""

    @staticmethod
    def forward(ctx, x, pos):
        ctx.pos, ctx.shape = pos, x.shape
        return x[:, pos].clone()

    @staticmethod
    def backward(ctx, g):
        full = torch.zeros(ctx.shape, dtype=g.dtype)
        full[:, ctx.pos] = g
        total = torch.from_numpy(COMM.allreduce(full.numpy(), op=MPI.SUM))
        return total, None


class _Gather(torch.autograd.Function):
    """Every rank's O placed at its positions: the global [B, S, H, D]; the backward takes this
    rank's rows."""

    @staticmethod
    def forward(ctx, o, pos, S):
        ctx.pos = pos
        parts = COMM.allgather((pos, o.detach()))
        out = torch.empty((o.shape[0], S) + tuple(o.shape[2:]), dtype=o.dtype)
        for p, x in parts:
            out[:, p] = x
        return out

    @staticmethod
    def backward(ctx, g):
        return g[:, ctx.pos].contiguous(), None, None


def shard(B, S, H, HKV, D, seed, **kw):
    g = torch.Generator().manual_seed(seed)
    layout = kw.get("layout", "auto")
    pos = torch.from_numpy(ringattn.positions(S, N, RANK, layout, causal=kw.get("causal", False),
                                              window=kw.get("window")))
    full = [torch.randn(B, S, h, D, generator=g, dtype=torch.float64) for h in (H, HKV, HKV)]
    return pos, [t[:, pos].clone().requires_grad_(True) for t in full]


def double_backward_raises():
    """A gradient penalty through the gradient of q raises, whether or not the incoming gradient
    requires grad (o.sum() gives plain ones, o.pow(2).sum() gives 2 o, part of the graph)."""
    S = 10
    ok, detail = True, ""
    for name, loss in (("o.sum()", lambda o: o.sum()), ("o.pow(2).sum()", lambda o: o.pow(2).sum())):
        pos, (q, k, v) = shard(1, S, 2, 1, 4, seed=1, causal=True)
        o = ringattn.attention(q, k, v, seq_len=S, causal=True, timeout=TIMEOUT)
        gq, = torch.autograd.grad(loss(o), q, create_graph=True)
        if gq.grad_fn is None:
            ok, detail = False, f"{name}: the gradient of q has no grad_fn: a penalty on it is silently constant"
            continue
        try:  # a gradient penalty: its part through gq must raise, not add nothing
            (loss(o) + gq.pow(2).sum()).backward()
            ok, detail = False, f"{name}: backward through the gradient of q ran"
        except RuntimeError as e:
            if "differentiable once" not in str(e):
                ok, detail = False, f"{name}: " + str(e).splitlines()[0]
    # A penalty on the gradient of a weight w that makes q, k, v, differentiated for w alone: the
    # engine then walks only the nodes that lead to w, and must still reach the raising one.
    g = torch.Generator().manual_seed(3)
    w = torch.randn(4, 4, generator=g, dtype=torch.float64, requires_grad=True)
    pos = torch.from_numpy(ringattn.positions(S, N, RANK, "contiguous"))
    x = torch.randn(1, S, 2, 4, generator=g, dtype=torch.float64)[:, pos]
    for name, second in (("penalty.backward(inputs=[w])", lambda p: p.backward(inputs=[w])),
                         ("torch.autograd.grad(penalty, w)", lambda p: torch.autograd.grad(p, w))):
        o = ringattn.attention(x @ w, x @ w, x @ w, seq_len=S, layout="contiguous", timeout=TIMEOUT)
        gw, = torch.autograd.grad(o.sum(), w, create_graph=True)
        try:
            second(gw.pow(2).sum())
            ok, detail = False, f"{name}: ran without the second-order term"
        except RuntimeError as e:
            if "differentiable once" not in str(e):
                ok, detail = False, f"{name}: " + str(e).splitlines()[0]
    return agreed("double backward raises", ok, detail)


def backward_twice_with_retain_graph():
    """retain_graph=True keeps the call: a second backward gives the same gradients again (q.grad
    accumulates to twice the first), and a third, after the graph was freed, names retain_graph."""
    S = 9
    pos, (q, k, v) = shard(2, S, 4, 2, 4, seed=2)
    o = ringattn.attention(q, k, v, seq_len=S, timeout=TIMEOUT)
    o.sum().backward(retain_graph=True)
    first = [t.grad.clone() for t in (q, k, v)]
    o.sum().backward()
    ok = all(torch.equal(t.grad, 2 * g) for t, g in zip((q, k, v), first))
    detail = "the second backward doubled q.grad, k.grad, v.grad" if ok else "the second backward's gradients differ"
    try:
        o.sum().backward()
        ok, detail = False, "a third backward ran after the graph was freed"
    except RuntimeError as e:
        ok = ok and "retain_graph" in str(e)
    return agreed("backward twice with retain_graph=True", ok, detail)


def create_graph_under_a_one_unpack_hook():
    """A saved-tensor hook whose store gives each tensor back once (offloading that pops it): the
    backward unpacks the saved tensors once, with create_graph=True as without it."""
    S = 8
    pos, (q, k, v) = shard(1, S, 2, 1, 4, seed=4)
    store = {}

    def pack(t):
        store[len(store)] = t
        return len(store) - 1

    with torch.autograd.graph.saved_tensors_hooks(pack, store.pop):
        o = ringattn.attention(q, k, v, seq_len=S, layout="contiguous", timeout=TIMEOUT)
    ok, detail = True, "gradients with create_graph=True"
    try:
        torch.autograd.grad(o.sum(), (q, k, v), create_graph=True)
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        ok, detail = False, f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
    return agreed("create_graph under a one-unpack hook", ok, detail)


def second_backward_names_retain_graph():
    S = 9
    pos, (q, k, v) = shard(2, S, 4, 2, 4, seed=2)
    o = ringattn.attention(q, k, v, seq_len=S, timeout=TIMEOUT)
    o.sum().backward()
    first = q.grad.clone()
    try:
        o.sum().backward()
        ok, detail = False, "the second backward ran"
    except RuntimeError as e:
        detail = str(e).splitlines()[0][:100]
        ok = "retain_graph" in str(e)
    # The first backward's gradients are whole and the next call still works.
    ok = ok and torch.equal(q.grad, first)
    o2 = ringattn.attention(q, k, v, seq_len=S, timeout=TIMEOUT)
    o2.sum().backward()
    ok = ok and bool(torch.isfinite(q.grad).all())
    return agreed("a second backward without retain_graph names it", ok, detail)


def gradcheck_passes(name, B, S, H, HKV, D, **kw):
    g = torch.Generator().manual_seed(3)
    Q, K, V = (torch.randn(B, S, h, D, generator=g, dtype=torch.float64, requires_grad=True)
               for h in (H, HKV, HKV))
    layout = kw.get("layout", "auto")
    pos = torch.from_numpy(ringattn.positions(S, N, RANK, layout, causal=kw.get("causal", False),
                                              window=kw.get("window")))

    def global_attention(Q, K, V):
        q, k, v = (_Shard.apply(x, pos) for x in (Q, K, V))
        return _Gather.apply(ringattn.attention(q, k, v, seq_len=S, timeout=TIMEOUT, **kw), pos, S)

    try:
        ok = torch.autograd.gradcheck(global_attention, (Q, K, V), eps=1e-6, atol=1e-8, rtol=1e-6)
        detail = "Jacobians agree"
    except Exception as e:  # GradcheckError names the input and the largest difference
        ok, detail = False, f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return agreed(f"gradcheck f64: {name}", ok, detail)


def main():
    torch.set_num_threads(1)
    failed = 0
    try:
        failed += not double_backward_raises()
        failed += not backward_twice_with_retain_graph()
        failed += not second_backward_names_retain_graph()
        failed += not create_graph_under_a_one_unpack_hook()
        failed += not gradcheck_passes("B=1 S=6 H=2 HKV=1 D=3 causal", 1, 6, 2, 1, 3, causal=True)
        failed += not gradcheck_passes("B=2 S=5 H=2 HKV=2 D=2 window 2, striped", 2, 5, 2, 2, 2, causal=True,
                                       window=2, layout="striped")
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        COMM.Abort(1)  # a half-run case leaves peers in a collective
    if RANK == 0:
        print("all cases passed" if failed == 0 else f"{failed} cases failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
