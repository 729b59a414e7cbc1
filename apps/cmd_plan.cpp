// `ringattn plan`: the cost model for a shape and a machine, no MPI.
#include <fmt/format.h>

#include <cmath>
#include <memory>

#include "commands.hpp"
#include "options.hpp"
#include "ringattn/core/cost_model.hpp"
#include "ringattn/io/cost_json.hpp"

namespace ringattn::app {

namespace {

// Decimal units, three significant digits (0.94 GB, 451 ms).
std::string si(double v, const char* unit) {
  const char* prefix[] = {"", "k", "M", "G", "T", "P"};
  int k = 0;
  while (std::abs(v) >= 1000 && k < 5) {
    v /= 1000;
    ++k;
  }
  return fmt::format("{:.4g} {}{}", v, prefix[k], unit);
}

std::string secs(double s) {
  if (s == 0) return "0 s";
  if (s >= 1) return fmt::format("{:.4g} s", s);
  if (s >= 1e-3) return fmt::format("{:.4g} ms", s * 1e3);
  return fmt::format("{:.4g} us", s * 1e6);
}

std::string pct(double r) { return fmt::format("{:.4g}%", 100 * r); }

std::string label(const core::StrategyEstimate& x) {
  return x.strategy == "usp" ? fmt::format("usp U={}", x.U) : x.strategy;
}

void print_plan(const core::CostInputs& in, const core::CostEstimate& e) {
  const double L = double(in.S) / double(in.N);
  const double block = double(in.B) * L * 2 * double(in.HKV) * double(in.D) * in.bytes;
  fmt::print("ringattn plan: B={} S={} H={} HKV={} D={} over N={} devices, p={} bytes, {}\n", in.B, in.S, in.H, in.HKV,
             in.D, in.N, in.bytes, in.causal ? "causal (half the pairs are useful)" : "non-causal");
  fmt::print("  machine: {}, {} one-way -> beta = flops / bandwidth = {:.6g} FLOP/byte\n", si(in.flops, "FLOP/s"),
             si(in.bandwidth, "B/s"), e.beta);
  fmt::print("\n  per device per layer (forward)\n");
  fmt::print("    {:<44} {:>14} {:>12}\n", in.causal ? "compute  W = 2 B (S/N) S H D" : "compute  W = 4 B (S/N) S H D",
             si(e.work_flops, "FLOP"), secs(e.compute_s));
  fmt::print("    {:<44} {:>14} {:>12}   ({} K/V blocks of {})\n", "receive  C_recv = (N-1)/N B S 2 HKV D p",
             si(e.recv_bytes, "B"), secs(e.comm_s), in.N - 1, si(block, "B"));
  fmt::print("    {:<44} {:>14}\n", "send     N-1 blocks: own + N-2 forwarded", si(e.send_bytes, "B"));
  fmt::print("    {:<44} {:>14}\n", "comm / compute", pct(e.comm_ratio));
  fmt::print("\n  one ring step (one K/V block)\n");
  fmt::print("    {:<44} {:>14} {:>12}\n", "compute  4 B (S/N)^2 H D" + std::string(in.causal ? " / 2" : ""), "",
             secs(e.step_compute_s));
  fmt::print("    {:<44} {:>14} {:>12}\n", "receive  2 B (S/N) HKV D p", si(in.N > 1 ? block : 0, "B"),
             secs(e.step_comm_s));
  fmt::print("    {:<44} {:>14}\n", "comm / compute = beta / I_step", pct(e.step_comm_ratio));
  fmt::print("\n  arithmetic intensity (FLOP/byte)\n");
  const std::string half = in.causal ? " / 2" : "";
  fmt::print("    {:<44} {:>14.6g}\n", "step   I_step = (H/HKV) (S/N) (2/p)" + half, e.step_intensity);
  fmt::print("    {:<44} {:>14.6g}\n", "layer  I = W / C_recv = (H/HKV) S/(N-1) (2/p)" + half, e.layer_intensity);
  fmt::print("    {:<44} {:>14}   (bound {:.4g})\n", "max ranks with I_step >= beta", e.max_ranks, e.max_ranks_bound);
  fmt::print("\n  causal, contiguous shards: utilization (N+1)/2N = {}, N/(2N-1) = {}\n", pct(e.causal_utilization),
             pct(e.causal_utilization_tri));
  fmt::print("  the same layer another way: Ulysses all-to-all {}, tensor parallel {} per device\n",
             si(e.ulysses_recv_bytes, "B"), si(e.tp_bytes, "B"));
  fmt::print("\n  verdict (per-step receive / compute {}; < 5%, 5-15%, > 15%): {}\n", pct(e.step_comm_ratio),
             core::verdict_text(e.verdict));
}

// ring, ulysses and usp side by side: an all-to-all waits for its data, a ring step's receive can
// hide behind the step's compute.
void print_strategies(const std::vector<core::StrategyEstimate>& st) {
  fmt::print("\n  strategies side by side (per device, forward; the all-to-all is exposed, the ring's receive can "
             "hide behind a step)\n");
  fmt::print("    {:<9} {:>3} {:>11} {:>14} {:>11} {:>11} {:>10} {:>10} {:>11} {:>11}   {}\n", "strategy", "U",
             "receive", "a2a elements", "ring bytes", "I_step", "a2a time", "ring step", "comm/comp", "predicted",
             "verdict");
  for (const core::StrategyEstimate& x : st) {
    if (!x.impossible.empty()) {
      fmt::print("    {:<9} {:>3}   impossible: {}\n", x.strategy, x.U, x.impossible);
      continue;
    }
    if (x.strategy == "allgather") {
      fmt::print("    {:<9} {:>3} {:>11} {:>14} {:>11} {:>11} {:>10} {:>10} {:>11} {:>11}   {}\n", x.strategy, "-",
                 si(x.recv_bytes, "B"), "-", "-", "-", secs(x.exposed_gather_s), "-", pct(x.comm_ratio),
                 secs(x.predicted_s), core::verdict_text(x.verdict));
      continue;
    }
    fmt::print("    {:<9} {:>3} {:>11} {:>14.0f} {:>11} {:>11} {:>10} {:>10} {:>11} {:>11}   {}\n", x.strategy, x.U,
               si(x.recv_bytes, "B"), x.a2a_recv_elems, si(x.ring_recv_bytes, "B"),
               x.step_intensity > 0 ? fmt::format("{:.6g}", x.step_intensity) : std::string("-"), secs(x.a2a_s),
               x.step_intensity > 0 ? pct(x.step_comm_ratio) : std::string("-"), pct(x.comm_ratio),
               secs(x.predicted_s), core::verdict_text(x.verdict));
  }
  fmt::print("    a2a elements: (U-1)/U B (S/N) (2H + 2HKV) D (q, k, v in, O back; kv heads replicated when HKV % U "
             "!= 0), plus LSE (U-1)/U B (S/N) H\n");
  for (const core::StrategyEstimate& x : st)
    if (x.strategy == "allgather")
      fmt::print("    allgather: receives (N-1)/N B S 2 HKV D p; holds two gathered groups of G={} KV heads, {}; its "
                 "a2a-time column is the gather no compute hides (the first group's)\n",
                 x.kv_head_group, si(x.gathered_bytes, "B"));
  fmt::print("    predicted = compute x max(1, ring step comm/compute) + a2a time; least: {}\n",
             label(core::predicted_best(st)));
}

}  // namespace

Command add_plan_command(CLI::App& parent) {
  struct Options {
    core::CostInputs in;
    bool json = false;
  };
  auto opt = std::make_shared<Options>();
  core::CostInputs& in = opt->in;
  CLI::App* plan = parent.add_subcommand("plan", "cost model: bytes, intensity, beta, verdict (no MPI)");
  add_integer(plan, "--seq", in.S, "total positions S")->capture_default_str();
  add_integer(plan, "--ranks", in.N, "devices N")->capture_default_str();
  CLI::Option* heads = add_integer(plan, "--heads", in.H, "query heads H")->capture_default_str();
  CLI::Option* kv_heads =
      add_integer(plan, "--kv-heads", in.HKV, "key/value heads HKV, H % HKV == 0 (default 8, or H with --heads alone)")
          ->capture_default_str();
  add_integer(plan, "--head-dim", in.D, "head dim D")->capture_default_str();
  add_integer(plan, "--batch", in.B, "batch B")->capture_default_str();
  plan->add_option("--bytes", in.bytes, "bytes per element p (2 = bf16)")->capture_default_str();
  plan->add_option("--flops", in.flops, "device FLOP/s (peak for planning, measured to judge overlap)")
      ->capture_default_str();
  plan->add_option("--bandwidth", in.bandwidth, "one-way bytes/s between ring neighbours")->capture_default_str();
  plan->add_flag("--causal", in.causal, "causal mask: half the pairs are useful, bytes unchanged");
  plan->add_flag("--json", opt->json, "print one JSON object instead of the table");
  Command cmd;
  cmd.cli = plan;
  cmd.needs_mpi = false;
  cmd.run = [opt, heads, kv_heads](comm::Comm*) {
    // The default HKV = 8 goes with the default H = 32; with --heads alone, HKV = H, as run's.
    if (heads->count() > 0 && kv_heads->count() == 0) opt->in.HKV = opt->in.H;
    const core::CostInputs& in = opt->in;
    runtime::check_shape(core::Shape{in.B, in.S, in.H, in.HKV, in.D}, runtime::cli_names());  // exit 2
    const core::CostEstimate e = core::estimate_cost(opt->in);  // validates the rest: InputError -> exit 2
    const std::vector<core::StrategyEstimate> st = core::estimate_strategies(opt->in);
    if (opt->json) {
      fmt::print("{}\n", io::plan_json(opt->in, e, st).dump(2));
    } else {
      print_plan(opt->in, e);
      print_strategies(st);
    }
    return 0;
  };
  return cmd;
}

}  // namespace ringattn::app
