"""ringattn: attention over a sequence sharded across MPI ranks, as a differentiable PyTorch op.

Every rank of the communicator calls the same function at the same time with its own shard:

    from mpi4py import MPI
    import ringattn
    pos = ringattn.positions(S, comm.size, comm.rank, layout="zigzag")   # the rank's positions
    o = ringattn.attention(q, k, v, seq_len=S, causal=True, layout="zigzag", comm=comm)
    o.sum().backward()                                                   # fills q.grad, k.grad, v.grad

Shapes (L = len(pos)): q [B, L, H, D]; k, v [B, L, HKV, D]; O [B, L, H, D]; LSE [B, H, L].
q, k, v are CPU tensors of one dtype: float32, float64, bfloat16 or float16. O and LSE are in
float64 for float64 inputs and float32 otherwise (16-bit storage computes in float32); q.grad,
k.grad, v.grad come in the inputs' dtype, as for any torch op. Contiguous tensors are read in
place; others are made contiguous first.

A bad argument on any rank raises ringattn.InputError (a ValueError) with a one-line message on
every rank of the communicator, so no rank is left waiting for the others.
"""

import numbers

import torch
from mpi4py import MPI

from ._ringattn import Call as _Call
from ._ringattn import InputError, RuntimeFailure
from ._ringattn import positions as _positions

__all__ = ["positions", "attention", "attention_lse", "InputError", "RuntimeFailure"]
InputError.__module__ = RuntimeFailure.__module__ = "ringattn"  # ringattn.InputError in tracebacks

_TORCH_NAME = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
               torch.float16: "float16"}
# storage dtype -> what O, LSE and the gradients are computed in
_ACCUM = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.float32, "f16": torch.float32}


def positions(seq_len, ranks, rank, layout="auto", partition=None, *, causal=None, window=None):
    """The global positions `rank` of `ranks` owns under `layout`: an increasing int64 array.

    layout: "auto" (attention()'s default: zigzag for a causal mask without a window or a
    partition, contiguous otherwise; give the same `causal` and `window` as to attention()),
    "contiguous" (consecutive ranges; balanced, or `partition` = one size per rank), "striped"
    (p mod ranks) or "zigzag" (2*ranks chunks; rank r owns chunks r and 2*ranks-1-r).
    """
    if layout == "auto" and causal is None:
        raise InputError("positions: layout 'auto' depends on the mask: give causal= (and window=) as to "
                         "attention(), or name the layout")
    return _positions(_int_or_none("seq_len", seq_len), _int_or_none("ranks", ranks),
                      _int_or_none("rank", rank), str(layout), _int_list("partition", partition),
                      bool(causal), _int_or_none("window", window))


def _describe(name, t):
    """(shape, dtype name, error) of one input, checked on this rank alone."""
    if not isinstance(t, torch.Tensor):
        return [], "?", f"{name}: a {type(t).__name__}, not a torch.Tensor"
    if t.device.type != "cpu":
        return list(t.shape), "?", f"{name}: tensor on {t.device} (expected a CPU tensor)"
    return list(t.shape), _TORCH_NAME.get(t.dtype, str(t.dtype).replace("torch.", "")), ""


def _int_or_none(name, x, low=None):
    """x as an int (None stays None); `low` bounds arguments the plan does not check itself."""
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise ValueError(f"{name}: {x!r} is not an integer")
    if low is not None and int(x) < low:
        raise ValueError(f"{name}: {int(x)} is not >= {low} (expected an integer >= {low}, or None)")
    return int(x)


def _int_list(name, xs):
    if xs is None:
        return []
    try:
        out = [int(n) for n in xs]
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {xs!r} is not a list of integers")
    return out


def _float_or_none(name, x):
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise ValueError(f"{name}: {x!r} is not a number")
    return float(x)


def _plan(q, k, v, seq_len, causal, window, doc_lens, layout, partition, scale, rope, strategy,
          ulysses_degree, comm):
    """The call's plan, agreed on by every rank (collective over `comm`)."""
    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):  # no communicator to agree on: this rank alone raises
        raise TypeError(f"comm: a {type(comm).__name__}, not an mpi4py communicator")
    shapes, dtypes, error = [], [], ""
    for name, t in (("q", q), ("k", k), ("v", v)):
        s, d, e = _describe(name, t)
        shapes.append(s)
        dtypes.append(d)
        error = error or e
    # Argument errors are this rank's own until the ranks agree: nothing raises before that.
    args = dict(seq_len=1, window=None, doc_lens=[], layout="auto", partition=[], scale=None,
                rope=None, strategy="ring", ulysses_degree=None)
    try:
        if seq_len is None:
            raise ValueError("seq_len: needed (the total sequence length S over all ranks)")
        args["seq_len"] = _int_or_none("seq_len", seq_len)
        args["window"] = _int_or_none("window", window)
        args["doc_lens"] = _int_list("doc_lens", doc_lens)
        args["partition"] = _int_list("partition", partition)
        args["scale"] = _float_or_none("scale", scale)
        args["rope"] = _float_or_none("rope", rope)
        args["ulysses_degree"] = _int_or_none("ulysses_degree", ulysses_degree)
        if not isinstance(layout, str) or not isinstance(strategy, str):
            raise ValueError(f"layout, strategy: {layout!r}, {strategy!r} are not names")
        args["layout"], args["strategy"] = layout, strategy
    except ValueError as e:
        error = error or str(e)
    if error:
        shapes = [[], [], []]  # checked no further
    return _Call(comm, args["seq_len"], shapes[0], shapes[1], shapes[2], dtypes, error, bool(causal),
                 args["window"], args["doc_lens"], args["layout"], args["partition"], args["scale"],
                 args["rope"], args["strategy"], args["ulysses_degree"])


def _contiguous(t):
    t = t.detach()
    return t if t.is_contiguous() else t.contiguous()


class _AttentionFunction(torch.autograd.Function):
    """O, LSE of this rank's shard; the backward runs the distributed backward (collective)."""

    @staticmethod
    def forward(ctx, q, k, v, call):
        qc, kc, vc = _contiguous(q), _contiguous(k), _contiguous(v)
        B, L, H, D = qc.shape
        acc = _ACCUM[call.dtype]
        o = torch.empty((B, L, H, D), dtype=acc)
        lse = torch.empty((B, H, L), dtype=acc)
        call.forward(qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), o.data_ptr(), lse.data_ptr())
        ctx.call = call
        ctx.meta = (q.shape, q.dtype, k.shape, k.dtype, v.dtype)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        call, (q_shape, q_dtype, kv_shape, k_dtype, v_dtype) = ctx.call, ctx.meta
        if call is None:
            raise RuntimeError("ringattn.attention: backward through the same call twice "
                               "(the distributed state is freed after the first)")
        acc = _ACCUM[call.dtype]
        do = _contiguous(do.to(q_dtype))
        dq = torch.empty(q_shape, dtype=acc)
        dk = torch.empty(kv_shape, dtype=acc)
        dv = torch.empty(kv_shape, dtype=acc)
        call.backward(do.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr())
        ctx.call = None  # frees this rank's shard copies and ring buffers
        return dq.to(q_dtype), dk.to(k_dtype), dv.to(v_dtype), None


def attention_lse(q, k, v, *, seq_len, causal=False, window=None, doc_lens=None, layout="auto",
                  partition=None, scale=None, rope=None, strategy="ring", ulysses_degree=None,
                  comm=None):
    """(O, LSE) of this rank's shard; arguments as attention(). LSE [B, H, L] (natural log) is
    not differentiable."""
    call = _plan(q, k, v, seq_len, causal, window, doc_lens, layout, partition, scale, rope, strategy,
                 ulysses_degree, comm)
    return _AttentionFunction.apply(q, k, v, call)


def attention(q, k, v, *, seq_len, causal=False, window=None, doc_lens=None, layout="auto",
              partition=None, scale=None, rope=None, strategy="ring", ulysses_degree=None, comm=None):
    """This rank's O [B, L, H, D] of softmax(scale * q k^T + mask) v over the whole sequence.

    q [B, L, H, D], k, v [B, L, HKV, D]: this rank's shard, its L positions given by
      positions(seq_len, comm.size, comm.rank, layout, partition, causal=causal, window=window);
      H a multiple of HKV (GQA).
    seq_len: S, the positions over all ranks.
    causal: j <= i. window: W >= 1, causal sliding window i - W < j <= i.
    doc_lens: packed documents (lengths summing to S); attention stays within each.
    layout: "auto" (zigzag for a causal mask without a window or partition, contiguous otherwise;
      the command line's default), "contiguous" (with `partition`: one size per rank), "striped" or
      "zigzag".
    scale: default 1/sqrt(D). rope: theta (e.g. 10000.0) to rotate q and k at their global
      positions before attending (rotate-half RoPE; gradients are with respect to q, k as given).
    strategy: "ring" (no rule on the shape), "ulysses" (H % N == 0) or "usp" with ulysses_degree U
      (ranks per all-to-all group; N % U == 0, H % U == 0).
    comm: an mpi4py communicator (default MPI.COMM_WORLD); every rank of it must call.
    O is differentiable: its backward runs the distributed backward (collective over comm).
    """
    o, _ = attention_lse(q, k, v, seq_len=seq_len, causal=causal, window=window, doc_lens=doc_lens,
                         layout=layout, partition=partition, scale=scale, rope=rope,
                         strategy=strategy, ulysses_degree=ulysses_degree, comm=comm)
    return o


