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
#include "ringattn/runtime/plan.hpp"
#include "ringattn/runtime/strategy.hpp"

namespace ringattn::runtime {

// Progress of a long job, for whoever shows it (rank 0 of `ringattn run`).
struct ProgressHooks {
  std::function<void(int iteration, int iterations)> iteration;
  std::function<void(int pass, int done, int steps)> step;
};

// `run`'s options: one attention call's (PlanOptions, rendered in the command line's words) and
// the job's own around it.
struct JobConfig : PlanOptions {
  // Shape; empty = not given (with --inputs the files decide; otherwise the plan's defaults apply).
  std::optional<Index> seq, batch, heads, kv_heads, head_dim;
  bool dtype_given = false;  // --dtype given: with --inputs, converts the files' values on load
  std::uint64_t seed = 0;
  std::string inputs, out, report, trace;
  std::string sinks_file;  // --sinks FILE.npy: [H] sink logits (PlanOptions::sinks read from it)
  bool check = false;
  int warmup = 0, iters = 1;
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

// What the options and files decide, validated: the attention's plan and the job's own.
struct JobPlan : AttentionPlan {
  Index model_dim = 0;  // M, --layer only
  InputPlan inputs;     // what is read or generated, and how
};

// Throws InputError naming the option or file at fault. Reads input headers, no data.
JobPlan make_plan(const JobConfig& c, int N);

// The strategy's setup for this plan, with the job's hooks; it points into `p`, which must outlive
// the strategy.
StrategySetup strategy_setup(const JobConfig& c, const JobPlan& p);

// The report's "config": every `run` option with the values the job used.
io::Json config_json(const JobConfig& c, const JobPlan& p, int N);

// The job's own option checks: --iters >= 1, --warmup >= 0, --timing-only's exclusions.
void check_run_options(const JobConfig& c);

// What every rank must agree on before the ranks talk: the shape, dtype, options, strategy and the
// input files' headers.
std::vector<PlanField> plan_fields(const JobConfig& c, const JobPlan& p);

}  // namespace ringattn::runtime
