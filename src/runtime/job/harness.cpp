#include "ringattn/runtime/harness.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ringattn/core/errors.hpp"
#include "ringattn/core/median.hpp"
#include "ringattn/core/reference.hpp"
#include "ringattn/runtime/agreement.hpp"
#include "ringattn/runtime/paths.hpp"
#include "ringattn/runtime/staged_outputs.hpp"

namespace ringattn::runtime {

namespace {

using core::median;

std::vector<double> as_double(const OutputTensor& t) {
  if (!t.f64.empty()) return {t.f64.begin(), t.f64.end()};
  return {t.f32.begin(), t.f32.end()};
}

// FNV-1a over a tensor's bytes: whole outputs must be the same bits on every rank.
std::uint64_t digest(const OutputTensor& t) {
  const auto bytes = !t.f64.empty() ? std::as_bytes(t.f64) : std::as_bytes(t.f32);
  return digest_bytes(bytes.data(), bytes.size());
}

// Rank 0 receives every rank's part of a positional output, at its global positions.
std::vector<double> gather_global(const comm::Group& g, const OutputTensor& t, const core::Layout& layout) {
  Index outer = 1, inner = 1;
  for (int d = 0; d < t.pos_axis; ++d) outer *= t.shape[d];
  for (std::size_t d = std::size_t(t.pos_axis) + 1; d < t.shape.size(); ++d) inner *= t.shape[d];
  const std::vector<double> mine = as_double(t);
  return gather_positions(g, mine, outer, inner, layout, 0);
}

io::CheckReport run_check(const comm::Group& g, const Job& job, const std::vector<OutputTensor>& outputs,
                          const HarnessOptions& opt) {
  std::vector<const OutputTensor*> checked;
  for (const OutputTensor& t : outputs)
    if (t.checked) checked.push_back(&t);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> err(checked.size(), 0.0);
  // Whole outputs: the same bits on every rank, or the check fails.
  for (std::size_t k = 0; k < checked.size(); ++k) {
    if (checked[k]->pos_axis != kWhole) continue;
    const auto all = g.all_gather(digest(*checked[k]));
    for (std::uint64_t h : all)
      if (h != all[0]) err[k] = inf;
  }
  std::vector<std::vector<double>> global(checked.size());
  for (std::size_t k = 0; k < checked.size(); ++k)
    if (checked[k]->pos_axis != kWhole) global[k] = gather_global(g, *checked[k], *opt.layout);
  std::string failure;
  if (g.rank() == 0) {
    try {
      const std::vector<ReferenceTensor> refs = job.reference();
      for (std::size_t k = 0; k < checked.size(); ++k) {
        const ReferenceTensor* ref = nullptr;
        for (const ReferenceTensor& r : refs)
          if (r.name == checked[k]->name) ref = &r;
        if (!ref) throw std::logic_error("no reference for " + checked[k]->name);
        const std::vector<double> got = checked[k]->pos_axis == kWhole ? as_double(*checked[k]) : global[k];
        err[k] = std::max(err[k], core::max_rel_error(got, ref->values, ref->floor));
      }
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  if (auto e = g.agree(failure)) throw AgreedFailure(*e);
  g.broadcast(err, 0);
  io::CheckReport cr;
  cr.tolerance = opt.tolerance;
  cr.passed = true;
  for (std::size_t k = 0; k < checked.size(); ++k) {
    cr.errors.emplace_back(checked[k]->name, err[k]);
    cr.passed = cr.passed && err[k] <= opt.tolerance;  // NaN or inf never passes
  }
  return cr;
}

std::string trace_text(const comm::Group& g, const std::vector<StepRecord>& steps) {
  const auto all = g.gatherv(std::span<const StepRecord>(steps), 0);
  std::string text;
  for (std::size_t r = 0; r < all.size(); ++r)
    for (const StepRecord& s : all[r])
      text += fmt::format(
          "{{\"rank\": {}, \"pass\": \"{}\", \"step\": {}, \"src\": {}, \"compute_s\": {:.9g}, \"wait_s\": {:.9g}, "
          "\"bytes\": {}{}}}\n",
          r, s.pass == Pass::forward ? "forward" : "backward", s.step, s.src, s.compute_s, s.wait_s, s.bytes,
          s.phase == Phase::a2a      ? ", \"phase\": \"all-to-all\""
          : s.phase == Phase::gather ? ", \"phase\": \"all-gather\""
                                     : "");
  return text;
}

}  // namespace

io::Report run_harness(const comm::Group& g, Job& job, StagedOutputs& staged, const HarnessOptions& opt) {
  std::vector<double> fwd, bwd, comp, wait, a2a, fwd_slow, bwd_slow;
  const int total = opt.warmup + opt.iters;
  for (int it = 0; it < total; ++it) {
    if (opt.on_iteration) opt.on_iteration(it, total);
    g.barrier();
    const IterationTimes t = job.iterate(it >= opt.warmup);
    double slowest[2] = {t.forward_s, t.backward_s};
    g.allreduce_max(slowest);
    if (it < opt.warmup) continue;
    fwd.push_back(t.forward_s);
    bwd.push_back(t.backward_s);
    comp.push_back(t.compute_s);
    wait.push_back(t.wait_s);
    a2a.push_back(t.a2a_wait_s);
    fwd_slow.push_back(slowest[0]);
    bwd_slow.push_back(slowest[1]);
  }

  io::Report rep;
  rep.config = opt.config;
  rep.forward_s = median(fwd_slow);
  rep.backward_s = median(bwd_slow);
  const std::optional<double> loss = job.local_loss();
  if (loss) rep.loss = g.sum(*loss);

  const std::vector<OutputTensor> outputs = job.outputs();
  if (opt.check) rep.check = run_check(g, job, outputs, opt);

  io::RankRow mine = job.rank_row();
  mine.rank = g.rank();
  mine.forward_s = median(fwd);
  mine.backward_s = median(bwd);
  mine.compute_s = median(comp);
  mine.wait_s = median(wait);
  mine.a2a_wait_s = median(a2a);
  rep.ranks = g.gather(mine, 0);
  job.finish_report(g, rep);

  // Outputs become visible last, only once the trace and the report are ready too.
  staged.stage(outputs, *opt.layout);
  const std::string trace = opt.trace ? trace_text(g, job.steps()) : std::string();
  std::string err;
  if (g.rank() == 0) {
    try {
      if (opt.trace) staged.set_trace(trace);
      if (opt.report) staged.set_report(io::to_json(rep).dump(2) + "\n");
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  if (auto e = g.agree(err)) throw AgreedFailure(*e);
  staged.commit();
  return rep;
}

int exit_code(const io::Report& report) {
  return report.check && !report.check->passed ? kExitCheckFailed : kExitOk;
}

}  // namespace ringattn::runtime
