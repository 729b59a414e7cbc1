#pragma once
// `ringattn probe`: measure this machine in three steps, under mpirun, and a fourth on request.
//   1. ring sendrecv bandwidth between neighbours, 4 KiB .. 64 MiB;
//   2. the block compute rate of this shape: block_forward on a shard-size block, S/N x S/N;
//   3. beta = compute rate / bandwidth at one K/V block, the predicted per-step comm/compute
//      beta / I_step, and the measured one from the real ring for this shape, with the verdict.
//   4. with --strategies, each strategy named (ring, ulysses, usp, allgather) is timed forward and
//      backward on the live ranks for the shape; those the shape forbids are listed with the
//      reason, not run.
// The measurements and their JSON; the command line prints the tables.
#include <optional>
#include <string>
#include <vector>

#include "ringattn/comm/bandwidth.hpp"
#include "ringattn/comm/comm.hpp"
#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/shape.hpp"
#include "ringattn/io/json.hpp"

namespace ringattn::runtime {

using core::Index;

struct ProbeConfig {
  std::optional<Index> seq, batch, heads, kv_heads, head_dim;
  std::string dtype = "f32";
  std::string precision = "f32";  // as run's: bf16 rounds P to bf16 for bf16 dot products (--dtype bf16)
  bool causal = false;
  std::string layout = "auto";  // as run: zigzag for a causal mask, contiguous otherwise
  comm::BandwidthOptions bw;
  double budget_s = 1.0;  // per compute measurement (kernel, ring): fewer repetitions when slow
  bool json = false;
  std::vector<std::string> strategies;  // --strategies ring,ulysses,usp; empty: none timed
  std::optional<int> ulysses_degree;    // usp's U; without it, every U with 1 < U < N dividing N
};

// One strategy timed on the live ranks: slowest rank, median over the repetitions.
struct StrategyProbe {
  std::string strategy;
  int ulysses_degree = 1;
  std::string forbidden;  // why the shape forbids it (then nothing else is filled in)
  double forward_s = 0, backward_s = 0;
  double exposed_wait_s = 0;  // forward + backward time waiting for transfers (all-to-alls included)
  double a2a_wait_s = 0;      // the all-to-alls' part of it
  Index recv_bytes = 0;       // the busiest rank's, forward + backward
  int iters = 0;
};

struct Probe {  // everything measured and derived, as rank 0 reports it
  core::Shape shape;
  core::Precision precision = core::Precision::f32;
  core::DType dtype;
  std::string layout;  // the ring run's, resolved (auto: zigzag with --causal, contiguous otherwise)
  int N = 1;
  Index L = 0;              // largest shard: the block the kernel is timed on and the ring moves
  double block_bytes = 0;   // one K/V block: 2 B L HKV D p
  std::vector<comm::BandwidthSample> bandwidth;
  double kernel_s = 0, kernel_flops = 0, compute_flops = 0;
  double block_gbps = 0, beta = 0, step_intensity = 0;
  double predicted_step_compute_s = 0, predicted_step_comm_s = 0, predicted_comm_ratio = 0;
  double ring_forward_s = 0, measured_step_compute_s = 0, measured_step_comm_s = 0, measured_comm_ratio = 0;
  double exposed_wait_ratio = 0;
  int kernel_iters = 0, ring_iters = 0;
  std::vector<StrategyProbe> strategies;
  int recommended = -1;       // index of the least measured forward + backward; -1: none run
  std::string plan_recommended;  // what the cost model predicts with this machine's figures
  int plan_recommended_degree = 1;
};

// Collective. Validates the options (InputError, the same on every rank), checks that every rank
// was given the same ones, sets the watchdog of a run of this shape on `comm`, and measures.
Probe run_probe(comm::Comm& comm, const ProbeConfig& c);

io::Json probe_json(const ProbeConfig& c, const Probe& p);

}  // namespace ringattn::runtime
