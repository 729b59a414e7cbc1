#pragma once
// `ringattn decode`: prefill a generated prompt of S0 positions into a KV cache sharded over the
// ranks, then K decode steps of T tokens each; optionally checked against dense float64 causal
// attention over all S0 + K T positions (decode rows are its last rows).
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/io/json.hpp"
#include "ringattn/runtime/kv_cache.hpp"

namespace ringattn::runtime {

struct DecodeConfig {
  Index cache_len = 1024, new_tokens = 1, steps = 8;  // S0, T, K
  std::optional<Index> batch, heads, kv_heads, head_dim;
  std::string dtype = "f32", layout = "auto";
  std::string prefill = "attend";  // attend (the ring forward) or load (the prompt's K/V kept unattended)
  std::string merge = "allreduce";  // allreduce or gather (KVCacheOptions::merge)
  bool timing_only = false;        // simulation: each step's bytes (or flops) charged, nothing computed
  double memory_bandwidth = 200e9; // bytes/s per rank a timing-only step reads its K/V at
  Index stream_mib = 2048;         // the stream measurement's buffer, over all ranks (>= 256 MiB each); 0: none
  std::optional<Index> window;
  std::optional<double> scale;
  std::optional<double> timeout_s;
  std::uint64_t seed = 0;
  bool check = false;
  std::string out, report;
};

struct DecodeResult {
  core::Shape shape;  // S: all S0 + K T positions
  std::string dtype, layout, mask, simd;
  int ranks = 1;
  double timeout_s = 0;  // the watchdog the job ran under (--timeout, or the default); 0: none
  double prefill_s = 0, decode_step_s = 0;  // slowest rank; the median step
  double stream_bytes_per_s = 0;            // rank 0's streaming read bandwidth, measured here
  std::vector<double> rank_stream_bytes_per_s;  // per rank, all ranks reading at once
  Index stream_buffer_bytes = 0;            // per rank
  Index state_values = 0;                   // B T H (D + 2): one rank's partial state
  double merge_alone_s = 0;                 // the merge of state_values values, all ranks starting together
  double allreduce_s = 0;                   // MPI_Allreduce (sum) of state_values values: median, slowest rank
  std::vector<Index> cache_positions, kv_bytes_per_step;  // per rank, at the last step
  std::vector<double> step_s, merge_s, attend_s;          // per rank, median over the steps
  bool identical_on_every_rank = true;      // every decode O bit for bit the same on every rank
  bool checked = false, passed = true;
  double tolerance = 0, err_o_prefill = 0, err_lse_prefill = 0, err_o_decode = 0, err_lse_decode = 0;
  int exit_code = 0;
  io::Json report;
  // Collective: appends every rank's (cache positions, K/V bytes per step, step, merge, attention,
  // stream) to the per-rank vectors above.
  void per_rank(const comm::Comm& comm, const std::array<double, 6>& mine);
};

// Collective. Throws InputError (the same on every rank) for bad options.
DecodeResult run_decode(comm::Comm& comm, const DecodeConfig& c);

}  // namespace ringattn::runtime
