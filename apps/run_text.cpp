#include "run_text.hpp"

#include "text_format.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include "ringattn/comm/simulation.hpp"
#include "ringattn/core/simd.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

namespace ringattn::app {

namespace {

using core::Index;


std::string loss_text(const io::Report& rep) { return rep.loss ? fmt::format("{:.10g}", *rep.loss) : "-"; }

std::string errors_text(const io::CheckReport& k) {
  std::string s;
  for (const auto& [name, e] : k.errors)
    s += fmt::format("{}{} {}", s.empty() ? "" : " ", name, std::isnan(e) ? std::string("-") : fmt::format("{:.2e}", e));
  return s;
}

void print_attention(const runtime::RunResult& res) {
  const io::Report& rep = res.report;
  const runtime::JobFacts& f = res.facts;
  const int N = f.ranks;
  fmt::print("ringattn run: {} {}{}, mask {}, layout {} over N={} ranks, kernels {}, strategy {}\n", f.shape.str(),
             core::dtype_name(f.dtype), f.precision == core::Precision::bf16 ? " (precision bf16)" : "", f.mask,
             f.layout, N, core::simd::kernels(f.dtype), f.strategy);
  if (comm::simulated())
    fmt::print("  simulated by SimGrid/SMPI: times are simulated seconds on the platform{}\n",
               f.timing_only ? "; timing-only: the kernels' counted flops were charged, not computed (no values)"
                             : ", compute measured here and scaled to the platform's speed");
  fmt::print("  time (slowest rank, median of {}): forward {}  backward {}\n", f.iters, ms(rep.forward_s),
             f.backward ? ms(rep.backward_s) : std::string("-"));
  fmt::print("  {:>4} {:>9} {:>11} {:>11} {:>11} {:>11} {:>7} {:>11} {:>11} {:>10} {:>9} {:>9}\n", "rank", "positions",
             "forward", "backward", "compute", "wait", "wait%", "sent", "received", "tile pairs", "GFLOP", "GFLOP/s");
  double sent = 0, recv = 0, flops = 0, max_flops = 0;
  Index rss = 0, budget = 0;
  for (const io::RankRow& r : rep.ranks) {
    const double total = r.forward_s + r.backward_s;
    const double bs = double(r.ledger.send_bytes), br = double(r.ledger.recv_bytes);
    sent += bs;
    recv += br;
    flops += r.work.flops;
    max_flops = std::max(max_flops, r.work.flops);
    rss = std::max(rss, r.peak_rss_bytes);
    budget = std::max(budget, r.budget_bytes);
    fmt::print("  {:>4} {:>9} {:>11} {:>11} {:>11} {:>11} {:>6.2f}% {:>11} {:>11} {:>10} {:>9.3f} {:>9.2f}\n", r.rank,
               r.positions, ms(r.forward_s), ms(r.backward_s), ms(r.compute_s), ms(r.wait_s),
               total > 0 ? 100 * r.wait_s / total : 0.0, human_bytes(bs), human_bytes(br), r.work.tile_pairs,
               r.work.flops * 1e-9, total > 0 ? r.work.flops / total * 1e-9 : 0.0);
  }
  fmt::print("  bytes moved: {} sent, {} received (all ranks); loss {}\n", human_bytes(sent), human_bytes(recv),
             loss_text(rep));
  double a2a = 0;
  for (const io::RankRow& r : rep.ranks) a2a = std::max(a2a, r.a2a_wait_s);
  if (f.strategy_kind == runtime::StrategyKind::ulysses || f.strategy_kind == runtime::StrategyKind::usp)
    fmt::print("  all-to-all wait (part of wait, slowest rank, forward + backward): {}\n", ms(a2a));
  const double mean = flops / std::max<std::size_t>(1, rep.ranks.size());
  fmt::print("  work imbalance (max/mean flops): {:.3f}", mean > 0 ? max_flops / mean : 1.0);
  // The block models describe a plain causal mask (no window, no documents) on the ring's contiguous shards.
  if (N > 1 && f.strategy_kind == runtime::StrategyKind::ring && f.layout == "contiguous" && f.mask == "causal j<=i")
    fmt::print("; for causal contiguous shards the block model gives 2N/(N+1) = {:.3f}, visible pairs only "
               "(2N-1)/N = {:.3f}", 2.0 * N / (N + 1), (2.0 * N - 1) / N);
  fmt::print("\n");
  // What the planned bytes hold besides the shards and the kernels' scratch, by strategy.
  const char* buffers = f.strategy_kind == runtime::StrategyKind::ulysses     ? "all-to-all buffers"
                        : f.strategy_kind == runtime::StrategyKind::usp       ? "all-to-all and ring buffers"
                        : f.strategy_kind == runtime::StrategyKind::allgather ? "all-gather buffers"
                                                                              : "ring buffers";
  fmt::print("  memory per rank (largest): {} {}, peak RSS {}; total {:.2f} GFLOP\n", buffers,
             human_bytes(double(budget)), human_bytes(double(rss)), flops * 1e-9);
  if (rep.check)
    fmt::print("  check vs float64 reference (max rel err, tol {:.0e}): {} -> {}\n", rep.check->tolerance,
               errors_text(*rep.check), rep.check->passed ? "PASSED" : "FAILED");
}

void print_layer(const runtime::RunResult& res) {
  const io::Report& rep = res.report;
  const runtime::JobFacts& f = res.facts;
  fmt::print("ringattn run --layer: {} M={} {}{}, mask {}, layout {} over N={} ranks, kernels {}, strategy {}\n",
             f.shape.str(), f.model_dim, core::dtype_name(f.dtype),
             f.rope ? fmt::format(", rope {:g}", *f.rope) : std::string(), f.mask, f.layout, f.ranks,
             core::simd::kernels(f.dtype), f.strategy);
  fmt::print("  time (slowest rank, median of {}): forward {}  backward {}; loss {}\n", f.iters, ms(rep.forward_s),
             f.backward ? ms(rep.backward_s) : std::string("-"), loss_text(rep));
  // The ring backward and dWo's reduction side by side: the reduction started before the ring
  // backward; "exposed" is what remained to wait for after all the backward work.
  fmt::print("  {:>4} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>13} {:>6}\n", "rank", "positions",
             "forward", "backward", "gemm", "ring bwd", "ring wait", "dWo done at", "dWo exposed", "dWqkv exposed",
             "hidden");
  Index sent = 0;
  for (std::size_t q = 0; q < rep.ranks.size(); ++q) {
    const io::RankRow& rr = rep.ranks[q];
    const runtime::LayerRankFigures& x = res.layer[q];
    sent += x.allreduce_send_elems;
    fmt::print("  {:>4} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>13} {:>6}\n", q, rr.positions,
               ms(rr.forward_s), ms(rr.backward_s), ms(x.gemm_s), ms(x.ring_backward_s), ms(x.ring_wait_s),
               ms(x.dwo_elapsed_s), ms(x.dwo_exposed_s), ms(x.dwqkv_exposed_s), x.dwo_hidden ? "yes" : "no");
  }
  if (f.backward)
    fmt::print("  weight gradients summed over ranks in rank order: {} elements sent (all ranks, dWo + dWq|dWk|dWv)\n",
               sent);
  if (rep.check)
    fmt::print("  check vs float64 layer reference (max rel err, tol {:.0e}): {} -> {}\n", rep.check->tolerance,
               errors_text(*rep.check), rep.check->passed ? "PASSED" : "FAILED");
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void print_run(const runtime::RunResult& res) {
  if (res.facts.layer) print_layer(res);
  else print_attention(res);
}

ProgressLine::ProgressLine() : tty_(::isatty(STDERR_FILENO) != 0), t0_(now()) {}

void ProgressLine::iteration(int it, int iterations) {
  it_ = it;
  iterations_ = iterations;
}

void ProgressLine::step(int pass, int done, int steps) {
  const double t = now();
  if (done == 0) {  // a pass starts
    pass_t0_ = t;
    return;
  }
  // nothing for the first 2 s; then a live line on a terminal, at most one line per 5 s in a log
  if (t - t0_ < 2.0 || (!tty_ && t - last_ < 5.0)) return;
  const double per_step = (t - pass_t0_) / done;
  const std::string line =
      fmt::format("ringattn: iteration {}/{} {} step {}/{}  elapsed {:.1f} s  pass remaining ~{:.1f} s", it_ + 1,
                  iterations_, pass == 0 ? "forward" : "backward", done, steps, t - t0_, per_step * (steps - done));
  if (tty_) fmt::print(stderr, "\r{:<100}{}", line, done == steps ? "\n" : "");
  else fmt::print(stderr, "{}\n", line);
  std::fflush(stderr);
  last_ = t;
}

}  // namespace ringattn::app
