// ringattn: exact ring attention over MPI ranks. Thin: parse into a config, call the library,
// print, return the exit code (0 ok, 1 check failed, 2 bad input or usage, 3 runtime failure).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/runtime/job.hpp"

using namespace ringattn;

namespace {

// Options DESIGN.md reserves for later work: accepted by the parser so the message is precise.
struct Reserved {
  double rope = 0;
  bool layer = false;
  long model_dim = 0;
};

void add_run_options(CLI::App& run, runtime::JobConfig& c, Reserved& later) {
  run.add_option("--seq", c.seq, "total positions S (default 1024)");
  run.add_option("--batch", c.batch, "batch B (default 1)");
  run.add_option("--heads", c.heads, "query heads H (default 4)");
  run.add_option("--kv-heads", c.kv_heads, "key/value heads HKV, H % HKV == 0 (default H)");
  run.add_option("--head-dim", c.head_dim, "head dim D (default 64)");
  run.add_option("--dtype", c.dtype, "f32 or f64 (default f32; --inputs files decide)");
  run.add_flag("--causal", c.causal, "causal mask j <= i on global positions");
  run.add_option("--window", c.window, "causal sliding window W: i-W < j <= i");
  run.add_option("--doc-lens", c.doc_lens, "packed documents a,b,... summing to S")->delimiter(',');
  run.add_option("--layout", c.layout, "contiguous, striped or zigzag (default contiguous)");
  run.add_option("--partition", c.partition, "contiguous shard sizes n0,...,n(N-1) summing to S")->delimiter(',');
  run.add_option("--scale", c.scale, "softmax scale (default 1/sqrt(D))");
  run.add_option("--seed", c.seed, "seed of the generated inputs (default 0)");
  run.add_option("--inputs", c.inputs, "directory with q.npy k.npy v.npy dout.npy");
  run.add_option("--out", c.out, "directory for o.npy lse.npy dq.npy dk.npy dv.npy (and generated inputs)");
  run.add_flag("--check", c.check, "compare with a dense float64 reference; exit 1 over tolerance");
  run.add_option("--report", c.report, "write the JSON report here");
  run.add_flag("--no-backward", [&c](std::int64_t) { c.backward = false; }, "forward pass only");
  run.add_option("--warmup", c.warmup, "untimed iterations first (default 0)");
  run.add_option("--iters", c.iters, "timed iterations; times are medians (default 1)");
  run.add_option("--trace", c.trace, "write one JSON line per rank per ring step here");
  run.add_option("--timeout", c.timeout, "abort (exit 3) when a ring step waits longer than SEC (0 = never)");
  run.add_option("--tile-q", c.tiling.q_rows, "query rows per tile (default 128)");
  run.add_option("--tile-k", c.tiling.k_cols, "keys per tile (default 256)");
  run.add_option("--rope", later.rope, "rotary embedding base THETA (not yet supported)");
  run.add_flag("--layer", later.layer, "a whole attention layer (not yet supported)");
  run.add_option("--model-dim", later.model_dim, "model dim M for --layer (not yet supported)");
  run.add_option("--debug-drop-grad-step", c.drop_grad_step, "test hook: ignore one returned gradient")
      ->group("");  // hidden
}

}  // namespace

int main(int argc, char** argv) {
  comm::Environment env(&argc, &argv);
  comm::Comm comm = comm::Comm::world();
  const int rank = comm.rank();
  spdlog::set_pattern(fmt::format("[%H:%M:%S.%e] [r{}] [%l] %v", rank));
  spdlog::set_level(rank == 0 ? spdlog::level::info : spdlog::level::warn);

  CLI::App app{"ringattn: exact ring attention over MPI ranks"};
  app.require_subcommand(1);
  runtime::JobConfig cfg;
  Reserved later;
  CLI::App* run = app.add_subcommand("run", "ring attention forward and backward over the MPI ranks");
  add_run_options(*run, cfg, later);

  // Every rank parses the same argv, so every rank reaches the same verdict without talking.
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    if (rank == 0) std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForAllHelp& e) {
    if (rank == 0) std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    if (rank == 0) fmt::print(stderr, "ringattn: error: {} (see 'ringattn --help')\n", e.what());
    return kExitBadInput;
  }

  try {
    if (run->parsed()) {
      if (run->count("--window") && cfg.window < 1)
        throw InputError(fmt::format("--window: {} is not a window (expected W >= 1)", cfg.window));
      if (run->count("--rope") || later.layer || run->count("--model-dim"))
        throw InputError("--rope, --layer and --model-dim are not yet supported");
      return runtime::run_job(comm, cfg);
    }
  } catch (const InputError& e) {
    if (rank == 0) fmt::print(stderr, "ringattn: error: {}\n", e.what());
    return kExitBadInput;
  } catch (const RuntimeFailure& e) {
    fmt::print(stderr, "ringattn: rank {}: runtime failure: {}\n", rank, e.what());
    return kExitRuntime;
  } catch (const std::exception& e) {
    // Anything unexpected on one rank would leave the others waiting: end the job.
    fmt::print(stderr, "ringattn: rank {}: internal error: {}\n", rank, e.what());
    comm::abort_job(kExitRuntime);
  }
  return 0;
}
