#pragma once
// Everything the ring's step loop records and injects beside the algorithm, in one object: the
// ledger, each step's record and timings, timing-only mode (a kernel's counted flops charged to the
// simulated host instead of computed), the observer, progress and the fault hooks. The loop in
// ring.cpp then shows only the algorithm: post the transfers, attend the block, wait.
#include <chrono>
#include <thread>

#include "ringattn/comm/comm.hpp"
#include "ringattn/comm/simulation.hpp"
#include "ringattn/runtime/strategy.hpp"

namespace ringattn::runtime {

template <class S>
class RingSteps {
 public:
  using A = core::accum_t<S>;

  // One pass of `steps` steps on ring rank `rank`; the pass's counts in `ledger` start from zero.
  RingSteps(const StrategySetup& setup, int rank, core::Ledger& ledger, RingObserver<A>* obs, Pass pass, int steps)
      : s_(setup), rank_(rank), ledger_(ledger), obs_(obs), pass_(pass), steps_(steps), t_pass_(comm::wtime()) {
    if (pass == Pass::forward) {
      ledger_.fwd_kv_send_elems = ledger_.fwd_kv_recv_elems = ledger_.remote_block_elems = 0;
    } else {
      ledger_.replay_kv_send_elems = ledger_.replay_kv_recv_elems = 0;
      ledger_.grad_send_elems = ledger_.grad_recv_elems = 0;
    }
    if (s_.on_step) s_.on_step(static_cast<int>(pass), 0, steps);
  }

  // Whether kernels run (false: a timing-only simulation, which has no values).
  bool computes() const { return !s_.timing_only; }

  // Step j begins: it attends the block of `owner`.
  void begin(int j, int owner, Phase phase = Phase::ring) {
    rec_ = StepRecord{pass_, j, owner, 0, 0, 0, phase};
    if (pass_ == Pass::forward && j == 0 && rank_ == s_.hooks.stall_rank)
      std::this_thread::sleep_for(std::chrono::duration<double>(s_.hooks.stall_s));
  }

  // A K/V block of `elems` storage elements posted to arrive (for the next step) or to leave.
  void kv_received(Index elems) {
    if (pass_ == Pass::forward) {
      ledger_.fwd_kv_recv_elems += elems;
      ledger_.remote_block_elems = std::max(ledger_.remote_block_elems, elems);
    } else {
      ledger_.replay_kv_recv_elems += elems;
    }
    rec_.bytes += elems * Index(sizeof(S));
  }
  void kv_sent(Index elems) {
    (pass_ == Pass::forward ? ledger_.fwd_kv_send_elems : ledger_.replay_kv_send_elems) += elems;
    rec_.bytes += elems * Index(sizeof(S));
  }

  // A dK/dV contribution of `elems` accumulation elements sent to its owner, or posted to arrive
  // from a peer; received(): it arrived and `summed` says whether it is added (a fault hook drops
  // the one of drop_grad_step).
  void grad_sent(int to, Index elems) {
    if (obs_) obs_->grad_sent(rec_.step, to, elems);
    ledger_.grad_send_elems += elems;
    rec_.bytes += elems * Index(sizeof(A));
  }
  void grad_posted(Index elems) {
    ledger_.grad_recv_elems += elems;
    rec_.bytes += elems * Index(sizeof(A));
  }
  bool grad_received(int step, int from, Index elems) {
    if (obs_) obs_->grad_received(step, from, elems);
    return step != s_.hooks.drop_grad_step && computes();
  }

  // Runs `kernel` (it returns the core::Work done) and times it; timing-only, charges what
  // `count` counts instead (a forward's work, times `factor`).
  template <class Kernel, class Count>
  void compute(Kernel&& kernel, Count&& count, double factor) {
    const double t0 = comm::wtime();
    if (computes()) {
      ps_.work += kernel();
    } else {
      core::Work w = count();
      w.flops *= factor;
      comm::charge_flops(w.flops);
      ps_.work += w;
    }
    rec_.compute_s += comm::wtime() - t0;
  }

  // The observer sees the running state after a forward block, a contribution after a replay.
  void forward_block(int owner, const core::Packing& pq, const A* m, const A* l, const A* acc) {
    if (obs_) obs_->forward_block(rec_.step, owner, pq, m, l, acc);
  }
  void replay_block(int owner, const core::Packing& pk, const A* dk, const A* dv) {
    if (obs_) obs_->replay_block(rec_.step, owner, pk, dk, dv);
  }

  // Bytes sent and received by a transfer the loop counts itself (the all-gather's collectives).
  void moved(Index bytes) { rec_.bytes += bytes; }

  // Time blocked on transfers that had not completed (exposed communication).
  void waited(double s) { rec_.wait_s += s; }

  // Step j ends: its record joins the pass; the caller's transfers progress; progress is shown.
  void end() {
    ps_.compute_s += rec_.compute_s;
    ps_.wait_s += rec_.wait_s;
    ps_.steps.push_back(rec_);
    if (s_.poll) s_.poll();
    if (s_.on_step) s_.on_step(static_cast<int>(pass_), rec_.step + 1, steps_);
  }

  // Time blocked after the last step (the last gradient returns), charged to that step.
  void waited_after(double s) {
    ps_.wait_s += s;
    if (!ps_.steps.empty()) ps_.steps.back().wait_s += s;
  }

  PassStats finish() {
    ps_.total_s = comm::wtime() - t_pass_;
    return ps_;
  }

 private:
  const StrategySetup& s_;
  int rank_;
  core::Ledger& ledger_;
  RingObserver<A>* obs_;
  Pass pass_;
  int steps_;
  double t_pass_;
  PassStats ps_;
  StepRecord rec_;
};

}  // namespace ringattn::runtime
