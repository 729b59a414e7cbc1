// `ringattn probe`: measure bandwidth, compute rate and beta, predicted against measured
// comm/compute (under mpirun). The measurement is runtime::run_probe; this prints it.
#include <fmt/format.h>

#include <memory>

#include "commands.hpp"
#include "options.hpp"
#include "text_format.hpp"
#include "ringattn/core/cost_model.hpp"
#include "ringattn/runtime/probe.hpp"

namespace ringattn::app {

namespace {

using runtime::Probe;
using runtime::ProbeConfig;


// Each strategy's forward and backward on these ranks, and which one won.
void print_strategies(const Probe& p) {
  if (p.strategies.empty()) return;
  fmt::print("\nstrategies: forward and backward on these N={} ranks (slowest rank, median)\n", p.N);
  fmt::print("  {:<9} {:>3} {:>12} {:>12} {:>12} {:>12} {:>13} {:>12} {:>6}\n", "strategy", "U", "forward", "backward",
             "total", "received", "exposed wait", "a2a wait", "iters");
  for (const runtime::StrategyProbe& x : p.strategies) {
    if (!x.forbidden.empty()) {
      fmt::print("  {:<9} {:>3}   not run: {}\n", x.strategy,
                 x.ulysses_degree > 0 ? std::to_string(x.ulysses_degree) : std::string("-"), x.forbidden);
      continue;
    }
    fmt::print("  {:<9} {:>3} {:>12} {:>12} {:>12} {:>12} {:>13} {:>12} {:>6}\n", x.strategy, x.ulysses_degree,
               ms(x.forward_s), ms(x.backward_s), ms(x.forward_s + x.backward_s),
               human_bytes(double(x.recv_bytes), "{:.4g} {}"), ms(x.exposed_wait_s), ms(x.a2a_wait_s), x.iters);
  }
  if (p.recommended < 0) {
    fmt::print("  nothing run: the shape forbids every strategy named\n");
    return;
  }
  const runtime::StrategyProbe& best = p.strategies[p.recommended];
  auto label = [](const std::string& s, int U) { return s == "usp" ? fmt::format("usp U={}", U) : s; };
  fmt::print("  recommended (least forward + backward): {}\n", label(best.strategy, best.ulysses_degree));
  if (!p.plan_recommended.empty())
    fmt::print("  plan's prediction with the figures above (step 2's compute rate, step 3's bandwidth at one block): "
               "{} ({})\n",
               label(p.plan_recommended, p.plan_recommended_degree),
               p.plan_recommended == best.strategy && p.plan_recommended_degree == best.ulysses_degree
                   ? "the same"
                   : "not the one measured fastest");
}

void print_probe(const ProbeConfig& c, const Probe& p) {
  const core::Shape& s = p.shape;
  fmt::print("ringattn probe: {} {}{}, {}, layout {} over N={} ranks\n", s.str(), core::dtype_name(p.dtype),
             p.precision == core::Precision::bf16 ? " (precision bf16)" : "", c.causal ? "causal" : "non-causal",
             p.layout, p.N);
  fmt::print("\nstep 1: ring sendrecv, rank r -> r+1 while r-1 -> r (one-way GB/s per rank; slowest rank's median)\n");
  if (p.bandwidth.empty()) {
    fmt::print("  N=1: no neighbour, nothing travels; no bandwidth to measure (run under mpirun -np 2 or more)\n");
  } else {
    fmt::print("  {:>12} {:>7} {:>6} {:>13} {:>9} {:>7}\n", "bytes", "window", "iters", "time (us)", "GB/s", "#wrong");
    for (const comm::BandwidthSample& b : p.bandwidth)
      fmt::print("  {:>12} {:>7} {:>6} {:>13.2f} {:>9.3f} {:>7}\n", b.bytes, b.window, b.iters, b.time_s * 1e6, b.gbps,
                 b.wrong);
  }
  fmt::print("\nstep 2: block_forward, {} queries x {} keys x {} heads, D={}, unmasked: {:.4g} GFLOP in {} "
             "(median of {}, slowest rank) -> {:.2f} GFLOP/s\n",
             p.L, p.L, s.H, s.D, p.kernel_flops * 1e-9, ms(p.kernel_s), p.kernel_iters, p.compute_flops * 1e-9);
  fmt::print("\nstep 3: one K/V block is {} ({:.0f} bytes)\n", human_bytes(p.block_bytes, "{:.4g} {}"), p.block_bytes);
  fmt::print("  I_step = 4 B L^2 H D{} / (2 B L HKV D p) = {:.6g} FLOP/byte (L = {}, p = {})\n",
             c.causal ? " / 2" : "", p.step_intensity, p.L, core::dtype_size(p.dtype));
  if (p.N == 1) {
    fmt::print("  N=1: the ring moves nothing; comm/compute is 0 ({})\n",
               core::verdict_text(core::Verdict::no_communication));
    fmt::print("  ring forward: {} (median of {})\n", ms(p.ring_forward_s), p.ring_iters);
    print_strategies(p);
    return;
  }
  fmt::print("  bandwidth at one block {:.3f} GB/s (interpolated) -> beta = compute / bandwidth = {:.6g} FLOP/byte\n",
             p.block_gbps, p.beta);
  const auto pv = core::verdict_for(p.predicted_comm_ratio), mv = core::verdict_for(p.measured_comm_ratio);
  fmt::print("  {:<10} {:>14} {:>14} {:>14}   {}\n", "", "step compute", "step receive", "comm/compute", "verdict");
  fmt::print("  {:<10} {:>14} {:>14} {:>13.2f}%   {}\n", "predicted", ms(p.predicted_step_compute_s),
             ms(p.predicted_step_comm_s), 100 * p.predicted_comm_ratio, core::verdict_text(pv));
  fmt::print("  {:<10} {:>14} {:>14} {:>13.2f}%   {}\n", "measured", ms(p.measured_step_compute_s),
             ms(p.measured_step_comm_s), 100 * p.measured_comm_ratio, core::verdict_text(mv));
  fmt::print("  predicted: kernel alone (step 2){} and the bandwidth table at one block (beta / I_step)\n",
             c.causal ? " x 1/2" : "");
  fmt::print("  measured:  mean compute per (rank, step) of the real ring forward (median of {}, {} each), and one\n"
             "             block sent alone between neighbours at its exact size, one message in flight\n",
             p.ring_iters, ms(p.ring_forward_s));
  fmt::print("  exposed wait / compute in the ring forward (what overlap did not hide): {:.2f}%\n",
             100 * p.exposed_wait_ratio);
  print_strategies(p);
}

}  // namespace

Command add_probe_command(CLI::App& parent) {
  auto cfg = std::make_shared<ProbeConfig>();
  ProbeConfig& c = *cfg;
  CLI::App* probe = parent.add_subcommand("probe", "measure this machine: bandwidth, compute rate, beta, "
                                                   "predicted and measured comm/compute (under mpirun)");
  add_shape_options(probe, c, "bf16, f16, f32 or f64 (default f32; bf16 and f16 are stored and sent, f32 computes)");
  probe->add_option("--precision", c.precision,
                    "f32 (default) or bf16: P rounded to bf16 so the kernels' products run on bf16 dot products "
                    "(--dtype bf16 only)");
  probe->add_flag("--causal", c.causal, "causal mask j <= i for the ring run (half the pairs are useful)");
  probe->add_option("--layout", c.layout, "auto, contiguous, striped or zigzag (default auto: zigzag with --causal, contiguous otherwise)");
  add_integer(probe, "--min-bytes", c.bw.min_bytes, "smallest message of the bandwidth table")->capture_default_str();
  add_integer(probe, "--max-bytes", c.bw.max_bytes, "largest message of the bandwidth table")->capture_default_str();
  add_integer(probe, "--iters", c.bw.iters, "timed repetitions of each measurement, at most (at least 3 unless fewer)")
      ->capture_default_str();
  probe->add_option("--budget", c.budget_s, "seconds per compute measurement before fewer repetitions are used")
      ->capture_default_str();
  probe->add_flag("--json", c.json, "print one JSON object instead of the tables");
  add_list(probe, "--strategies", c.strategies,
           "time these strategies forward and backward on the live ranks, e.g. ring,ulysses,usp,allgather (those the "
           "shape forbids are listed with the reason)");
  add_integer(probe, "--ulysses-degree", c.ulysses_degree,
              "usp's U for --strategies (default: every U with 1 < U < N dividing N)");
  Command cmd;
  cmd.cli = probe;
  cmd.run = [cfg](comm::Comm* comm) {
    const ProbeConfig& c = *cfg;
    comm->set_timeout(300);  // until the plan gives the probe's watchdog
    const Probe p = runtime::run_probe(*comm, c);
    if (comm->rank() == 0) {
      if (c.json) fmt::print("{}\n", runtime::probe_json(c, p).dump(2));
      else print_probe(c, p);
    }
    return 0;
  };
  return cmd;
}

}  // namespace ringattn::app
