#pragma once
// `ringattn run` (and `run --layer`) as plain data: the options as given, and the plan derived
// from them and from the input files, validated. Nothing here talks to other ranks.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/layout.hpp"
#include "ringattn/core/mask.hpp"
#include "ringattn/core/ring_plan.hpp"
#include "ringattn/core/shape.hpp"
#include "ringattn/io/json.hpp"
#include "ringattn/runtime/agreement.hpp"
#include "ringattn/runtime/input_plan.hpp"
#include "ringattn/runtime/strategy.hpp"

namespace ringattn::runtime {

// Progress of a long job, for whoever shows it (rank 0 of `ringattn run`).
struct ProgressHooks {
  std::function<void(int iteration, int iterations)> iteration;
  std::function<void(int pass, int done, int steps)> step;
};

struct JobConfig {
  // Shape; empty = not given (with --inputs the files decide; otherwise defaults apply).
  std::optional<Index> seq, batch, heads, kv_heads, head_dim;
  std::string dtype;
  bool causal = false;
  Index window = 0;
  std::vector<Index> doc_lens;
  std::string layout = "auto";  // zigzag for a causal mask without a window, contiguous otherwise
  std::vector<Index> partition;
  std::optional<double> scale;
  std::uint64_t seed = 0;
  std::string inputs, out, report, trace;
  bool check = false, backward = true;
  int warmup = 0, iters = 1;
  std::optional<double> timeout;  // watchdog seconds; 0 = off; empty = default_timeout()
  core::Tiling tiling;
  std::string traffic = "aware";  // full | aware | skip-empty (see core::RingPlan)
  std::optional<double> rope;     // --rope THETA: RoPE on q and k at global positions (D even)
  std::string strategy = "ring";
  std::optional<int> ulysses_degree;  // --ulysses-degree U, usp only
  // --timing-only (the SimGrid/SMPI build only): count the kernels' flops and charge them to the
  // simulated hosts instead of computing; no outputs, no check, no loss.
  bool timing_only = false;
  // --layer: a whole attention layer around the attention.
  bool layer = false;
  std::optional<Index> model_dim;
  // Test hooks.
  FaultHooks hooks;
  bool average_weight_grads = false;  // the layer divides its summed weight gradients by N (wrong)
  bool rope_local_positions = false;  // the layer rotates at local indices (wrong under zigzag)
  ProgressHooks progress;             // not an option: set by the caller
};

// Default shape when neither options nor files give it.
inline constexpr Index kDefaultSeq = 1024, kDefaultBatch = 1, kDefaultHeads = 4, kDefaultHeadDim = 64;

// What the options and files decide, validated.
struct JobPlan {
  core::Shape shape;
  core::DType dtype = core::DType::f32;
  Index model_dim = 0;  // M, --layer only
  core::Layout layout = core::Layout::contiguous(1, 1);
  core::Mask mask;
  core::Traffic traffic = core::Traffic::aware;
  StrategyKind strategy = StrategyKind::ring;
  int ulysses_degree = 1;  // ranks per all-to-all group: ring 1, ulysses N, usp U
  double scale = 1;
  double timeout_s = 0;  // the watchdog: --timeout, or default_timeout()
  InputPlan inputs;      // what is read or generated, and how
};

// Throws InputError naming the option or file at fault. Reads input headers, no data.
JobPlan make_plan(const JobConfig& c, int N);

// The strategy's setup for this plan; it points into `p`, which must outlive the strategy.
StrategySetup strategy_setup(const JobConfig& c, const JobPlan& p);

// The report's "config": every `run` option with the values the job used.
io::Json config_json(const JobConfig& c, const JobPlan& p, int N);

// Relative tolerance of --check against the float64 reference: f32 3e-4 (a few hundred ulps of
// float after exp amplifies score rounding by |S|, and sums over S keys), f64 1e-10.
double check_tolerance(core::DType t);

// Shared option checks: --iters >= 1, --warmup >= 0, --timeout finite and >= 0, tile sizes.
void check_run_options(const JobConfig& c);

// The watchdog when --timeout is not given: generous enough that a quiet machine never trips it.
// 300 s, plus ten times the time the busiest rank's share of one iteration (and, with --check, the
// dense reference on rank 0) would take at 1 GFLOP/s, a hundredth of one core of today's CPUs.
double default_timeout(const JobConfig& c, const JobPlan& p);

// What every rank must agree on before the ranks talk: the shape, dtype, options, strategy and the
// input files' headers.
std::vector<PlanField> plan_fields(const JobConfig& c, const JobPlan& p);

}  // namespace ringattn::runtime
