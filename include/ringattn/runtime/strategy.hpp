#pragma once
// How one attention call is spread over the ranks: the seam every parallel strategy plugs into.
//
// A Strategy holds one rank's part of one attention: it takes the rank's shard of q, k, v (and
// dO) in file order, runs the forward and the backward together with its peers, and hands back
// the rank's outputs, what moved (the ledger) and how each pass spent its time. The job harness,
// the layer and the library API only ever see this interface.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/layout.hpp"
#include "ringattn/core/ledger.hpp"
#include "ringattn/core/mask.hpp"
#include "ringattn/core/ring_plan.hpp"
#include "ringattn/core/storage.hpp"

namespace ringattn::runtime {

using core::Index;

enum class Pass { forward = 0, backward = 1 };

// One step of a pass on one rank: a ring step (attend one K/V block), an all-to-all, or one
// KV-head group of the all-gather strategy (wait for its gather, attend every block).
enum class Phase { ring = 0, a2a = 1, gather = 2 };
struct StepRecord {
  Pass pass = Pass::forward;
  int step = 0;
  int src = 0;            // ring: owner of the K/V block attended; all-to-all: -1
  double compute_s = 0;   // time in the block kernel (including progress polls)
  double wait_s = 0;      // time blocked on transfers that had not completed (exposed communication)
  Index bytes = 0;        // bytes sent + received during this step
  Phase phase = Phase::ring;
};

struct PassStats {
  double total_s = 0, compute_s = 0, wait_s = 0;
  double a2a_wait_s = 0;  // the part of wait_s spent in all-to-alls
  core::Work work;
  std::vector<StepRecord> steps;
};

enum class StrategyKind { ring, ulysses, usp, allgather };
const char* strategy_name(StrategyKind k);

// The Ulysses degree U a strategy uses on N ranks: ring 1, ulysses N, usp the one given.
int ulysses_degree(StrategyKind k, int given, int N);
// Whether K/V blocks travel a ring whose traffic a core::Traffic plan decides: ring, and usp's rings
// of N/U ranks (ulysses has rings of one rank; allgather sends every block to every rank).
bool has_ring_traffic(StrategyKind k);
// Why `k` (with Ulysses degree `given` for usp; 0 = not given) cannot run H query heads on N ranks,
// as one line naming the rule and what to use instead; empty when it can. Options are named by
// token (@strategy, @ulysses_degree), for OptionNames::render (runtime/plan.hpp).
std::string strategy_rule_violation(StrategyKind k, int given, Index H, int N);

// Test hooks that plant faults the tests must catch.
struct FaultHooks {
  int drop_grad_step = -1;  // the owner ignores the gradient contribution received at this step
  int stall_rank = -1;      // this rank sleeps stall_s seconds before its first forward send
  double stall_s = 0;
};

struct StrategySetup {
  core::Shape shape;                     // the whole problem: B, S, H, HKV, D
  const core::Layout* layout = nullptr;  // who owns which positions (outlives the strategy)
  const core::Mask* mask = nullptr;
  double scale = 1.0;
  core::Tiling tiling;
  core::Traffic traffic = core::Traffic::aware;
  // Attention sinks: [H] logits of the whole shape's query heads (core::finalize_forward); null:
  // none. Read at every forward, so the owner may change the values between calls.
  const double* sinks = nullptr;
  double softcap = 0;  // c > 0: scores soft-capped, s -> c tanh(s / c); 0: none
  core::Precision precision = core::Precision::f32;  // the products' f32 operands (core::Precision)
  StrategyKind kind = StrategyKind::ring;
  int ulysses_degree = 1;  // usp: ranks per all-to-all group (U); ulysses: N; ring: 1
  int kv_head_group = 1;   // allgather: KV heads gathered together (divides HKV)
  FaultHooks hooks;
  // Simulation only: the kernels do not run; each block's work is counted as they would count it
  // and charged to the simulated host (comm::charge_flops). Outputs are meaningless.
  bool timing_only = false;
  // Called as each pass starts (done = 0) and after every ring step with (pass, steps done,
  // steps in the pass); may be empty.
  std::function<void(int pass, int done, int steps)> on_step;
  // Called between tiles, where the strategy progresses its own transfers: a caller with
  // transfers of its own in flight (the layer's weight-gradient reduction) progresses them here.
  std::function<void()> poll;
};

// Sees every event of the ring on one rank as it happens (`lab` records them for its worked
// example). Packed layouts as in core/packed.hpp; accumulation type. The running max m is in the
// kernels' units, log2 for every type (multiply by ln 2 for max_j S_ij).
template <class A>
class RingObserver {
 public:
  virtual ~RingObserver() = default;
  // After the forward folded the block of `owner` into the running state (m, l, a).
  virtual void forward_block(int /*step*/, int /*owner*/, const core::Packing& /*pq*/, const A* /*m*/,
                             const A* /*l*/, const A* /*acc*/) {}
  // After the replay computed this rank's contribution to the block of `owner`.
  virtual void replay_block(int /*step*/, int /*owner*/, const core::Packing& /*pk*/, const A* /*dk*/,
                            const A* /*dv*/) {}
  // A contribution sent back to its owner (to), or one received for this rank's block (from).
  virtual void grad_sent(int /*step*/, int /*to*/, Index /*elems*/) {}
  virtual void grad_received(int /*step*/, int /*from*/, Index /*elems*/) {}
};

template <class S>
class Strategy {
 public:
  using A = core::accum_t<S>;
  virtual ~Strategy() = default;

  // This rank's shard in file order: q [B, L, H, D]; k, v [B, L, HKV, D]. Copied.
  virtual void load(const S* q, const S* k, const S* v) = 0;
  // dL/dO for this rank's positions, [B, L, H, D]; before backward(). Copied.
  virtual void load_dout(const S* dout) = 0;
  // dL/dLSE of this rank's rows, lse-like [B, H, L] (file order, accumulation type), after
  // load_dout() and before backward(): the backward's row term becomes D_i = sum dO_i.O_i - dLSE_i,
  // so dS_ij gains P_ij dLSE_i. load_dout() clears it. Every rank of the strategy gives one, or none
  // does (a head-parallel strategy moves it through an all-to-all).
  virtual void load_dlse(const A* dlse) = 0;
  virtual PassStats forward() = 0;
  virtual PassStats backward() = 0;  // after forward() and load_dout()
  // This rank's outputs in file order: o, dq [B, L, H, D]; lse [B, H, L]; dk, dv [B, L, HKV, D].
  // Any pointer may be null.
  virtual void outputs(A* o, A* lse, A* dq, A* dk, A* dv) const = 0;
  // After backward(), with sinks: this rank's rows' share of dL/dsink added into dsinks [H]
  // (core::add_sink_grad); the shares of all ranks sum to the whole gradient (sink_gradient).
  virtual void add_sink_grad(double* dsinks) const = 0;
  // What moved during the last forward (and backward), counted as it moved.
  virtual const core::Ledger& ledger() const = 0;
  // Bytes of every buffer this rank holds for the strategy (its memory budget).
  virtual Index resident_bytes() const = 0;
  virtual Index local_size() const = 0;
  // Only the ring reports its events; other strategies ignore the observer.
  virtual void set_observer(RingObserver<A>* /*obs*/) {}
};

// The strategy setup.kind names, on `comm` (collective).
template <class S>
std::unique_ptr<Strategy<S>> make_strategy(const comm::Comm& comm, const StrategySetup& setup);

// dL/dsink [H] after a backward with sinks, on every rank of `group` (the strategy's ranks): every
// rank's share gathered and summed in rank order, in double, so every rank holds the same bits
// whatever order the messages arrive in. Collective.
template <class S>
std::vector<double> sink_gradient(const comm::Group& group, const Strategy<S>& strategy, Index H);

}  // namespace ringattn::runtime
