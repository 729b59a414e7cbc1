"""ringattn.nn: distributed attention as a torch.nn.Module.

    attn = ringattn.nn.DistributedAttention(S, causal=True, rope=10000.0)   # every rank, same arguments
    pos = attn.positions()                   # this rank's positions: shard x, the target, ... with them
    o = attn(q, k, v)                        # ringattn.attention(q, k, v, seq_len=S, causal=True, ...)

The module holds what stays the same from call to call (the sequence length, the mask, the
layout, the strategy, the communicator and every other keyword of ringattn.attention) and forward
calls ringattn.attention with them; a keyword given to forward overrides the module's for that
call (documents that change with every batch: doc_lens= or cu_seqlens=). Like the function, the
module is collective: every rank of the communicator calls forward, and then backward, together.
"""

import copy
import functools
import inspect

import torch
from mpi4py import MPI

from . import InputError, _agreed_signature, _Prepared, attention, positions

__all__ = ["DistributedAttention"]

# attention()'s keywords, which the module holds and forward may override
_KEYWORDS = tuple(n for n, p in inspect.signature(attention).parameters.items() if p.kind == p.KEYWORD_ONLY)


def _checked_keywords(where, options):
    unknown = sorted(set(options) - set(_KEYWORDS))
    if unknown:
        raise InputError(f"{where}: unknown keyword {', '.join(map(repr, unknown))} (expected keywords of "
                         f"ringattn.attention: {', '.join(_KEYWORDS)})")
    return options


def _positions_of(options):
    """This rank's positions under a call's (or the module's) options: seq_len, layout, partition,
    mask and comm."""
    comm = options.get("comm") or MPI.COMM_WORLD
    return positions(options["seq_len"], comm.size, comm.rank, options.get("layout", "auto"),
                     options.get("partition"), causal=options.get("causal", False), window=options.get("window"))


def _positions_under(options):
    """_positions_of, or None where the options are not valid (the call then refuses them on every
    rank)."""
    try:
        return _positions_of(options)
    except Exception:  # noqa: BLE001 - attention() reports what is wrong, on every rank
        return None


def _call_comm(module, overrides):
    """The communicator of a forward call: the one it overrides the module's with, or the module's."""
    return overrides.get("comm", module.options.get("comm"))


class DistributedAttention(torch.nn.Module):
    """Attention over a sequence sharded across the ranks of `comm`: forward(q, k, v) is
    ringattn.attention(q, k, v, seq_len=seq_len, **options) with the options given here.

    seq_len: S, the positions over all ranks. Keywords: any of ringattn.attention's (causal,
      window, doc_lens, layout, partition, scale, rope, strategy, ulysses_degree, comm, timeout,
      out_dtype, precision, ...), with its defaults; an unknown one raises InputError here.
    sinks: given as a tensor [H] of initial sink logits, the module learns them: self.sinks is an
      nn.Parameter initialised from a copy (an nn.Parameter given is used as it is), passed to
      every call. Its gradient is already the whole one on every rank (ringattn sums it over all
      ranks' rows), so a training loop that sums its weight gradients over the ranks of `comm`
      leaves self.sinks out of that sum.
    """

    def __init__(self, seq_len, **options):
        super().__init__()
        options = _checked_keywords("DistributedAttention", dict(options, seq_len=seq_len))
        sinks = options.pop("sinks", None)
        if sinks is not None:
            if not isinstance(sinks, torch.Tensor) or sinks.dim() != 1:
                raise InputError(f"sinks: {type(sinks).__name__} (expected a tensor [H] of initial sink logits)")
            sinks = sinks if isinstance(sinks, torch.nn.Parameter) else torch.nn.Parameter(sinks.detach().clone())
        self.sinks = sinks  # a registered parameter, or None
        self.options = options

    @property
    def comm(self):
        """The communicator the calls run on."""
        return self.options.get("comm") or MPI.COMM_WORLD

    def positions(self):
        """This rank's global positions under the module's layout: an increasing int64 array
        (ringattn.positions with the module's seq_len, layout, partition and mask)."""
        return _positions_of(self.options)

    @functools.partial(_agreed_signature, comm_of=lambda args, kwargs: _call_comm(args[0], kwargs))
    def forward(self, q, k, v, **overrides):
        """This rank's O [B, L, H, D] for its shard q [B, L, H, D], k, v [B, L, HKV, D]; keywords
        override the module's for this call. Collective: a call this rank cannot make (an unknown
        keyword, a missing tensor) raises InputError on every rank, as attention() does."""
        options = dict(self.options)
        if self.sinks is not None:
            options["sinks"] = self.sinks
        try:
            options.update(_checked_keywords("DistributedAttention.forward", overrides))
        except InputError as e:
            _Prepared.refused(_call_comm(self, overrides), str(e)).call()  # raises on every rank
        # An override that moves this rank's positions (a mask that makes layout "auto" another
        # layout, another partition) would attend over shards positions() did not give.
        moved = [n for n in ("seq_len", "layout", "partition", "causal", "window", "comm") if n in overrides]
        if moved:
            mine, call = _positions_under(self.options), _positions_under(options)
            if mine is not None and call is not None and not (len(mine) == len(call) and (mine == call).all()):
                comm = _call_comm(self, overrides) or MPI.COMM_WORLD
                given = ", ".join(f"{n}={overrides[n]!r}" for n in moved if n != "comm") or "comm"
                advice = ("give the module an explicit layout= to change the mask per call"
                          if set(moved) <= {"causal", "window"} else "call ringattn.attention for another sharding")
                _Prepared.refused(comm, f"DistributedAttention.forward: {given} gives rank {comm.rank} other "
                                        f"positions than the module's positions() (expected overrides that keep "
                                        f"each rank's positions: {advice})").call()
        return attention(q, k, v, **options)

    def __deepcopy__(self, memo):
        """A copy (copy.deepcopy of a model, say) attends over the same communicator: an mpi4py
        communicator is a handle to the ranks, not data to copy."""
        comm = self.options.get("comm")
        if comm is not None:
            memo[id(comm)] = comm
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        new.__dict__.update({n: copy.deepcopy(v, memo) for n, v in self.__dict__.items()})
        return new

    def extra_repr(self):
        shown = ", ".join(f"{n}={v!r}" for n, v in self.options.items() if n not in ("seq_len", "comm"))
        return f"seq_len={self.options['seq_len']}" + (f", {shown}" if shown else "")
