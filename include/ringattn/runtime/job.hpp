#pragma once
// `ringattn run` as a library call: inputs (read or generated), timed iterations of the ring
// forward and backward, the dense check, atomic outputs, the report and the summary.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/block_attention.hpp"

namespace ringattn::runtime {

using core::Index;

struct JobConfig {
  // Shape; empty = not given (with --inputs the files decide; otherwise defaults apply).
  std::optional<Index> seq, batch, heads, kv_heads, head_dim;
  std::string dtype;
  bool causal = false;
  Index window = 0;
  std::vector<Index> doc_lens;
  std::string layout = "contiguous";
  std::vector<Index> partition;
  std::optional<double> scale;
  std::uint64_t seed = 0;
  std::string inputs, out, report, trace;
  bool check = false, backward = true;
  int warmup = 0, iters = 1;
  double timeout = 0;
  core::Tiling tiling;
  std::string traffic = "aware";  // full | aware | skip-empty (see core::RingPlan)
  std::optional<double> rope;     // --rope THETA: RoPE on q and k at global positions (D even)
  // Test hooks, see RingSetup.
  int drop_grad_step = -1;
  int stall_rank = -1;
  double stall_s = 0;
};

// Default shape when neither options nor files give it.
inline constexpr Index kDefaultSeq = 1024, kDefaultBatch = 1, kDefaultHeads = 4, kDefaultHeadDim = 64;

// Returns the exit code (0 ok, 1 check failed). Bad input throws InputError on every rank
// (the ranks agree first), runtime failures throw RuntimeFailure.
int run_job(const comm::Comm& comm, const JobConfig& cfg);

// Relative tolerance of --check against the float64 reference: f32 3e-4 (a few hundred ulps of
// float after exp amplifies score rounding by |S|, and sums over S keys), f64 1e-10.
double check_tolerance(core::DType t);

}  // namespace ringattn::runtime
