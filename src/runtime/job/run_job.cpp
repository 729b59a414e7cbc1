#include "ringattn/runtime/run_job.hpp"

#include <sys/resource.h>

#include <fmt/format.h>

#include <algorithm>

#include "jobs.hpp"
#include "ringattn/comm/simulation.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/runtime/agreement.hpp"
#include "ringattn/runtime/harness.hpp"
#include "ringattn/runtime/staged_outputs.hpp"

namespace ringattn::runtime {

Index peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<Index>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

namespace {

template <class S>
RunResult run_typed(const comm::Comm& comm, const JobConfig& c, const JobPlan& p, StagedOutputs& staged) {
  RunResult res;
  if (c.timing_only) comm::fold_large_buffers();  // nothing is read: every rank's buffers share pages
  std::unique_ptr<Job> job;
  LayerJobBase* layer = nullptr;
  if (c.layer) {
    auto lj = make_layer_job<S>(comm, c, p);
    layer = lj.get();
    job = std::move(lj);
  } else {
    job = make_attention_job<S>(comm, c, p);
  }
  HarnessOptions ho;
  ho.warmup = c.warmup;
  ho.iters = c.iters;
  ho.check = c.check;
  ho.tolerance = check_tolerance(p.dtype, p.precision);
  ho.report = !c.report.empty();
  ho.trace = !c.trace.empty();
  ho.layout = &p.layout;
  ho.config = config_json(c, p, comm.size());
  ho.on_iteration = c.progress.iteration;
  res.report = run_harness(comm, *job, staged, ho);
  if (layer) res.layer = layer->figures();
  res.exit_code = exit_code(res.report);
  return res;
}

}  // namespace

RunResult run_job(comm::Comm& comm, const JobConfig& c) {
  agreed(comm, [&] {
    check_run_options(c);
    if (c.layer && !c.trace.empty()) throw InputError("--trace: not supported with --layer (use --report)");
    if (!c.layer && c.model_dim) throw InputError("--model-dim: only applies with --layer (expected --layer)");
  });
  JobPlan p;
  agreed(comm, [&] { p = make_plan(c, comm.size()); });
  agree_on_plan(comm, plan_fields(c, p));  // before anything whose size depends on the plan
  comm.set_timeout(p.timeout_s);
  OutputPaths paths{c.out, c.report, c.trace, {}, {}};
  if (p.inputs.from_files())
    for (std::size_t t = 0; t < p.inputs.specs.size(); ++t)
      if (p.inputs.headers[t]) paths.inputs.push_back(p.inputs.path(p.inputs.specs[t]));
  if (!c.sinks_file.empty()) paths.inputs.push_back(c.sinks_file);
  for (const std::string& name : own_output_names()) {  // all but the inputs it reads as they are
    const bool kept = p.inputs.from_files() && !p.inputs.rounded &&
                      std::any_of(p.inputs.specs.begin(), p.inputs.specs.end(),
                                  [&](const auto& spec) { return spec.name == name; });
    if (!kept) paths.writes.push_back(name);
  }
  StagedOutputs staged(comm, paths);  // every output path checked before anything is computed
  RunResult res = core::with_storage(p.dtype, [&]<class S>() { return run_typed<S>(comm, c, p, staged); });
  res.facts = JobFacts{p.shape,    p.dtype,   p.mask.describe(), core::layout_name(p.layout.kind()),
                       p.strategy == StrategyKind::usp         ? fmt::format("usp U={}", p.ulysses_degree)
                       : p.strategy == StrategyKind::allgather ? fmt::format("allgather G={}", p.kv_head_group)
                                                               : strategy_name(p.strategy),
                       comm.size(), c.iters, c.backward, c.layer, p.mask.causal(),
                       p.model_dim, c.rope_theta, c.timing_only, p.precision, p.strategy};
  return res;
}

}  // namespace ringattn::runtime
