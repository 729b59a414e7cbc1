"""ringattn: attention over a sequence sharded across MPI ranks, as a differentiable PyTorch op.

Every rank of the communicator calls the same function at the same time with its own shard:

    from mpi4py import MPI
    import ringattn
    pos = ringattn.positions(S, comm.size, comm.rank, layout="zigzag")   # the rank's positions
    o = ringattn.attention(q, k, v, seq_len=S, causal=True, layout="zigzag", comm=comm)
    o.sum().backward()                                                   # fills q.grad, k.grad, v.grad

Shapes (L = len(pos)): q [B, L, H, D]; k, v [B, L, HKV, D]; O [B, L, H, D]; LSE [B, H, L].
q, k, v are CPU tensors of one dtype: float32, float64, bfloat16 or float16. O is computed in
float64 for float64 inputs and float32 otherwise (16-bit storage computes in float32), then
rounded once to the inputs' dtype (or to out_dtype), as for any torch op; LSE stays float64 or
float32. q.grad, k.grad, v.grad come in the inputs' dtype. Contiguous tensors are read in
place; others are made contiguous first.

One rank's problem is every rank's error: a bad argument (of the wrong type, an unknown keyword,
a tensor ringattn cannot read) raises ringattn.InputError (a ValueError) with a one-line message on
every rank of the communicator, and a rank that fails otherwise before the ranks exchange data (out
of memory, say) raises ringattn.RuntimeFailure on every rank; no rank is left waiting for the
others. A rank that stops calling (it raised elsewhere, skipped the backward) is caught by the
watchdog (`timeout`): its peers end the job with one line naming what they waited for. No call
holds the GIL while it waits or computes, so threads on different communicators may call at once
(with MPI initialised at MPI_THREAD_MULTIPLE, mpi4py's default).
"""

import functools
import inspect
import math
import numbers

import torch
from mpi4py import MPI

from ._ringattn import Call as _Call
from ._ringattn import InputError, RuntimeFailure
from ._ringattn import KVCache as _KVCache
from ._ringattn import positions as _positions
from ._ringattn import watched_agree as _watched_agree
from ._ringattn import watched_sum as _watched_sum

__all__ = ["positions", "attention", "attention_lse", "KVCache", "InputError", "RuntimeFailure", "nn"]
InputError.__module__ = RuntimeFailure.__module__ = "ringattn"  # ringattn.InputError in tracebacks

_TORCH_NAME = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
               torch.float16: "float16"}
# storage dtype -> what O, LSE and the gradients are computed in
_ACCUM = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.float32, "f16": torch.float32}
_STORAGE = {"float32": "f32", "float64": "f64", "bfloat16": "bf16", "float16": "f16"}


def _out_dtype(x, inputs):
    """The dtype O is returned in: out_dtype, or the inputs' dtype when None."""
    if x is None:
        return inputs
    if not isinstance(x, torch.dtype) or x not in _TORCH_NAME:
        raise InputError(f"out_dtype: {x!r} is not supported (expected None, torch.float32, torch.float64, "
                         f"torch.bfloat16 or torch.float16)")
    return x


# ---- argument types: checked and converted here; what the values mean, the plan checks ----------

def _int(name, x, bits=63):
    """x as an int that fits the C++ integer it becomes; a bool, a float or a string is an error."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise InputError(f"{name}: {x!r} is not an integer")
    x = int(x)
    if not -(1 << bits) <= x < (1 << bits):
        raise InputError(f"{name}: {x} does not fit a {bits + 1}-bit integer (expected |{name}| < 2**{bits})")
    return x


def _int_or_none(name, x, bits=63):
    return None if x is None else _int(name, x, bits)


def _int_list(name, xs):
    """A list, tuple, 1-d integer array or tensor of integers (None: empty); floats are errors."""
    if xs is None:
        return []
    if isinstance(xs, torch.Tensor):
        if (xs.dim() != 1 or xs.dtype.is_floating_point or xs.dtype.is_complex or xs.dtype == torch.bool
                or xs.device.type != "cpu"):
            raise InputError(f"{name}: a {xs.dim()}-d {xs.dtype} tensor on {xs.device} (expected a list of integers)")
        xs = xs.tolist()
    if isinstance(xs, (str, bytes)) or not hasattr(xs, "__iter__"):
        raise InputError(f"{name}: {xs!r} is not a list of integers")
    out = []
    for n in xs:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise InputError(f"{name}: {n!r} in {name} is not an integer (expected a list of integers)")
        out.append(_int(name, n))
    return out


def _number(name, x):
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise InputError(f"{name}: {x!r} is not a number")
    try:
        return float(x)
    except OverflowError:  # an integer beyond float's range, 10**400
        raise InputError(f"{name}: {x} does not fit a float (expected |{name}| < 2**1024)") from None


def _number_or_none(name, x):
    return None if x is None else _number(name, x)


def _bool(name, x):
    if not isinstance(x, bool) and type(x).__name__ != "bool_":  # Python's bool or numpy's
        raise InputError(f"{name}: {x!r} is not a bool (expected True or False)")
    return bool(x)


def _name(name, x):
    if not isinstance(x, str):
        raise InputError(f"{name}: {x!r} is not a name (expected a string)")
    return x


def positions(seq_len, ranks, rank, layout="auto", partition=None, *, causal=None, window=None):
    """The global positions `rank` of `ranks` owns under `layout`: an increasing int64 array.

    layout: "auto" (attention()'s default: zigzag for a causal mask without a window or a
    partition, contiguous otherwise; give the same `causal` and `window` as to attention()),
    "contiguous" (consecutive ranges; balanced, or `partition` = one size per rank), "striped"
    (p mod ranks) or "zigzag" (2*ranks chunks; rank r owns chunks r and 2*ranks-1-r).
    Not collective: a bad argument raises InputError on this rank.
    """
    if layout == "auto" and causal is None:
        raise InputError("positions: layout 'auto' depends on the mask: give causal= (and window=) as to "
                         "attention(), or name the layout")
    return _positions(_int("seq_len", seq_len), _int("ranks", ranks, bits=31), _int("rank", rank, bits=31),
                      _name("layout", layout), _int_list("partition", partition),
                      False if causal is None else _bool("causal", causal), _int_or_none("window", window))


# ---- one call: this rank's problems found first, then agreed by every rank ------------------------

def _describe(name, t):
    """(shape, dtype name, error) of one input, checked on this rank alone."""
    if not isinstance(t, torch.Tensor):
        return [], "?", f"{name}: a {type(t).__name__}, not a torch.Tensor"
    if t.device.type != "cpu":
        return list(t.shape), "?", f"{name}: tensor on {t.device} (expected a CPU tensor)"
    if t.layout != torch.strided:
        return list(t.shape), "?", (f"{name}: a {str(t.layout).replace('torch.', '')} tensor (expected a dense CPU "
                                    f"tensor: {name}.to_dense())")
    return list(t.shape), _TORCH_NAME.get(t.dtype, str(t.dtype).replace("torch.", "")), ""


def _contiguous(t):
    t = t.detach().resolve_conj().resolve_neg()
    return t if t.is_contiguous() else t.contiguous()


def _out_of_memory(e):
    return isinstance(e, MemoryError) or "allocate memory" in str(e)  # torch's allocator says so


def _default_args():
    return dict(seq_len=0, causal=False, window=None, doc_lens=[], layout="auto", partition=[], scale=None,
                rope=None, strategy="ring", ulysses_degree=None, kv_head_group=None, timeout=None, softcap=None,
                sinks=[], cu_seqlens=[], precision="f32")


_PRECISIONS = {torch.float32: "f32", torch.bfloat16: "bf16"}


def _precision(x):
    """The precision's name: a string as given (the plan checks it), or torch.float32 / torch.bfloat16."""
    if isinstance(x, torch.dtype):
        if x not in _PRECISIONS:
            raise InputError(f"precision: {x} is not a precision (expected \"f32\" or \"bf16\", or torch.float32 "
                             f"or torch.bfloat16)")
        return _PRECISIONS[x]
    return _name("precision", x)


def _sink_values(sinks):
    """The sink logits as floats ([] for None): a 1-d floating tensor (or a list of numbers)."""
    if sinks is None:
        return []
    if isinstance(sinks, torch.Tensor):
        if sinks.dim() != 1 or not sinks.dtype.is_floating_point or sinks.device.type != "cpu":
            raise InputError(f"sinks: a {sinks.dim()}-d {sinks.dtype} tensor on {sinks.device} (expected a 1-d "
                             f"floating CPU tensor [H], one logit per query head)")
        values = sinks.detach().double().tolist()
    elif isinstance(sinks, (str, bytes)) or not hasattr(sinks, "__iter__"):
        raise InputError(f"sinks: {sinks!r} is not a tensor of sink logits (expected a 1-d tensor [H])")
    else:
        values = [_number("sinks", x) for x in sinks]
    if not values:  # [] is how the plan says "no sinks": an empty tensor given is not that
        raise InputError("sinks: no values (expected one sink logit per query head, [H]; None for no sinks)")
    return values


class _Prepared:
    """This rank's side of one call before the ranks agree: its arguments converted, its tensors
    made contiguous and its outputs allocated, so nothing after the agreement fails on one rank
    alone. `error` is the first problem found ("" when none); `failure` when it is not bad input."""

    def __init__(self, q, k, v, args, comm):
        self.comm, self.error = self._communicator(comm)
        self.failure = False
        self.shapes, self.dtypes = [], []
        for name, t in (("q", q), ("k", k), ("v", v)):
            s, d, e = _describe(name, t)
            self.shapes.append(s)
            self.dtypes.append(d)
            self.error = self.error or e
        self.args = _default_args()
        try:
            if args["seq_len"] is None:
                raise InputError("seq_len: needed (the total sequence length S over all ranks)")
            self.args.update(
                seq_len=_int("seq_len", args["seq_len"]), causal=_bool("causal", args["causal"]),
                window=_int_or_none("window", args["window"]), doc_lens=_int_list("doc_lens", args["doc_lens"]),
                layout=_name("layout", args["layout"]), partition=_int_list("partition", args["partition"]),
                scale=_number_or_none("scale", args["scale"]), rope=_number_or_none("rope", args["rope"]),
                strategy=_name("strategy", args["strategy"]),
                ulysses_degree=_int_or_none("ulysses_degree", args["ulysses_degree"], bits=31),
                kv_head_group=_int_or_none("kv_head_group", args["kv_head_group"], bits=31),
                timeout=_number_or_none("timeout", args["timeout"]),
                softcap=_number_or_none("softcap", args["softcap"]), sinks=_sink_values(args["sinks"]),
                cu_seqlens=_int_list("cu_seqlens", args["cu_seqlens"]),
                precision=_precision(args["precision"]))
            self.out_dtype = _out_dtype(args.get("out_dtype"), q.dtype if isinstance(q, torch.Tensor) else None)
        except InputError as e:
            self.error = self.error or str(e)
        except MemoryError as e:
            if not self.error:
                self.error, self.failure = _failure("converting the arguments", e, self.comm), True
        except Exception as e:  # an argument the checks above did not foresee: still this rank's error, agreed
            self.error = self.error or f"arguments: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else e!r}"
        self.tensors = None
        if self.error:
            self.shapes = [[], [], []]  # checked no further
            return
        if len(self.shapes[0]) != 4 or _ACCUM.get(_STORAGE.get(self.dtypes[0])) is None:
            return  # the agreement reports it, with the shapes and dtypes
        try:
            qc, kc, vc = _contiguous(q), _contiguous(k), _contiguous(v)
            B, L, H, D = qc.shape
            acc = _ACCUM[_STORAGE[self.dtypes[0]]]
            o = torch.empty((B, L, H, D), dtype=acc)
            # O as returned: the computed O rounded once (to nearest even, as .to() does) when the
            # dtypes differ; allocated here so that nothing after the agreement fails on one rank
            out = o if self.out_dtype == acc else torch.empty((B, L, H, D), dtype=self.out_dtype)
            self.tensors = (qc, kc, vc, o, torch.empty((B, H, L), dtype=acc), out)
        except Exception as e:  # out of memory, most likely: every rank raises it
            self.error, self.failure = _failure("preparing q, k, v and the outputs", e, self.comm), True

    @staticmethod
    def _communicator(comm):
        """(the communicator to agree over, its error): without one of its own, a rank agrees on
        its error over COMM_WORLD."""
        if comm is None:
            return MPI.COMM_WORLD, ""
        if isinstance(comm, MPI.Comm) and comm != MPI.COMM_NULL and not comm.Is_inter():
            return comm, ""
        what = (f"a {type(comm).__name__}" if not isinstance(comm, MPI.Comm) else
                "MPI.COMM_NULL" if comm == MPI.COMM_NULL else "an intercommunicator")
        return MPI.COMM_WORLD, f"comm: {what}, not an mpi4py intracommunicator (expected e.g. MPI.COMM_WORLD)"

    @classmethod
    def refused(cls, comm, error, failure=False):
        """A call this rank cannot make: its error (or its communicator's), agreed by call();
        `failure` when it is not bad input."""
        p = cls.__new__(cls)
        p.comm, comm_error = cls._communicator(comm)
        p.error, p.failure = comm_error or error, failure and not comm_error
        p.shapes, p.dtypes, p.tensors = [[], [], []], ["?"] * 3, None
        p.args = _default_args()
        return p

    def without_tensors(self):
        """This preparation's arguments only (what a second forward of the same call needs)."""
        p = _Prepared.__new__(_Prepared)
        p.comm, p.args = self.comm, self.args
        return p

    def call(self):
        """The agreed call (collective over the communicator); raises this rank's error, or a
        peer's, on every rank."""
        a = self.args
        return _Call(self.comm, a["seq_len"], self.shapes[0], self.shapes[1], self.shapes[2], self.dtypes,
                     self.error, self.failure, a["causal"], a["window"], a["doc_lens"], a["layout"], a["partition"],
                     a["scale"], a["rope"], a["strategy"], a["ulysses_degree"], a["kv_head_group"], a["timeout"],
                     a["softcap"], a["sinks"], a["cu_seqlens"], a["precision"])


def _autocast_dtype():
    """The dtype of an enabled CPU autocast region around this call, else None."""
    try:  # torch >= 2.4 names the device
        on, dtype = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
    except (TypeError, AttributeError):
        on, dtype = torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
    return dtype if on else None


def _autocast(tensors, comm):
    """The tensors as CPU autocast gives them to scaled_dot_product_attention: floating CPU tensors
    other than float64 cast to the autocast dtype (a cast autograd records, so their gradients come
    back in their own dtype), the others as given. A rank that cannot cast (out of memory) raises
    RuntimeFailure on every rank of comm."""
    dtype = _autocast_dtype()
    if dtype is None:
        return tensors

    def cast(t):
        return (isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.dtype != torch.float64
                and t.device.type == "cpu" and t.layout == torch.strided)

    try:
        return tuple(t.to(dtype) if cast(t) else t for t in tensors)
    except Exception as e:
        agree_over = _Prepared._communicator(comm)[0]
        _Prepared.refused(comm, _failure(f"casting q, k, v to the autocast dtype {dtype}", e, agree_over),
                          failure=True).call()  # raises on every rank
        raise AssertionError("ringattn: the ranks agreed on a call this rank cannot make")  # not reached


def _failure(what, e, comm):
    """One line for this rank's failure that is not bad input (out of memory, most likely)."""
    rank = comm.rank
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    if _out_of_memory(e):
        return f"rank {rank}: out of memory {what} ({type(e).__name__}: {first})"
    return f"rank {rank}: {type(e).__name__} {what}: {first}"


def _agreed_signature(fn, comm_of=lambda args, kwargs: kwargs.get("comm")):
    """fn's arguments bound on this rank first: a call it cannot bind (an unknown keyword, a
    missing or an extra argument) raises InputError on every rank of the call's communicator
    (comm_of(args, kwargs)), as any other bad argument does, instead of a TypeError on this rank
    alone."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            _Prepared.refused(comm_of(args, kwargs), f"{fn.__qualname__}: {e}").call()  # raises on every rank
        return fn(*args, **kwargs)

    return call


class _Unbound:
    """What a KVCache call gets in place of each positional argument on a rank that could not bind
    its arguments: the call still joins its peers' collectives, and its first check raises
    `message` in their agreement."""

    def __init__(self, message):
        self.message = message

    @staticmethod
    def check(x):
        if isinstance(x, _Unbound):
            raise InputError(x.message)


def _agreed_binding(method):
    """A KVCache method (or its constructor) whose call this rank cannot bind (an unknown keyword,
    a missing or an extra argument) raises InputError on every rank of the cache's communicator, as
    attention() does, instead of a TypeError on this rank alone. The method runs with _Unbound in
    place of its positional arguments (and with the keywords comm and timeout as given, which the
    constructor's agreement needs); the first argument it checks raises the refusal."""
    sig = inspect.signature(method)
    positional = [p for p in sig.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD][1:]  # after self
    kept = [name for name in ("comm", "timeout") if name in sig.parameters]
    name = "ringattn.KVCache()" if method.__name__ == "__init__" else method.__qualname__

    @functools.wraps(method)
    def call(self, /, *args, **kwargs):  # a keyword named self is the call's to refuse, not this wrapper's
        try:
            sig.bind(self, *args, **kwargs)
        except TypeError as e:
            refusal = _Unbound(f"{name}: {e}")
            return method(self, *[refusal] * len(positional), **{k: kwargs[k] for k in kept if k in kwargs})
        return method(self, *args, **kwargs)

    return call


def _differentiable_once(backward):
    """A backward whose gradients raise when differentiated again. torch's once_differentiable
    marks them only when an incoming gradient requires grad; under create_graph=True with plain
    incoming gradients (torch.autograd.grad(o.sum(), q, create_graph=True)) it returns gradients
    without a graph, and a gradient penalty built on them silently loses its second-order term.
    Here every gradient computed while grad mode is on (create_graph=True) carries a node that
    raises when reached. That node also takes the call's inputs and incoming gradients that
    require grad, so a second differentiation reaches it whichever tensors it asks for
    (torch.autograd.grad(penalty, w) or penalty.backward(inputs=[w]) for the weights w that made
    q, k and v), not only one that walks the whole graph. backward(ctx, saved, *grads) gets the
    saved tensors, unpacked here once."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        saved = ctx.saved_tensors  # unpacked once (a saved-tensor hook may allow no second unpack)
        with torch.no_grad():
            outputs = backward(ctx, saved, *grads)
        if not torch.is_grad_enabled():
            return outputs
        upstream = [t for t in (*saved, *grads) if t is not None and t.requires_grad]
        err = torch._C._functions.DelayedError(
            b"ringattn.attention is differentiable once: its gradients cannot be differentiated again "
            b"(no double backward)", len(outputs) + len(upstream))

        def marked(t):
            if t is None:
                return None
            t = t.detach()
            t.requires_grad_(True)
            return t

        return err(*[marked(t) for t in outputs], *upstream)[:len(outputs)]

    return wrapper


class _AttentionFunction(torch.autograd.Function):
    """O, LSE of this rank's shard; the backward runs the distributed backward (collective). It is
    differentiable once: the gradients it returns raise when differentiated again. Gradients flow
    from O and from LSE into q, k, v, and into the sinks when given."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, prepared):
        call = prepared.call()  # collective: raises this rank's error, or a peer's, on every rank
        qc, kc, vc, o, lse, out = prepared.tensors
        call.forward(qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), o.data_ptr(), lse.data_ptr())
        if out is not o:
            out.copy_(o)
        ctx.call, ctx.prepared = call, prepared.without_tensors()
        ctx.has_sinks = sinks is not None
        ctx.set_materialize_grads(False)  # an output the loss does not use gets None: no work for it
        # q, k, v as autograd keeps inputs: freed with the graph (a later backward then gets
        # autograd's own error, which names retain_graph), checked against in-place changes, and
        # there to compute the forward again for a second backward through a retained graph.
        ctx.save_for_backward(q, k, v, sinks)
        return out, lse

    @staticmethod
    @_differentiable_once
    def backward(ctx, saved, do, dlse):
        q, k, v, sinks = saved
        call, ctx.call = ctx.call, None  # the plan goes back for reuse when this backward is done
        if call is None:  # a second backward through a graph kept by retain_graph=True: the first
            # freed the distributed state, so every rank runs its forward again (collective)
            args = dict(ctx.prepared.args, sinks=ctx.prepared.args["sinks"] or None)  # [] is "none" once converted
            again = _Prepared(q, k, v, args, ctx.prepared.comm)
            call = again.call()
            qc, kc, vc, o, lse, _ = again.tensors
            call.forward(qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), o.data_ptr(), lse.data_ptr())
        acc = _ACCUM[call.dtype]
        B, L, H, D = q.shape
        try:
            do = torch.zeros(q.shape, dtype=q.dtype) if do is None else _contiguous(do.to(q.dtype))
            dlse = None if dlse is None else _contiguous(dlse.to(acc))
            dq = torch.empty(q.shape, dtype=acc)
            dk = torch.empty(k.shape, dtype=acc)
            dv = torch.empty(v.shape, dtype=acc)
            dsinks = torch.empty((H,), dtype=acc) if ctx.has_sinks else None
        except Exception as e:  # out of memory, most likely: the peers' backward raises it too
            call.refuse(_failure("preparing dout and the gradients", e, ctx.prepared.comm))
        call.backward(do.data_ptr(), 0 if dlse is None else dlse.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                      dv.data_ptr(), 0 if dsinks is None else dsinks.data_ptr())
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
                None if dsinks is None else dsinks.to(sinks.dtype), None)


@_agreed_signature
def attention_lse(q, k, v, *, seq_len=None, causal=False, window=None, doc_lens=None, cu_seqlens=None,
                  layout="auto", partition=None, scale=None, softcap=None, sinks=None, rope=None, strategy="ring",
                  ulysses_degree=None, kv_head_group=None, comm=None, timeout=None, out_dtype=None, precision="f32"):
    """(O, LSE) of this rank's shard; arguments as attention(). LSE [B, H, L] (natural log) is
    float64 for float64 inputs and float32 otherwise, whatever out_dtype, and differentiable: a loss
    that uses it (a z-loss, a merge with another attention) sends its gradient into q and k (and the
    sinks)."""
    q, k, v = _autocast((q, k, v), comm)
    p = _Prepared(q, k, v, dict(seq_len=seq_len, causal=causal, window=window, doc_lens=doc_lens, layout=layout,
                                partition=partition, scale=scale, rope=rope, strategy=strategy,
                                ulysses_degree=ulysses_degree, kv_head_group=kv_head_group, timeout=timeout,
                                out_dtype=out_dtype, softcap=softcap, sinks=sinks, cu_seqlens=cu_seqlens,
                                precision=precision), comm)
    if p.tensors is None:  # this rank's error, or q, k, v it could not read
        p.call()  # raises it, or a peer's, on every rank, before autograd sees the inputs
        raise AssertionError("ringattn: the ranks agreed on a call this rank cannot make")  # not reached
    return _AttentionFunction.apply(q, k, v, sinks if isinstance(sinks, torch.Tensor) else None, p)


@_agreed_signature
def attention(q, k, v, *, seq_len=None, causal=False, window=None, doc_lens=None, cu_seqlens=None, layout="auto",
              partition=None, scale=None, softcap=None, sinks=None, rope=None, strategy="ring", ulysses_degree=None,
              kv_head_group=None, comm=None, timeout=None, out_dtype=None, precision="f32"):
    """This rank's O [B, L, H, D] of softmax(scale * q k^T + mask) v over the whole sequence.

    q [B, L, H, D], k, v [B, L, HKV, D]: this rank's shard, its L positions given by
      positions(seq_len, comm.size, comm.rank, layout, partition, causal=causal, window=window);
      H a multiple of HKV (GQA).
    seq_len: S, the positions over all ranks (needed).
    causal: j <= i (a bool). window: W >= 1, causal sliding window i - W < j <= i.
    doc_lens: packed documents (integer lengths summing to S); attention stays within each.
    cu_seqlens: the same documents as flash-attn's offsets (an int32/int64 tensor or a list: 0, the
      running ends of the documents, S); instead of doc_lens, and bit for bit the same result.
    layout: "auto" (zigzag for a causal mask without a window or partition, contiguous otherwise;
      the command line's default), "contiguous" (with `partition`: one integer size per rank),
      "striped" or "zigzag".
    scale: default 1/sqrt(D).
    softcap: C > 0 soft-caps each scaled score, s -> C tanh(s / C), before the mask (Gemma 2,
      flash-attn's softcap); None or 0: none.
    sinks: a [H] tensor of attention-sink logits, one per query head, that join every row's softmax
      denominator and attend to no value (gpt-oss); differentiable: sinks.grad is the whole gradient on
      every rank, summed over all ranks' rows in a fixed order. -inf is no sink for that head.
    rope: theta (e.g. 10000.0) to rotate q and k at their global
      positions before attending (rotate-half RoPE; gradients are with respect to q, k as given).
    strategy: "ring" (no rule on the shape), "ulysses" (H % N == 0), "usp" with ulysses_degree U
      (ranks per all-to-all group; N % U == 0, H % U == 0), or "allgather" (every rank gathers all
      K/V, kv_head_group KV heads at a time; default: by memory).
    comm: an mpi4py communicator (default MPI.COMM_WORLD); every rank of it must call.
    timeout: seconds any rank may wait for its peers in this call and its backward before the
      whole job ends with one line naming the step (exit 3); None: the command line's default
      (300 s and more for large shapes); 0: no watchdog. Every rank must give the same.
    out_dtype: the dtype of the returned O; None: the inputs' dtype. O is computed and accumulated
      in float64 for float64 inputs and float32 otherwise, then rounded once to out_dtype (to
      nearest even, as .to() does): torch.float32 keeps the float32 result of 16-bit inputs.
      torch.float32, float64, bfloat16 or float16; anything else raises InputError on every rank.
    precision: "f32" (the default; or torch.float32): the products with P and dS take them exactly.
      "bf16" (or torch.bfloat16), for bfloat16 q, k, v only: P and dS are rounded to bfloat16 before
      their products (P v, P^T dO, dS k, dS^T q), as FlashAttention and PyTorch's own bf16 attention
      do, so every product runs on bf16 dot products (AMX tiles where the CPU has them); softmax
      statistics and sums stay float32.
    Inside torch.autocast("cpu"), q, k, v of any floating dtype but float64 are cast to the
    autocast dtype first, as scaled_dot_product_attention's are: O comes in that dtype (or in
    out_dtype), and the gradients reach float32 tensors in float32 through the casts.
    O is differentiable once: its backward runs the distributed backward (collective over comm)
    and fills q.grad, k.grad, v.grad; differentiating those again raises.
    """
    o, _ = attention_lse(q, k, v, seq_len=seq_len, causal=causal, window=window, doc_lens=doc_lens,
                         cu_seqlens=cu_seqlens, layout=layout, partition=partition, scale=scale, softcap=softcap,
                         sinks=sinks, rope=rope, strategy=strategy, ulysses_degree=ulysses_degree,
                         kv_head_group=kv_head_group, comm=comm, timeout=timeout, out_dtype=out_dtype,
                         precision=precision)
    return o


class KVCache:
    """A KV cache sharded by position across the ranks of `comm`, one per attention layer.

    prefill(q, k, v): every rank passes its shard of the prompt, at the positions
      positions(prompt_len) lists (q [B, L, H, D], k, v [B, L, HKV, D]); the causal ring forward
      returns this rank's O [B, L, H, D] (and LSE [B, H, L] with return_lse=True); K/V stay here.
    load(k, v): the prompt's K/V only, kept without attending (instead of prefill).
    decode(q, k, v): every rank passes the same T new tokens (q [B, T, H, D], k, v [B, T, HKV, D]);
      their K/V go to the ranks that own their positions, every rank attends the T queries to its
      shard, and one collective merges the partial softmax states in float32 or float64: every rank
      returns the same O [B, T, H, D], bit for bit (and LSE [B, H, T] with return_lse=True).
    merge: "allreduce" (the default: recursive doubling with fixed partners) or "gather" (one
      all-gather, the states merged in rank order); the same choice as `ringattn decode --merge`.
    O is computed in float64 for a float64 cache and float32 otherwise, and returned in the cache's
    dtype (rounded once, as attention() does) or in out_dtype; LSE stays float64 or float32. No
    autograd: this is inference. Every call is collective over comm, and one rank's bad argument
    (an unknown keyword, a missing argument, a tensor of another shape) raises InputError on every
    rank, as attention()'s does.
    """

    @_agreed_binding
    def __init__(self, batch, heads, kv_heads, head_dim, *, dtype=torch.float32, layout="auto", window=None,
                 scale=None, capacity=None, comm=None, timeout=None, out_dtype=None, merge="allreduce"):
        agree_over, comm_error = _Prepared._communicator(comm)

        def arguments():
            _Unbound.check(batch)
            if comm_error:
                raise InputError(comm_error)
            if not isinstance(dtype, torch.dtype):
                raise InputError(f"dtype: {dtype!r} is a {type(dtype).__name__} (expected a torch.dtype: "
                                 f"torch.float32, torch.float64, torch.bfloat16 or torch.float16)")
            if dtype not in _TORCH_NAME:
                raise InputError(f"dtype: {dtype} is not supported (expected torch.float32, torch.float64, "
                                 f"torch.bfloat16 or torch.float16)")
            shape = (_int("batch", batch), _int("heads", heads), _int("kv_heads", kv_heads),
                     _int("head_dim", head_dim))
            return shape, _out_dtype(out_dtype, dtype), (
                _name("layout", layout), _int_or_none("window", window), _number_or_none("scale", scale),
                _int_or_none("capacity", capacity), _number_or_none("timeout", timeout), _name("merge", merge))

        self._watchdog = _watchdog(timeout)
        self._shape, self._out, options = _agree(agree_over, arguments, self._watchdog, "ringattn.KVCache()")
        self._comm = agree_over
        self._dtype = dtype
        self._acc = _ACCUM[_STORAGE[_TORCH_NAME[dtype]]]
        self._c = _KVCache(agree_over, *self._shape, _STORAGE[_TORCH_NAME[dtype]], *options)

    def positions(self, prompt_len):
        """This rank's positions of a prompt of prompt_len positions: an increasing int64 tensor."""
        return torch.tensor(self._c.positions(_int("prompt_len", prompt_len)), dtype=torch.int64)

    @property
    def length(self):
        """Positions in the cache, over all ranks."""
        return self._c.length

    def _length(self, name, t):
        """t's second dimension, its positions, once t is a 4-d CPU tensor of the cache's dtype."""
        _Unbound.check(t)
        if not isinstance(t, torch.Tensor) or t.dtype != self._dtype or t.device.type != "cpu":
            got = (f"a {type(t).__name__}" if not isinstance(t, torch.Tensor)
                   else f"a {str(t.dtype).replace('torch.', '')} tensor on {t.device}")
            raise InputError(f"{name}: rank {self._comm.rank} gave {got} (expected a CPU tensor of the cache's dtype "
                             f"{self._dtype})")
        if t.dim() != 4:
            raise InputError(f"{name}: rank {self._comm.rank} gave shape {list(t.shape)} (expected 4 dimensions: "
                             f"[batch, positions, heads, head_dim])")
        return t.shape[1]

    def _checked(self, name, t, heads, length):
        B, _, _, D = self._shape
        self._length(name, t)
        if t.shape[0] != B or t.shape[1] != length or t.shape[2] != heads or t.shape[3] != D:
            raise InputError(f"{name}: rank {self._comm.rank} gave shape {list(t.shape)} "
                             f"(expected [{B}, {length}, {heads}, {D}])")
        return t.detach().contiguous()

    def _tensors(self, q, k, v, length):
        B, H, HKV, D = self._shape
        return self._checked("q", q, H, length), self._checked("k", k, HKV, length), self._checked("v", v, HKV, length)

    def _prompt_len(self, name, t, prompt_len, what):
        """The prompt's length: prompt_len, or the sum of every rank's positions in t. Two
        collectives, on every rank whether prompt_len is given or not: the agreement that every
        rank's t has positions to count, then their sum."""
        L = _agree(self._comm, lambda: self._length(name, t), self._watchdog, what)
        total = _watched_sum(self._comm, L, self._watchdog, what)
        return total if prompt_len is None else prompt_len

    @_agreed_binding
    def prefill(self, q, k, v, *, prompt_len=None, return_lse=False):
        """This rank's shard of the prompt (the positions positions(prompt_len) lists); without
        prompt_len, the prompt is every rank's q positions together."""
        B, H, HKV, D = self._shape
        S0 = self._prompt_len("q", q, prompt_len, "KVCache.prefill")

        def tensors():
            L0 = len(self._c.positions(_int("prompt_len", S0)))
            q_, k_, v_ = self._tensors(q, k, v, L0)
            return q_, k_, v_, torch.empty((B, L0, H, D), dtype=self._acc), torch.empty((B, H, L0), dtype=self._acc)

        q, k, v, o, lse = _agree(self._comm, tensors, self._watchdog, "KVCache.prefill")
        self._c.prefill(S0, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr())
        o = o.to(self._out)
        return (o, lse) if return_lse else o

    @_agreed_binding
    def load(self, k, v, *, prompt_len=None):
        """This rank's shard of the prompt's K/V (the positions positions(prompt_len) lists), kept
        without attending: K/V computed elsewhere, or a prompt too long to attend here. Instead of
        prefill(), once, before any decode."""
        B, H, HKV, D = self._shape
        S0 = self._prompt_len("k", k, prompt_len, "KVCache.load")

        def tensors():
            L0 = len(self._c.positions(_int("prompt_len", S0)))
            return self._checked("k", k, HKV, L0), self._checked("v", v, HKV, L0)

        k, v = _agree(self._comm, tensors, self._watchdog, "KVCache.load")
        self._c.load(S0, k.data_ptr(), v.data_ptr())

    @_agreed_binding
    def decode(self, q, k, v, *, return_lse=False):
        """T new tokens, the same on every rank: O [B, T, H, D] (and LSE [B, H, T]), the same bits on
        every rank."""
        B, H, HKV, D = self._shape

        def tensors():
            T = self._length("q", q)
            q_, k_, v_ = self._tensors(q, k, v, T)
            return q_, k_, v_, torch.empty((B, T, H, D), dtype=self._acc), torch.empty((B, H, T), dtype=self._acc)

        q, k, v, o, lse = _agree(self._comm, tensors, self._watchdog, "KVCache.decode")
        self._c.decode(q.shape[1], q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr())
        o = o.to(self._out)
        return (o, lse) if return_lse else o


# The watchdog of KVCache's own agreements where no valid `timeout` is known yet: the command
# line's base default.
_DEFAULT_WATCHDOG = 300.0


def _watchdog(timeout):
    """The seconds a KVCache agreement waits for its peers: `timeout` when it is one (0: no
    watchdog), else the default (the cache's own checks report a bad timeout)."""
    try:  # float(): an integer too large for a float (10**400) is no timeout, not an OverflowError here
        ok = isinstance(timeout, numbers.Real) and not isinstance(timeout, bool) and math.isfinite(float(timeout))
    except OverflowError:
        ok = False
    return float(timeout) if ok and timeout >= 0 else _DEFAULT_WATCHDOG


def _agree(comm, fn, timeout, what):
    """fn() on this rank, its failure agreed over `comm` before any rank goes on: every rank raises
    the lowest failing rank's error (InputError for bad input, RuntimeFailure otherwise), so that
    one rank's bad tensor never leaves its peers waiting in the next collective. The agreement waits
    under the watchdog `timeout` (0: none): a peer that never calls `what` ends the job with one line
    naming it (exit 3), as attention()'s watchdog does."""
    try:
        result, error = fn(), ""
    except InputError as e:
        result, error = None, "I" + str(e)
    except Exception as e:  # out of memory, most likely
        result, error = None, "F" + _failure("preparing the call", e, comm)
    first = _watched_agree(comm, error, timeout, what)
    if first:
        raise (InputError if first[0] == "I" else RuntimeFailure)(first[1:])
    return result


from . import nn  # noqa: E402  (ringattn.nn.DistributedAttention, over the functions above)
