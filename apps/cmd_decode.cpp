// `ringattn decode`: inference over a KV cache sharded across the MPI ranks (prefill, then decode).
#include <fmt/format.h>

#include <memory>

#include "commands.hpp"
#include "options.hpp"
#include "ringattn/comm/simulation.hpp"
#include "ringattn/runtime/decode_job.hpp"
#include "text_format.hpp"

namespace ringattn::app {

namespace {

void print_decode(const runtime::DecodeResult& r, const runtime::DecodeConfig& c) {
  const core::Shape& s = r.shape;
  fmt::print("ringattn decode: B={} S0={} + {} steps x T={} H={} HKV={} D={} {}, mask {}, layout {} over N={} ranks, "
             "SIMD {}\n", s.B, c.cache_len, c.steps, c.new_tokens, s.H, s.HKV, s.D, r.dtype, r.mask, r.layout, r.ranks,
             r.simd);
  if (comm::simulated())
    fmt::print("  simulated by SimGrid/SMPI: times are simulated seconds on the platform\n");
  if (c.timing_only)
    fmt::print("  timing-only (simulated): each step charged its K/V bytes at {:.0f} GB/s per rank, or its flops at the "
               "host's speed if longer; nothing computed\n", c.memory_bandwidth / 1e9);
  fmt::print("  prefill ({}) {:.3f} ms; decode step {:.3f} ms (slowest rank, median of {})\n", c.prefill,
             r.prefill_s * 1e3, r.decode_step_s * 1e3, c.steps);
  fmt::print("  {:>4} {:>15} {:>14} {:>12} {:>12} {:>12} {:>11} {:>11} {:>8}\n", "rank", "cache positions",
             "K/V read/step", "step", "attend", "merge", "read GB/s", "stream GB/s", "reached");
  for (int q = 0; q < r.ranks; ++q) {
    const double bw = r.step_s[q] > 0 ? double(r.kv_bytes_per_step[q]) / r.step_s[q] : 0;
    const double st = r.rank_stream_bytes_per_s[q];
    fmt::print("  {:>4} {:>15} {:>14} {:>9.3f} ms {:>9.3f} ms {:>9.3f} ms {:>11.2f} {:>11} {:>8}\n", q,
               r.cache_positions[q], human_bytes(double(r.kv_bytes_per_step[q]), "{:.4g} {}"), r.step_s[q] * 1e3,
               r.attend_s[q] * 1e3, r.merge_s[q] * 1e3, bw / 1e9, st > 0 ? fmt::format("{:.2f}", st / 1e9) : "-",
               st > 0 ? fmt::format("{:.1f}%", 100.0 * bw / st) : "-");
  }
  if (r.stream_buffer_bytes > 0)
    fmt::print("  reached: a step's K/V bytes over the step's time, against the rank's streaming read bandwidth "
               "(median of read passes over {} per rank, one before each step, all ranks at once)\n",
               human_bytes(double(r.stream_buffer_bytes), "{:.4g} {}"));
  fmt::print("  merge ({}) of {} values per rank, all ranks starting together: {:.1f} us; MPI_Allreduce (sum) of as "
             "many: {:.1f} us ({:.2f}x; medians, slowest rank)\n", c.merge == "gather" ? "all-gather, merged in "
             "rank order" : "all-reduce, recursive doubling in a fixed order", r.state_values, r.merge_alone_s * 1e6, r.allreduce_s * 1e6,
             r.allreduce_s > 0 ? r.merge_alone_s / r.allreduce_s : 0.0);
  fmt::print("  decode O identical on every rank: {}\n", r.identical_on_every_rank ? "yes" : "NO");
  if (r.checked) {
    if (c.prefill == "attend")
      fmt::print("  check vs float64 causal attention over all positions (max rel err, tol {:.0e}): prefill o {:.2e} "
                 "lse {:.2e}, decode o {:.2e} lse {:.2e} -> {}\n", r.tolerance, r.err_o_prefill, r.err_lse_prefill,
                 r.err_o_decode, r.err_lse_decode, r.passed ? "PASSED" : "FAILED");
    else
      fmt::print("  check vs float64 causal attention's decode rows (max rel err, tol {:.0e}): decode o {:.2e} lse "
                 "{:.2e} -> {}\n", r.tolerance, r.err_o_decode, r.err_lse_decode, r.passed ? "PASSED" : "FAILED");
  }
}

}  // namespace

Command add_decode_command(CLI::App& parent) {
  auto cfg = std::make_shared<runtime::DecodeConfig>();
  runtime::DecodeConfig& c = *cfg;
  CLI::App* d = parent.add_subcommand("decode", "inference over a KV cache sharded across the MPI ranks: prefill a "
                                                "prompt, then decode steps, each merged across ranks");
  add_integer(d, "--cache-len", c.cache_len, "prompt positions S0 prefilled into the cache (default 1024)");
  add_integer(d, "--new-tokens", c.new_tokens, "tokens T per decode step, the same on every rank (default 1)");
  add_integer(d, "--steps", c.steps, "decode steps K (default 8)");
  add_integer(d, "--batch", c.batch, fmt::format("batch B (default {})", runtime::kDefaultBatch));
  add_integer(d, "--heads", c.heads, fmt::format("query heads H (default {})", runtime::kDefaultHeads));
  add_integer(d, "--kv-heads", c.kv_heads, "key/value heads HKV, H % HKV == 0 (default H)");
  add_integer(d, "--head-dim", c.head_dim, fmt::format("head dim D (default {})", runtime::kDefaultHeadDim));
  d->add_option("--dtype", c.dtype, "bf16, f16, f32 or f64: the cache's storage (default f32)");
  d->add_option("--layout", c.layout, "the prompt's layout: auto (zigzag; contiguous with --window), contiguous, striped or zigzag");
  add_integer(d, "--window", c.window, "causal sliding window W: i-W < j <= i");
  d->add_option("--scale", c.scale, "softmax scale (default 1/sqrt(D))");
  add_integer(d, "--seed", c.seed, "seed of the generated q, k, v (default 0)");
  d->add_option("--prefill", c.prefill, "attend (default): the prompt through the causal ring forward; load: its K/V "
                                        "kept without attending (no o_prefill; for caches too long to attend here)");
  d->add_option("--merge", c.merge, "allreduce (default): an all-reduce of the partial states by recursive doubling with "
                                    "fixed partners (log2 N rounds); gather: one all-gather, merged in rank order");
  add_integer(d, "--stream-mib", c.stream_mib, "MiB read (over all ranks, >= 256 each) to measure the streaming read "
                                               "bandwidth; 0: not measured (default 2048)");
#ifdef RINGATTN_SMPI
  d->add_flag("--timing-only", c.timing_only, "simulation: charge each step's K/V bytes at --memory-bandwidth (or its "
                                              "flops, if longer) instead of computing (no outputs, no check)");
  d->add_option_function<double>(
      "--memory-bandwidth", [&c](double gbps) { c.memory_bandwidth = gbps * 1e9; },
      "simulation, --timing-only: GB/s at which a rank reads its K/V cache (default 200)");
#endif
  d->add_flag("--check", c.check, "compare with dense float64 causal attention over all positions; exit 1 over "
                                  "tolerance");
  add_path(d, "--out", c.out, "directory for q.npy k.npy v.npy o_prefill.npy o_decode.npy, put in place as one set",
           "DIR");
  add_path(d, "--report", c.report, "write the JSON report here", "FILE");
  d->add_option("--timeout", c.timeout_s, "abort (exit 3) when a wait lasts longer than SEC (0 = never)");
  Command cmd;
  cmd.cli = d;
  cmd.run = [cfg](comm::Comm* comm) {
    const runtime::DecodeResult r = runtime::run_decode(*comm, *cfg);
    if (comm->rank() == 0) print_decode(r, *cfg);
    return r.exit_code;
  };
  return cmd;
}

}  // namespace ringattn::app
