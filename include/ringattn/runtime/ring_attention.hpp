#pragma once
// Ring attention on one rank: the forward pass rotates K/V blocks around the ring, the backward
// pass replays them and returns each dK/dV contribution straight to the block's owner.
//
// Step indexing (both passes): at step j = 0 .. N-1 rank r holds the K/V block of owner
// (r - j) mod N; it receives the next one from r-1 and sends the current one to r+1 while it
// computes. The RingPlan decides which of these transfers happen (all of them, or only those
// some rank needs) and how many steps the ring runs. In the backward pass, after step j it sends its contribution for block (r - j) to
// that owner and receives from (r + j) mod N the contribution to its own block; the owner adds
// them in step order after its own, so results are bitwise reproducible for a given N and layout.
#include <functional>
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/layout.hpp"
#include "ringattn/core/ledger.hpp"
#include "ringattn/core/ring_plan.hpp"

namespace ringattn::runtime {

using core::Index;

enum class Pass { forward = 0, backward = 1 };

// Sees every event of one rank as it happens (the `lab` walkthrough records them). Packed
// layouts as in core/packed.hpp. The running max m is in the kernel's units: natural log for
// double, log2 for float (multiply by ln 2).
template <class T>
class RingObserver {
 public:
  virtual ~RingObserver() = default;
  // After the forward folded the block of `owner` into the running state (m, l, a).
  virtual void forward_block(int /*step*/, int /*owner*/, const core::Packing& /*pq*/, const T* /*m*/,
                             const T* /*l*/, const T* /*acc*/) {}
  // After the replay computed this rank's contribution to the block of `owner`.
  virtual void replay_block(int /*step*/, int /*owner*/, const core::Packing& /*pk*/, const T* /*dk*/,
                            const T* /*dv*/) {}
  // A contribution sent back to its owner (to), or one received for this rank's block (from).
  virtual void grad_sent(int /*step*/, int /*to*/, core::Index /*elems*/) {}
  virtual void grad_received(int /*step*/, int /*from*/, core::Index /*elems*/) {}
};

struct RingSetup {
  core::Shape shape;
  const core::Layout* layout = nullptr;
  const core::Mask* mask = nullptr;
  double scale = 1.0;
  core::Tiling tiling;
  double timeout_s = 0;  // watchdog on every wait; 0 = none
  core::Traffic traffic = core::Traffic::aware;
  // Test hooks: the owner ignores the gradient contribution received at this step (-1: none);
  // rank stall_rank sleeps stall_s seconds before its first forward send.
  int drop_grad_step = -1;
  int stall_rank = -1;
  double stall_s = 0;
  // Called as each pass starts (done = 0) and after every ring step with (pass, steps done,
  // steps in the pass); may be empty.
  std::function<void(int pass, int done, int steps)> on_step = nullptr;
};

struct StepRecord {
  Pass pass;
  int step;
  int src;           // owner of the K/V block attended at this step
  double compute_s;  // time in the block kernel (including progress polls)
  double wait_s;     // time blocked on transfers that had not completed (exposed communication)
  Index bytes;       // bytes sent + received during this step
};

struct PassStats {
  double total_s = 0, compute_s = 0, wait_s = 0;
  core::Work work;
  std::vector<StepRecord> steps;
};

template <class T>
class RingAttention {
 public:
  RingAttention(const comm::Comm& comm, const RingSetup& setup);

  // Local inputs in file order: q, dout [B, L, H, D]; k, v [B, L, HKV, D] (dout may be null
  // when there is no backward pass: the backward's buffers are then never allocated).
  void load(const T* q, const T* k, const T* v, const T* dout);
  void set_observer(RingObserver<T>* obs) { obs_ = obs; }
  const core::RingPlan& plan() const { return plan_; }
  PassStats forward();
  PassStats backward();  // after forward()
  // Local outputs in file order: o, dq [B, L, H, D]; lse [B, H, L]; dk, dv [B, L, HKV, D].
  // Any pointer may be null.
  void outputs(T* o, T* lse, T* dq, T* dk, T* dv) const;
  // What moved during the last forward (and backward), counted as it moved.
  const core::Ledger& ledger() const { return ledger_; }
  Index local_size() const { return L_; }
  // Bytes of every buffer this rank holds for the ring (its memory budget).
  Index resident_bytes() const;

 private:
  core::Packing packing(int owner) const;  // a K/V block of `owner`
  Index block_elems(int owner) const { return 2 * packing(owner).kv_elems(); }
  core::KVBlock<T> view(int owner, const T* kv) const;
  void allocate_backward();  // once, on first use

  const comm::Comm& comm_;
  RingSetup s_;
  core::RingPlan plan_;
  RingObserver<T>* obs_ = nullptr;
  int r_, N_;
  Index L_;
  core::Packing pq_;
  core::QueryShard<T> qshard_;
  core::AlignedVector<T> q_, kv_own_, dout_;
  core::AlignedVector<T> m_, l_, acc_;  // online state; after finalize: lse in m_, O in acc_
  core::AlignedVector<T> delta_, dq_, dkv_own_;
  core::AlignedVector<T> kv_buf_[2];    // the two remote K/V buffers
  core::AlignedVector<T> grad_send_[2], grad_recv_[2];
  core::Workspace<T> ws_;
  core::Ledger ledger_;
  bool backward_ready_ = false;
};

}  // namespace ringattn::runtime
