#pragma once
// Ring attention on one rank: the forward pass rotates K/V blocks around the ring, the backward
// pass replays them and returns each dK/dV contribution straight to the block's owner.
//
// Step indexing (both passes): at step j = 0 .. N-1 rank r holds the K/V block of owner
// (r - j) mod N; it receives the next one from r-1 and sends the current one to r+1 while it
// computes. The RingPlan decides which of these transfers happen (all of them, or only those
// some rank needs) and how many steps the ring runs. In the backward pass, after step j it sends
// its contribution for block (r - j) to that owner and receives from (r + j) mod N the
// contribution to its own block; the owner adds them in step order after its own, so results are
// bitwise reproducible for a given N and layout.
//
// Types: Q, K, V, dO and the K/V blocks on the wire are in the storage type S; the online state,
// O, LSE, dQ and every dK/dV contribution (on the wire too) are in A = accum_t<S>, so a gradient
// summed over N owners does not lose precision with N.
#include <vector>

#include "ringattn/core/aligned.hpp"
#include "ringattn/runtime/strategy.hpp"

namespace ringattn::comm {
class Exchange;
}

namespace ringattn::runtime {

template <class S>
class RingSteps;

template <class S>
class RingAttention final : public Strategy<S> {
 public:
  using A = core::accum_t<S>;
  // `comm` is the ring: rank r of it owns setup.layout's shard r (a head-parallel strategy passes
  // a sub-communicator and a layout over groups of ranks).
  RingAttention(const comm::Comm& comm, const StrategySetup& setup);

  void load(const S* q, const S* k, const S* v) override;
  void load_dout(const S* dout) override;
  void load_dlse(const A* dlse) override;
  void add_sink_grad(double* dsinks) const override;
  void set_observer(RingObserver<A>* obs) override { obs_ = obs; }
  const core::RingPlan& plan() const { return plan_; }
  PassStats forward() override;
  PassStats backward() override;
  void outputs(A* o, A* lse, A* dq, A* dk, A* dv) const override;
  const core::Ledger& ledger() const override { return ledger_; }
  Index local_size() const override { return L_; }
  Index resident_bytes() const override;

 private:
  core::Packing packing(int owner) const;  // a K/V block of `owner`
  Index block_elems(int owner) const { return 2 * packing(owner).kv_elems(); }
  core::KVBlock<S> view(int owner, const S* kv) const;
  void allocate_backward();  // once, on first use
  // Step j's K/V traffic, the same in both passes (`tag` tells them apart): the block of step j+1
  // is received into the buffer `cur` is not in while `cur`, step j's block, goes on to the next
  // rank; then the wait for both, which returns the block of step j+1 (`cur` when none arrives).
  void post_kv(comm::Exchange& kvx, RingSteps<S>& step, int j, const S* cur, int tag);
  const S* wait_kv(comm::Exchange& kvx, RingSteps<S>& step, int j, const S* cur, const char* pass);

  const comm::Comm& comm_;
  StrategySetup s_;
  core::RingPlan plan_;
  RingObserver<A>* obs_ = nullptr;
  int r_, N_;
  Index L_;
  core::Packing pq_;
  core::QueryShard<S> qshard_;
  core::AlignedVector<S> q_, kv_own_, dout_;
  core::AlignedVector<A> m_, l_, acc_;  // online state; after finalize: O in acc_ (m, l kept for the backward)
  core::AlignedVector<A> lse_;          // row stats: m + log l, natural log
  core::AlignedVector<A> delta_, dq_, dkv_own_;
  core::AlignedVector<A> dlse_;         // row stats: dL/dLSE when given (has_dlse_)
  bool has_dlse_ = false;
  core::AlignedVector<S> kv_buf_[2];    // the two remote K/V buffers
  core::AlignedVector<A> grad_send_[2], grad_recv_;
  core::Workspace<A> ws_;
  core::Ledger ledger_;
  bool backward_ready_ = false;
};

}  // namespace ringattn::runtime
