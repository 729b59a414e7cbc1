#pragma once
// `ringattn run` as a library call: the options are planned and checked, the inputs read or
// generated, the job mode (attention, or the whole layer with --layer) runs through the harness,
// and the caller gets back what it needs to show. Nothing is printed here.
#include <optional>
#include <string>
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/io/report.hpp"
#include "ringattn/runtime/job_config.hpp"

namespace ringattn::runtime {

// The facts of a job a summary line names.
struct JobFacts {
  core::Shape shape;
  core::DType dtype = core::DType::f32;
  std::string mask, layout, strategy;  // strategy: its label (ring, ulysses, usp U=2, allgather G=1)
  int ranks = 1, iters = 1;
  bool backward = true, layer = false, causal = false;
  Index model_dim = 0;
  std::optional<double> rope;
  bool timing_only = false;  // simulation: counted flops charged, no values
  core::Precision precision = core::Precision::f32;
  StrategyKind strategy_kind = StrategyKind::ring;
};

// The layer's own per-rank figures (medians over --iters), for its table.
struct LayerRankFigures {
  double gemm_s = 0, rope_s = 0, ring_backward_s = 0, ring_wait_s = 0;
  double dwo_elapsed_s = 0, dwo_exposed_s = 0, dwqkv_exposed_s = 0;
  bool dwo_hidden = false;
  Index allreduce_send_elems = 0, allreduce_recv_elems = 0;
};

struct RunResult {
  io::Report report;  // complete on rank 0
  JobFacts facts;
  std::vector<LayerRankFigures> layer;  // --layer: one per rank, on rank 0
  int exit_code = 0;                    // 0 ok, 1 check failed
};

// Collective. Bad input throws InputError on every rank (the ranks agree first, on errors and then
// on the whole plan); a failure after validation throws AgreedFailure (every rank knows) or
// RuntimeFailure. Sets the communicator's watchdog to the plan's.
RunResult run_job(comm::Comm& comm, const JobConfig& cfg);

// High-water mark of this process's resident memory in bytes.
Index peak_rss_bytes();

}  // namespace ringattn::runtime
