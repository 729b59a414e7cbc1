#pragma once
// Head-parallel attention: Ulysses (all-to-all over heads) and USP (Ulysses groups joined by a ring).
//
// N = U x R ranks. Rank r is member u = r mod U of Ulysses group g = r div U (consecutive ranks,
// i.e. one node when a hostfile fills nodes in order); member u of every group forms ring u of R
// ranks. Forward, on every rank:
//   phase 1: all-to-all inside the group: each rank sends member v the q, k, v of its own positions
//           for v's heads (core::HeadSplit), and receives from every member its positions for its
//           own heads, so it holds the group's positions (their union, in global order) for H/U
//           query heads and the kv heads they read;
//   phase 2: the ring (RingAttention) over the R groups on that head slice, with a layout whose
//           shard g is group g's positions; masks read global positions, so they hold unchanged.
//           With R = 1 (ulysses, U = N) this is attention over all S positions on one rank;
//   phase 3: all-to-all back: O and LSE of each member's positions return to it.
// Backward: dO goes as q did (and dL/dLSE, when given, as LSE came: B Hu L more elements of the
// accumulation type per member); the ring's backward; dQ, dK, dV return to the owners of the
// positions, which sum the dK/dV of replicated kv heads in a fixed order (member, then copy), so
// results are bitwise reproducible for a given N, U and layout.
//
// Timing-only (simulation): no values are rearranged; the all-to-alls move their full sizes and the
// ring charges its counted flops, so the simulated time is that of the transfers and the kernels.
//
// Types: q, k, v and dO travel in the storage type S; O, LSE, dQ, dK and dV return in
// A = accum_t<S>, as the ring returns its gradients.
#include <memory>
#include <vector>

#include "ringattn/core/aligned.hpp"
#include "ringattn/core/head_split.hpp"
#include "ringattn/runtime/ring_attention.hpp"

namespace ringattn::runtime {

template <class S>
class UlyssesAttention final : public Strategy<S> {
 public:
  using A = core::accum_t<S>;
  // setup.ulysses_degree is U (setup.kind ulysses: U = N); U divides N and H (the caller checks).
  UlyssesAttention(const comm::Comm& comm, const StrategySetup& setup);

  void load(const S* q, const S* k, const S* v) override;
  void load_dout(const S* dout) override;
  void load_dlse(const A* dlse) override;
  void add_sink_grad(double* dsinks) const override;
  PassStats forward() override;
  PassStats backward() override;
  void outputs(A* o, A* lse, A* dq, A* dk, A* dv) const override;
  const core::Ledger& ledger() const override { return ledger_; }
  Index local_size() const override { return L_; }
  Index resident_bytes() const override;

 private:
  // Elements of one member's slice of a position: q-like Hu D, the kv heads 2 HKVu D.
  Index q_row() const { return hs_.Hu * s_.shape.D; }
  Index kv_row() const { return hs_.HKVu * s_.shape.D; }
  // One all-to-all inside the group; counts and displacements in elements of T. Returns its wait.
  template <class T>
  double exchange(Pass pass, const core::AlignedVector<T>& send, const std::vector<Index>& send_counts,
                  core::AlignedVector<T>& recv, const std::vector<Index>& recv_counts, const char* what,
                  StepRecord& rec);
  void fold_ledger();
  PassStats finish_pass(const StepRecord& in, const PassStats& ring, const StepRecord& out, double t_pass);

  StrategySetup s_;
  int r_, U_, u_;
  Index L_;                     // this rank's positions
  core::HeadSplit hs_;
  comm::Comm group_, ring_;     // the Ulysses group (rank u) and this member's ring (rank g)
  core::Layout group_layout_;   // shard g = group g's positions
  Index Lg_;                    // the group's positions
  std::vector<std::vector<Index>> gidx_;  // [U][L_w]: member w's positions as group-local indices
  std::vector<Index> Lw_;                 // [U] shard sizes of the members
  StrategySetup inner_setup_;
  std::unique_ptr<RingAttention<S>> inner_;
  // Send and receive buffers (member-major), and the group's tensors of this member's heads. Of the
  // kernels' storage kind, so a timing-only simulation folds them like the ring's.
  core::AlignedVector<S> qkv_send_, qkv_recv_, dout_send_, dout_recv_;
  core::AlignedVector<S> q_g_, k_g_, v_g_, dout_g_;      // [B, Lg, Hu | HKVu, D]
  core::AlignedVector<A> o_g_, lse_g_, dq_g_, dk_g_, dv_g_;  // the ring's outputs: [B, Lg, .., D], lse [B, Hu, Lg]
  core::AlignedVector<A> out_send_, out_recv_;               // their way back to the owners
  core::AlignedVector<A> dlse_send_, dlse_recv_, dlse_g_;    // dL/dLSE when given: [U][B, Hu, L], ..., [B, Hu, Lg]
  bool has_dlse_ = false;
  core::AlignedVector<A> o_, lse_, dq_, dk_, dv_;        // this rank's outputs, file order
  core::Ledger ledger_;
  bool backward_ready_ = false;
  core::Ledger a2a_;             // the all-to-alls' fields
  Index a2a_bytes_[2][2] = {};   // the all-to-alls' bytes [pass][send, recv]
};

}  // namespace ringattn::runtime
