// `ringattn run`: attention (or a whole layer) forward and backward over the MPI ranks.
#include <fmt/format.h>

#include <memory>

#include "commands.hpp"
#include "options.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/runtime/run_job.hpp"
#include "run_text.hpp"

namespace ringattn::app {

Command add_run_command(CLI::App& parent) {
  auto cfg = std::make_shared<runtime::JobConfig>();
  runtime::JobConfig& c = *cfg;
  CLI::App* run = parent.add_subcommand("run", "ring attention forward and backward over the MPI ranks");
  add_shape_options(run, c,
                    "bf16, f16, f32 or f64 (default f32, or the --inputs files' type; another type than the files' "
                    "converts them on load)");
  run->add_flag("--causal", c.causal, "causal mask j <= i on global positions");
  add_integer(run, "--window", c.window, "causal sliding window W: i-W < j <= i");
  add_list(run, "--doc-lens", c.doc_lens, "packed documents a,b,... summing to S");
  run->add_option("--layout", c.layout,
                  "auto, contiguous, striped or zigzag (default auto: zigzag for a causal mask without a window, "
                  "contiguous otherwise)");
  add_list(run, "--partition", c.partition, "contiguous shard sizes n0,...,n(N-1) summing to S");
  run->add_option("--scale", c.scale, "softmax scale (default 1/sqrt(D))");
  add_integer(run, "--seed", c.seed, "seed of the generated inputs (default 0)");
  add_path(run, "--inputs", c.inputs, "directory with q.npy k.npy v.npy dout.npy", "DIR");
  add_path(run, "--out", c.out, "directory for o.npy lse.npy dq.npy dk.npy dv.npy (and generated inputs)", "DIR");
  run->add_flag("--check", c.check, "compare with a dense float64 reference; exit 1 over tolerance");
  add_path(run, "--report", c.report, "write the JSON report here", "FILE");
  run->add_flag("--no-backward{false}", c.backward, "forward pass only");
  add_integer(run, "--warmup", c.warmup, "untimed iterations first (default 0)");
  add_integer(run, "--iters", c.iters, "timed iterations; times are medians (default 1)");
  add_path(run, "--trace", c.trace, "write one JSON line per rank per ring step here", "FILE");
  run->add_option("--timeout", c.timeout_s,
                  "abort (exit 3) when a wait lasts longer than SEC (0 = never; default: 300 s plus ten times the "
                  "job's compute at 1 GFLOP/s)");
  run->add_option("--traffic", c.traffic,
                  "aware: move only blocks and gradients some rank needs (default); full: every block everywhere; "
                  "skip-empty: every block, no all-zero gradient returns");
  add_integer(run, "--tile-q", c.tiling.q_rows,
              "query rows per tile (default 0: the SIMD target's own; the report's config.tile_q says which)");
  add_integer(run, "--tile-k", c.tiling.k_cols,
              "keys per tile (default 0: the SIMD target's own; the report's config.tile_k says which)");
  add_integer(run, "--tile-strip", c.tiling.strip_rows,
              "rows per strip of a partially visible tile, each strip trimmed to the keys it sees (default 32; 0: "
              "no strips, such a tile is one piece, trimmed only to the keys any of its rows sees)");
#ifdef RINGATTN_SMPI
  run->add_flag("--timing-only", c.timing_only,
                "simulation: charge the kernels' counted flops to the simulated hosts instead of computing "
                "(no outputs, no check)");
#endif
  run->add_option("--rope", c.rope_theta, "RoPE (rotate-half) on q and k at global positions, base THETA; D even");
  run->add_option("--precision", c.precision,
                  "f32 (default): the kernels' products take P and dS exactly; bf16: P and dS rounded to bf16 first, "
                  "as FlashAttention does, so every product runs on bf16 dot products (--dtype bf16 only)");
  run->add_option("--softcap", c.softcap, "soft-cap the scaled scores: s -> C tanh(s / C) (C > 0; 0: none)");
  add_path(run, "--sinks", c.sinks_file,
           "attention sinks: FILE.npy holds [H] logits, one per query head, in every row's softmax "
           "denominator; with --out, dsinks.npy is written beside dq, dk, dv",
           "FILE");
  run->add_option("--strategy", c.strategy,
                  "ring (default): K/V blocks around the ring; ulysses: all-to-all over heads (H % N == 0); usp: "
                  "Ulysses groups of U consecutive ranks joined by a ring (--ulysses-degree U); allgather: every "
                  "rank gathers all K/V, one group of --kv-head-group heads at a time, dK/dV reduce-scattered");
  add_integer(run, "--ulysses-degree", c.ulysses_degree, "usp: ranks per all-to-all group U (U divides N and H)");
  add_integer(run, "--kv-head-group", c.kv_head_group,
              "allgather: KV heads gathered at once, G divides HKV (default: the largest G leaving two groups to "
              "overlap whose two gathered groups fit in 256 MiB)");
  run->add_flag("--layer", c.layer,
                "a whole layer: x wq wk wv wo dy -> y dx dwq dwk dwv dwo (weight gradients summed over ranks)");
  add_integer(run, "--model-dim", c.model_dim, "model dim M for --layer (required unless --inputs gives it)");
  run->add_flag("--debug-average-weight-grads", c.average_weight_grads,
                "test hook: average the weight gradients over ranks (wrong)")
      ->group("");
  run->add_flag("--debug-rope-local-positions", c.rope_local_positions,
                "test hook: RoPE at local indices in --layer (wrong)")
      ->group("");
  add_integer(run, "--debug-drop-grad-step", c.hooks.drop_grad_step, "test hook: ignore one returned gradient")
      ->group("");  // hidden
  add_integer(run, "--debug-stall-rank", c.hooks.stall_rank, "test hook: this rank stalls before its first send")
      ->group("");
  run->add_option("--debug-stall-seconds", c.hooks.stall_s, "test hook: how long it stalls")->group("");
  run->footer(
      "Summary, one line per rank (medians over --iters): positions, the positions the rank owns; forward and "
      "backward, its time in each pass; compute, its time in the attention kernels; wait, its time blocked on data "
      "that had not arrived (K/V blocks, gradient returns, all-to-alls, all-gathers): communication that overlap did "
      "not hide, or a faster rank waiting for a slower one; wait%, wait over forward + backward; sent and received, "
      "its bytes per iteration, both passes; tile pairs, the (query tile, key tile) pairs its kernels computed (pairs "
      "the mask hides are skipped); GFLOP, its kernels' flops (forward 4 x rows x keys x D, backward 2.5x); GFLOP/s, "
      "GFLOP over forward + backward.\nExit codes: 0 ok, 1 --check failed, 2 bad input or usage, 3 runtime failure "
      "or watchdog, 130/143 SIGINT/SIGTERM.");
  Command cmd;
  cmd.cli = run;
  cmd.run = [cfg, run](comm::Comm* comm) {
    runtime::JobConfig& c = *cfg;
    c.dtype_given = run->count("--dtype") > 0;
    comm->set_timeout(c.timeout_s.value_or(300));  // until the plan gives the job's watchdog
    ProgressLine progress;
    if (comm->rank() == 0) {
      c.progress.iteration = [&progress](int it, int n) { progress.iteration(it, n); };
      c.progress.step = [&progress](int pass, int done, int steps) { progress.step(pass, done, steps); };
    }
    const runtime::RunResult res = runtime::run_job(*comm, c);
    if (comm->rank() == 0) print_run(res);
    return res.exit_code;
  };
  return cmd;
}

}  // namespace ringattn::app
