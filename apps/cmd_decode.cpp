// `ringattn decode`: inference over a KV cache sharded across the MPI ranks (prefill, then decode).
#include <fmt/format.h>

#include <memory>

#include "commands.hpp"
#include "options.hpp"
#include "ringattn/runtime/decode_job.hpp"
#include "text_format.hpp"

namespace ringattn::app {

namespace {

void print_decode(const runtime::DecodeResult& r, const runtime::DecodeConfig& c) {
  const core::Shape& s = r.shape;
  fmt::print("ringattn decode: B={} S0={} + {} steps x T={} H={} HKV={} D={} {}, mask {}, layout {} over N={} ranks\n",
             s.B, c.cache_len, c.steps, c.new_tokens, s.H, s.HKV, s.D, r.dtype, r.mask, r.layout, r.ranks);
  fmt::print("  prefill {:.3f} ms; decode step {:.3f} ms (slowest rank, median of {})\n", r.prefill_s * 1e3,
             r.decode_step_s * 1e3, c.steps);
  fmt::print("  {:>4} {:>15} {:>14} {:>12} {:>12} {:>12}\n", "rank", "cache positions", "K/V read/step", "step",
             "merge", "stream");
  for (int q = 0; q < r.ranks; ++q) {
    const double bw = r.step_s[q] > 0 ? double(r.kv_bytes_per_step[q]) / r.step_s[q] : 0;
    fmt::print("  {:>4} {:>15} {:>14} {:>9.3f} ms {:>9.3f} ms {:>11.1f}%\n", q, r.cache_positions[q],
               human_bytes(double(r.kv_bytes_per_step[q]), "{:.4g} {}"), r.step_s[q] * 1e3, r.merge_s[q] * 1e3,
               r.stream_bytes_per_s > 0 ? 100.0 * bw / r.stream_bytes_per_s : 0.0);
  }
  fmt::print("  stream: a step's K/V bytes over its time, against this core's streaming read bandwidth ({:.2f} GB/s, "
             "measured in this run)\n", r.stream_bytes_per_s / 1e9);
  fmt::print("  decode O identical on every rank: {}\n", r.identical_on_every_rank ? "yes" : "NO");
  if (r.checked)
    fmt::print("  check vs float64 causal attention over all positions (max rel err, tol {:.0e}): prefill o {:.2e} "
               "lse {:.2e}, decode o {:.2e} lse {:.2e} -> {}\n", r.tolerance, r.err_o_prefill, r.err_lse_prefill,
               r.err_o_decode, r.err_lse_decode, r.passed ? "PASSED" : "FAILED");
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
  d->add_option("--layout", c.layout, "the prompt's layout: auto (zigzag), contiguous, striped or zigzag");
  add_integer(d, "--window", c.window, "causal sliding window W: i-W < j <= i");
  d->add_option("--scale", c.scale, "softmax scale (default 1/sqrt(D))");
  add_integer(d, "--seed", c.seed, "seed of the generated q, k, v (default 0)");
  d->add_flag("--check", c.check, "compare with dense float64 causal attention over all positions; exit 1 over "
                                  "tolerance");
  d->add_option("--out", c.out, "directory for q.npy k.npy v.npy o_prefill.npy o_decode.npy");
  d->add_option("--report", c.report, "write the JSON report here");
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
