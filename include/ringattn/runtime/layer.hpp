#pragma once
// A whole attention layer over the ranks: shared projections around the attention strategy.
//   per rank: X, Y, dY, dX [B, L, M] (its positions, file order); weights whole on every rank:
//   Wq [M, H*D], Wk and Wv [M, HKV*D], Wo [H*D, M]. Head h owns columns h*D .. h*D+D-1, so
//   Q = X Wq as [B, L, H*D] is exactly the attention layout [B, L, H, D] (no reshuffle).
// Forward:  Q = X Wq, K = X Wk, V = X Wv; optional RoPE on Q and K at global positions;
//           attention O (the strategy); Y = O Wo.
// Backward: dO = dY Wo^T; attention backward (dK, dV summed at their owner); RoPE backward on
//           dQ, dK; dX = dQ Wq^T + dK Wk^T + dV Wv^T; weight gradients X^T dQ, X^T dK, X^T dV, O^T dY.
// The ranks compute one sequence together (not DDP replicas), so each weight gradient is the SUM
// of the ranks' partials, reduced in a fixed order (comm::OrderedAllreduce): bitwise the same on
// every rank and every run. dWo needs nothing from the attention backward, so its reduction starts
// before it and completes after; the stats say how much of it stayed exposed.
//
// Types: the layer computes in A = accum_t<S> (its GEMMs, its outputs and weight gradients); the
// attention's operands Q, K, V and dO are held and sent in the storage type S.
#include <memory>
#include <optional>
#include <span>

#include "ringattn/comm/reduce.hpp"
#include "ringattn/core/aligned.hpp"
#include "ringattn/core/rope.hpp"
#include "ringattn/runtime/strategy.hpp"

namespace ringattn::runtime {

struct LayerSetup {
  StrategySetup attention;  // shape, layout, mask, scale, tiling, strategy, hooks
  Index M = 0;              // model dim
  std::optional<double> rope;  // RoPE base THETA
  bool backward = true;
  // Test hooks: divide the summed weight gradients by N (DDP's averaging, wrong for one sequence
  // split over ranks); rotate with local indices 0..L-1 instead of global positions.
  bool average_weight_grads = false;
  bool rope_local_positions = false;
};

struct LayerStats {
  double total_s = 0;
  double gemm_s = 0;  // projections and their gradients (Eigen GEMMs)
  double rope_s = 0;
  PassStats attention;
  comm::ReduceStats dwo, dwqkv;  // backward only: dWo, and [dWq | dWk | dWv] as one buffer
  bool dwo_done_by_attention_end = false;  // dWo's reduction had completed when the attention backward ended
};

template <class S>
class Layer {
 public:
  using A = core::accum_t<S>;
  // Collective: every rank constructs its layer (the reductions duplicate the communicator).
  Layer(const comm::Comm& comm, const LayerSetup& setup);

  // x, dy [B, L, M] this rank's positions in file order (dy may be null without a backward pass);
  // wq [M, H*D], wk, wv [M, HKV*D], wo [H*D, M] whole. Copied into aligned buffers.
  void load(const A* x, const A* wq, const A* wk, const A* wv, const A* wo, const A* dy);
  LayerStats forward();
  LayerStats backward();  // after forward()

  // y, dx [B, L, M] local; the weight gradients are whole and identical (bitwise) on every rank.
  std::span<const A> y() const { return y_; }
  std::span<const A> dx() const { return dx_; }
  std::span<const A> dwq() const { return {dw_.data(), size_t(M_ * HD_)}; }
  std::span<const A> dwk() const { return {dw_.data() + M_ * HD_, size_t(M_ * KD_)}; }
  std::span<const A> dwv() const { return {dw_.data() + M_ * (HD_ + KD_), size_t(M_ * KD_)}; }
  std::span<const A> dwo() const { return dwo_; }
  // The attention's outputs of this rank (file order), and the strategy itself.
  void attention_outputs(A* o, A* lse, A* dq, A* dk, A* dv) const;
  const Strategy<S>& attention() const { return *attn_; }
  // Sees every event of the ring, forward and backward (ring strategy only).
  void set_observer(RingObserver<A>* obs) { attn_->set_observer(obs); }
  Index local_size() const { return L_; }

 private:
  const comm::Comm& comm_;
  LayerSetup s_;
  std::unique_ptr<Strategy<S>> attn_;
  std::optional<core::Rope> rope_;
  Index L_, BL_, M_, HD_, KD_;
  double dout_s_ = 0;  // time of dO = dY Wo^T, computed in forward() but charged to backward()
  core::AlignedVector<A> x_, wq_, wk_, wv_, wo_, dy_;
  core::AlignedVector<A> q_, k_, v_, dout_, o_, y_;
  core::AlignedVector<S> qs_, ks_, vs_, douts_;  // the attention's operands in the storage type
  core::AlignedVector<A> dq_, dk_, dv_, dx_;
  core::AlignedVector<A> dw_part_, dw_, dwo_part_, dwo_;  // [dWq | dWk | dWv] and dWo
  comm::OrderedAllreduce<A> red_dwo_, red_dw_;
};

}  // namespace ringattn::runtime
