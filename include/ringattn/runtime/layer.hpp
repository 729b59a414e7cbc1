#pragma once
// A whole attention layer over the ring: shared projections around ring attention.
//   per rank: X, Y, dY, dX [B, L, M] (its positions, file order); weights whole on every rank:
//   Wq [M, H*D], Wk and Wv [M, HKV*D], Wo [H*D, M]. Head h owns columns h*D .. h*D+D-1, so
//   Q = X Wq as [B, L, H*D] is exactly the attention layout [B, L, H, D] (no reshuffle).
// Forward:  Q = X Wq, K = X Wk, V = X Wv; optional RoPE on Q and K at global positions;
//           ring attention O; Y = O Wo.
// Backward: dO = dY Wo^T; ring backward (dK, dV summed at their owner); RoPE backward on dQ, dK;
//           dX = dQ Wq^T + dK Wk^T + dV Wv^T; weight gradients X^T dQ, X^T dK, X^T dV, O^T dY.
// The ranks compute one sequence together (not DDP replicas), so each weight gradient is the SUM
// of the ranks' partials, reduced in a fixed order (comm::OrderedAllreduce): bitwise the same on
// every rank and every run. dWo needs nothing from the ring backward, so its reduction starts
// before it and completes after; the stats say how much of it stayed exposed.
#include <optional>
#include <span>

#include "ringattn/comm/reduce.hpp"
#include "ringattn/core/aligned.hpp"
#include "ringattn/core/rope.hpp"
#include "ringattn/runtime/job.hpp"
#include "ringattn/runtime/ring_attention.hpp"

namespace ringattn::runtime {

struct LayerSetup {
  RingSetup ring;  // shape, layout, mask, scale, tiling, timeout, traffic, ring test hooks
  Index M = 0;     // model dim
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
  PassStats ring;
  comm::ReduceStats dwo, dwqkv;  // backward only: dWo, and [dWq | dWk | dWv] as one buffer
  bool dwo_done_by_ring_end = false;  // dWo's reduction had completed when the ring backward ended
};

template <class T>
class Layer {
 public:
  // Collective: every rank constructs its layer (the reductions duplicate the communicator).
  Layer(const comm::Comm& comm, const LayerSetup& setup);

  // x, dy [B, L, M] this rank's positions in file order (dy may be null without a backward pass);
  // wq [M, H*D], wk, wv [M, HKV*D], wo [H*D, M] whole. Copied into aligned buffers.
  void load(const T* x, const T* wq, const T* wk, const T* wv, const T* wo, const T* dy);
  LayerStats forward();
  LayerStats backward();  // after forward()

  // y, dx [B, L, M] local; the weight gradients are whole and identical (bitwise) on every rank.
  std::span<const T> y() const { return y_; }
  std::span<const T> dx() const { return dx_; }
  std::span<const T> dwq() const { return {dw_.data(), size_t(M_ * HD_)}; }
  std::span<const T> dwk() const { return {dw_.data() + M_ * HD_, size_t(M_ * KD_)}; }
  std::span<const T> dwv() const { return {dw_.data() + M_ * (HD_ + KD_), size_t(M_ * KD_)}; }
  std::span<const T> dwo() const { return dwo_; }
  const RingAttention<T>& ring() const { return ring_; }
  // Sees every event of the ring, forward and backward.
  void set_observer(RingObserver<T>* obs) {
    observer_ = obs;
    ring_.set_observer(obs);
  }
  Index local_size() const { return L_; }

 private:
  const comm::Comm& comm_;
  LayerSetup s_;
  RingAttention<T> ring_;
  RingObserver<T>* observer_ = nullptr;
  std::optional<core::Rope> rope_;
  Index L_, BL_, M_, HD_, KD_;
  double dout_s_ = 0;  // time of dO = dY Wo^T, computed in forward() but charged to backward()
  core::AlignedVector<T> x_, wq_, wk_, wv_, wo_, dy_;
  core::AlignedVector<T> q_, k_, v_, dout_, o_, y_;
  core::AlignedVector<T> dq_, dk_, dv_, dx_;
  core::AlignedVector<T> dw_part_, dw_, dwo_part_, dwo_;  // [dWq | dWk | dWv] and dWo
  comm::OrderedAllreduce<T> red_dwo_, red_dw_;
};

// `ringattn run --layer`: every `run` option applies (shape, mask, layout, --inputs, --out,
// --check, --report, --warmup/--iters, --timeout) except --trace.
struct LayerConfig {
  JobConfig job;                   // job.rope: RoPE base THETA
  std::optional<Index> model_dim;  // M; required unless --inputs gives it
  bool average_weight_grads = false;  // test hooks, see LayerSetup
  bool rope_local_positions = false;
};

// Returns the exit code (0 ok, 1 check failed); throws InputError (agreed by every rank) or
// RuntimeFailure as run_job does.
int run_layer_job(const comm::Comm& comm, const LayerConfig& cfg);

}  // namespace ringattn::runtime
