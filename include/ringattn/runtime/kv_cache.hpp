#pragma once
// Inference over a KV cache sharded by position across the ranks of a communicator.
//
// Prefill: each rank passes its shard of a prompt of S0 positions (the positions the plan's layout
// gives it: auto is zigzag, the cache being causal); the causal ring forward gives O and LSE for
// them, and their K/V stay here. Decode: every rank passes the same T new tokens
// (q [B, T, H, D], k, v [B, T, HKV, D]) at positions S0 + n .. S0 + n + T - 1; position p's K/V go
// to rank (p - S0) mod N, so the shards stay balanced as the cache grows. Every rank attends the T
// queries to its shard (causal among the new tokens, the window respected) into a partial online
// state (m, l, a), and one all-reduce of the N partial states, B T H (D + 2) values each, merges
// them on every rank:
//   m = max_r m_r,  l = sum_r l_r 2^(m_r - m),  a = sum_r a_r 2^(m_r - m),  O = a / l
// in the accumulation type (f32 for 16-bit storage), so the error stays flat in N. A rank that
// sees nothing has m_r = -inf and adds nothing.
//
// The all-reduce is ringattn's own recursive doubling with fixed partners (comm/state_merge.hpp):
// the merge of two states is exactly commutative, so both partners of a round hold the same bits,
// and the tree depends on N alone: every rank returns bitwise the same O, on every run with that N
// (MPI_Allreduce with a user operation promises neither). merge = "gather" (one all-gather, merged
// in rank order) is kept to measure against: as fast at N = 2, but it moves N times the state and
// stops scaling past N of about 64 (docs/inference.md has the numbers).
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/aligned.hpp"
#include "ringattn/core/block_attention.hpp"
#include "ringattn/runtime/plan.hpp"

namespace ringattn::runtime {

struct KVCacheOptions {
  Index batch = 1, heads = 1, kv_heads = 1, head_dim = 1;
  std::string dtype = "f32";    // storage of q, k, v and the cache
  std::string layout = "auto";  // the prompt's layout over the ranks (auto: zigzag; contiguous with a window)
  std::optional<Index> window;  // causal sliding window W
  std::optional<double> scale;  // default 1/sqrt(D)
  std::optional<Index> capacity;  // positions the cache may hold in all (prompt + decoded); empty: no limit
  std::optional<double> timeout_s;
  core::Tiling tiling;
  std::string merge = "allreduce";  // allreduce (recursive doubling, fixed order) or gather (all-gather, merged in rank order)
};

// What one decode step did on this rank.
struct DecodeStats {
  double step_s = 0, attend_s = 0, merge_s = 0;
  Index kv_bytes = 0;  // the cache bytes this rank's attention read
};

// The merge of a decode step, collective: every rank's partial state of `rows` query rows
// (m [rows] | l [rows] | a [rows, D], the kernels' units) into `merged` (the same layout), the
// same on every rank. `merge` is KVCacheOptions::merge.
template <class A>
void merge_partial_states(const comm::Comm& comm, const std::string& merge, Index rows, Index D,
                          const std::vector<A>& state, std::vector<A>& merged);

// The watchdog a front end sets while a prompt of prompt_len positions goes in over N ranks:
// o.timeout_s, or the plan's default for the prompt's causal forward (default_timeout), which also
// covers the decode steps after it (each lighter than the prompt).
double prompt_timeout(const KVCacheOptions& o, Index prompt_len, int N);

template <class S>
class KVCacheShard {
 public:
  using Storage = S;
  using A = core::accum_t<S>;
  // Collective over `comm`; checks the options (OptionError in `names`' words).
  KVCacheShard(const comm::Comm& comm, const KVCacheOptions& o, const OptionNames& names);

  // This rank's positions of a prompt of `prompt_len` positions.
  std::vector<Index> prompt_positions(Index prompt_len) const;
  // Collective: this rank's shard of the prompt (file order [B, L, H|HKV, D]); writes o [B, L, H, D]
  // and lse [B, H, L] (either may be null). Once, before any decode.
  void prefill(Index prompt_len, const S* q, const S* k, const S* v, A* o, A* lse);
  // Collective: the prompt's K/V only (this rank's positions, as prefill takes them), kept without
  // attending: K/V computed elsewhere, or a prompt too long to attend here. Once, before any decode.
  void load(Index prompt_len, const S* k, const S* v);
  // Collective: T new tokens, the same on every rank; o [B, T, H, D], lse [B, H, T].
  DecodeStats decode(Index T, const S* q, const S* k, const S* v, A* o, A* lse);

  Index length() const { return prompt_len_ + decoded_; }        // positions in the cache (all ranks)
  Index local_positions() const { return L0_ + Index(dec_pos_used_); }  // held by this rank
  Index resident_bytes() const;
  const KVCacheOptions& options() const { return o_; }
  int rank() const { return comm_.rank(); }
  int ranks() const { return comm_.size(); }

 private:
  core::KVBlock<S> prompt_block() const;
  core::KVBlock<S> decoded_block() const;
  AttentionPlan agreed_prompt_plan(Index prompt_len, PlanOptions& p, bool attend);  // checks, agreed by every rank
  void keep_prompt(const AttentionPlan& plan, const S* k, const S* v);  // K/V in, decode slots ready

  const comm::Comm& comm_;
  KVCacheOptions o_;
  const OptionNames& names_;
  core::Shape s_;       // B, H, HKV, D (S: the prompt's)
  double scale_ = 1;
  core::Mask mask_;     // causal (and the window), over positions of any length
  Index prompt_len_ = 0, decoded_ = 0;
  bool prefilled_ = false;
  Index L0_ = 0;        // this rank's prompt positions
  std::vector<Index> pos0_;                 // their global positions
  core::AlignedVector<S> kv0_;              // their K | V, packed [B, HKV, L0, D] each
  Index cap_ = 0;                            // decoded positions this rank can hold
  std::size_t dec_pos_used_ = 0;
  std::vector<Index> dec_pos_;               // [cap_]: global positions; unused slots lie in the future
  core::AlignedVector<S> kv_dec_;            // K | V, packed [B, HKV, cap_, D] each
};

}  // namespace ringattn::runtime
