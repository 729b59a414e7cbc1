#pragma once
// ringattn as a library: distributed attention over the ranks of an MPI communicator, called from
// an application's own code (the `ringattn` command line is one such application).
//
// Every rank of the communicator holds its shard of the sequence: the positions the layout gives
// it (positions()), in increasing global order. Shapes, with L = local_size():
//   q, dout, o, dq   [B, L, H, D]      k, v, dk, dv   [B, L, HKV, D]      lse   [B, H, L]
// Storage (q, k, v, dout) is in the plan's dtype; o, lse and the gradients are in its accumulation
// type (double for f64; float for f32, bf16 and f16).
//
// Use, on every rank of `mpi_comm` (MPI already initialised by the application, or by
// comm::Environment):
//   ringattn::AttentionOptions opt;
//   opt.shape = {B, S, H, HKV, D};
//   opt.causal = true;  opt.layout = "zigzag";  opt.dtype = "f32";
//   ringattn::Attention att(ringattn::communicator(mpi_comm), opt);   // collective
//   att.load(q, k, v);                                                  // this rank's shard
//   att.forward();
//   att.backward(dout);                                                 // optional
//   att.outputs(ringattn::Outputs<float>{o, lse, dq, dk, dv});
//
// Beyond plain attention (AttentionOptions): softcap (s -> c tanh(s/c)), sinks (one logit per query
// head in every row's softmax denominator; their gradient comes in Outputs::dsinks, the whole of it
// on every rank), cu_seqlens (documents as offsets, instead of doc_lens), precision ("bf16", with
// dtype "bf16" only: P and dS rounded to bf16 before their products, as FlashAttention does, so
// every product runs on bf16 dot products; "f32", the default, keeps them exact) and a gradient
// flowing into LSE (backward's dlse).
//
// Errors: a bad option or a shard of the wrong size throws InputError with a one-line message, on
// every rank of the communicator at once (the ranks agree on errors before they exchange data), so
// one rank's mistake never leaves its peers waiting. Any other failure of one rank before the ranks
// exchange data (out of memory while building the plan, say) throws AgreedFailure on every rank.
// Failures while the ranks talk throw RuntimeFailure; a watchdog (timeout_s; empty: the command
// line's default) ends the whole job instead of hanging. A moved-from Attention throws InputError
// when used.
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/core/function_ref.hpp"
#include "ringattn/core/layout.hpp"
#include "ringattn/core/ledger.hpp"
#include "ringattn/core/mask.hpp"
#include "ringattn/core/reference.hpp"
#include "ringattn/core/shape.hpp"
#include "ringattn/core/storage.hpp"
#include "ringattn/runtime/kv_cache.hpp"
#include "ringattn/runtime/plan.hpp"

namespace ringattn {

using core::Index;

// A private duplicate of an application's communicator (`mpi_comm` is an MPI_Comm, e.g.
// MPI_COMM_WORLD or one from MPI_Comm_split). Collective over it.
template <class MpiComm>
comm::Comm communicator(const MpiComm& mpi_comm) {
  return comm::Comm::duplicate_of(&mpi_comm);
}

// What one attention call is (runtime/plan.hpp): names as in the Python package, defaults as on
// the command line (layout "auto"; timeout_s empty: the command line's default watchdog).
using AttentionOptions = runtime::PlanOptions;

// Outputs to read, in the accumulation type A; an empty span is skipped. Sizes as above.
template <class A>
struct Outputs {
  std::span<A> o, lse, dq, dk, dv;
  std::span<A> dsinks;  // [H] dL/dsink (with sinks, after backward()): the same on every rank
};

// One pass on this rank: wall time, time in the kernels, time blocked on transfers, work done.
struct PassReport {
  double total_s = 0, compute_s = 0, wait_s = 0;
  double flops = 0;
};

struct AttentionReport {
  PassReport forward, backward;
  core::Ledger ledger;       // what this rank sent and received, counted as it moved
  Index resident_bytes = 0;  // every buffer the strategy holds on this rank
};

class Attention {
 public:
  // Collective over `comm`: checks the options on every rank, and that every rank was given the
  // same ones; builds the layout, the mask and the strategy. Throws InputError on every rank.
  Attention(comm::Comm comm, const AttentionOptions& options);
  // The same, with errors naming the options in another front end's words (the Python binding's).
  // `check` runs on every rank once the plan is built and before the strategy allocates its
  // buffers: a front end's own check of its inputs against the plan (its shard's length, say). Its
  // InputError is agreed like the plan's own.
  Attention(comm::Comm comm, const AttentionOptions& options, const runtime::OptionNames& names,
            core::FunctionRef<void(const Attention&)> check = {});
  ~Attention();
  Attention(Attention&&) noexcept;
  Attention& operator=(Attention&&) noexcept;

  int rank() const;
  int ranks() const;
  const comm::Comm& comm() const;
  const core::Shape& shape() const;
  core::DType dtype() const;
  double scale() const;
  const core::Layout& layout() const;
  const core::Mask& mask() const;
  Index local_size() const;                  // L
  std::span<const Index> positions() const;  // this rank's global positions, increasing

  // This rank's shard, in the plan's dtype (copied). Collective: a size that does not match the
  // shape and this rank's L, or the wrong dtype, throws InputError on every rank.
  void load(std::span<const float> q, std::span<const float> k, std::span<const float> v);
  void load(std::span<const double> q, std::span<const double> k, std::span<const double> v);
  void load(std::span<const core::bf16> q, std::span<const core::bf16> k, std::span<const core::bf16> v);
  void load(std::span<const core::f16> q, std::span<const core::f16> k, std::span<const core::f16> v);
  // Collective, after load().
  void forward();
  // dL/dO of this rank's positions (copied), and optionally dL/dLSE [B, H, L] in the accumulation
  // type (empty: LSE has no gradient; a rank may give one while another does not). Collective,
  // after forward().
  void backward(std::span<const float> dout, std::span<const float> dlse = {});
  void backward(std::span<const double> dout, std::span<const double> dlse = {});
  void backward(std::span<const core::bf16> dout, std::span<const float> dlse = {});
  void backward(std::span<const core::f16> dout, std::span<const float> dlse = {});

  // New values for the plan's sinks (the same on every rank, one per query head), for the next
  // forward(): a training step's updated logits without a new plan. Collective; InputError on every
  // rank for values the plan would refuse, or when the plan has no sinks.
  void set_sinks(std::span<const double> sinks);
  bool has_backward() const;

  // Instead of this rank's next load(), forward() or backward(), when it cannot make that call (its
  // own input failed to convert, say): joins the agreement the call begins with, so the call throws
  // AgreedFailure(why) on every other rank, and this one throws it too, instead of leaving the
  // others waiting.
  [[noreturn]] void refuse(const std::string& why);

  // This rank's outputs; dq, dk, dv after backward(); with RoPE they are the gradients of q and k
  // as loaded. Local: a span of the wrong size or type throws InputError on this rank only.
  void outputs(const Outputs<float>& out) const;
  void outputs(const Outputs<double>& out) const;

  AttentionReport report() const;

  struct Impl;

 private:
  Impl& self() const;  // the state; InputError when moved from
  std::unique_ptr<Impl> impl_;
};

// ---- inference -------------------------------------------------------------------------------------
//
// A KV cache sharded by position over the ranks of a communicator, one per attention layer:
//   ringattn::KVCacheOptions co;
//   co.batch = B;  co.heads = H;  co.kv_heads = HKV;  co.head_dim = D;  co.dtype = "bf16";
//   ringattn::KVCache<ringattn::core::bf16> cache(ringattn::communicator(mpi_comm), co);  // collective
//   auto pos = cache.positions(S0);          // this rank's prompt positions, increasing
//   cache.prefill(S0, q, k, v, o, lse);      // its shard of the prompt: q [B, L, H, D], k, v [B, L, HKV, D]
//   cache.decode(q1, k1, v1, o1, lse1);      // T new tokens, the same on every rank: q1 [B, T, H, D], ...
// prefill runs the causal ring forward over the prompt (o [B, L, H, D], lse [B, H, L], either may be
// empty) and keeps its K/V; load() keeps them without attending. decode() appends the new K/V to
// the ranks that own their positions (round-robin from the prompt's end), attends the T queries
// (causal among them) to every rank's shard and merges the partial states in one collective
// (options.merge): every rank gets the same o [B, T, H, D] and lse [B, H, T], bit for bit. o and
// lse are in the accumulation type. Every call is collective; bad input (a size that does not
// match, T = 0, tokens that differ between ranks, a cache over its capacity) throws InputError on
// every rank.
using KVCacheOptions = runtime::KVCacheOptions;
using DecodeStats = runtime::DecodeStats;

template <class S>  // float, double, core::bf16 or core::f16: the storage that options.dtype names
class KVCache {
 public:
  using A = core::accum_t<S>;
  KVCache(comm::Comm comm, const KVCacheOptions& options);
  ~KVCache();
  KVCache(KVCache&&) noexcept;
  KVCache& operator=(KVCache&&) noexcept;

  std::vector<Index> positions(Index prompt_len) const;  // this rank's positions of a prompt
  void prefill(Index prompt_len, std::span<const S> q, std::span<const S> k, std::span<const S> v,
               std::span<A> o = {}, std::span<A> lse = {});
  void load(Index prompt_len, std::span<const S> k, std::span<const S> v);
  DecodeStats decode(std::span<const S> q, std::span<const S> k, std::span<const S> v, std::span<A> o,
                     std::span<A> lse = {});

  Index length() const;           // positions in the cache, over all ranks
  Index local_positions() const;  // those this rank holds
  Index resident_bytes() const;   // this rank's cache memory

 private:
  std::unique_ptr<comm::Comm> comm_;  // the shard keeps a reference to it
  std::unique_ptr<runtime::KVCacheShard<S>> shard_;
};

extern template class KVCache<float>;
extern template class KVCache<double>;
extern template class KVCache<core::bf16>;
extern template class KVCache<core::f16>;

}  // namespace ringattn
