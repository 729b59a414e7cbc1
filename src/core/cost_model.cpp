#include "ringattn/core/cost_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ringattn/core/errors.hpp"

namespace ringattn::core {

void CostInputs::validate() const {
  auto positive = [](Index v, const char* opt) {
    if (v < 1) throw InputError(fmt::format("{}: {} is not a positive size (expected >= 1)", opt, v));
  };
  positive(S, "--seq");
  positive(N, "--ranks");
  positive(H, "--heads");
  positive(HKV, "--kv-heads");
  positive(D, "--head-dim");
  positive(B, "--batch");
  if (H % HKV != 0)
    throw InputError(fmt::format("--kv-heads: H={} is not a multiple of HKV={} (expected H % HKV == 0)", H, HKV));
  auto rate = [](double v, const char* opt, const char* unit) {
    if (!(v > 0) || !std::isfinite(v))
      throw InputError(fmt::format("{}: {} is not a positive number (expected {} > 0)", opt, v, unit));
  };
  rate(bytes, "--bytes", "bytes per element");
  rate(flops, "--flops", "FLOP/s");
  rate(bandwidth, "--bandwidth", "one-way bytes/s");
}

Verdict verdict_for(double comm_ratio, bool communicates) {
  if (!communicates) return Verdict::no_communication;
  if (comm_ratio < 0.05) return Verdict::overlap_has_room;
  if (comm_ratio <= 0.15) return Verdict::depends_on_implementation;
  return Verdict::not_negligible;
}

const char* verdict_text(Verdict v) {
  switch (v) {
    case Verdict::no_communication: return "no communication";
    case Verdict::overlap_has_room: return "overlap has room";
    case Verdict::depends_on_implementation: return "depends on the implementation";
    case Verdict::not_negligible: return "communication is not negligible";
  }
  return "?";
}

double step_intensity(double L, Index H, Index HKV, double bytes, bool causal) {
  // 4 B L^2 H D / (2 B L HKV D p): B and D cancel, one L cancels.
  const double full = 2.0 * L * double(H) / (double(HKV) * bytes);
  return causal ? 0.5 * full : full;
}

CostEstimate estimate_cost(const CostInputs& in) {
  in.validate();
  const double S = double(in.S), N = double(in.N), H = double(in.H), HKV = double(in.HKV), D = double(in.D),
               B = double(in.B), p = in.bytes;
  const double L = S / N;                    // shard length
  const double useful = in.causal ? 0.5 : 1.0;  // causal: the mean device does half the pairs
  const double block_bytes = B * L * 2.0 * HKV * D * p;  // one K/V block
  CostEstimate e;
  e.recv_bytes = (N - 1.0) * block_bytes;    // = (N-1)/N B S 2 HKV D p
  e.send_bytes = e.recv_bytes;
  e.work_flops = useful * 4.0 * B * L * S * H * D;
  e.beta = in.flops / in.bandwidth;
  e.layer_intensity = in.N > 1 ? e.work_flops / e.recv_bytes : std::numeric_limits<double>::infinity();
  e.step_intensity = step_intensity(L, in.H, in.HKV, p, in.causal);
  e.compute_s = e.work_flops / in.flops;
  e.comm_s = e.recv_bytes / in.bandwidth;
  e.comm_ratio = e.comm_s / e.compute_s;
  e.step_compute_s = useful * 4.0 * B * L * L * H * D / in.flops;
  e.step_comm_s = in.N > 1 ? block_bytes / in.bandwidth : 0.0;
  e.step_comm_ratio = e.step_comm_s / e.step_compute_s;
  // I_step(N) = (H/HKV) (S/N) (2/p) u >= beta  <=>  N <= (H/HKV) S (2/p) u / beta. One device never
  // communicates, so 1 always qualifies; more ranks than positions would leave ranks empty.
  e.max_ranks_bound = step_intensity(S, in.H, in.HKV, p, in.causal) / e.beta;
  e.max_ranks = std::max<Index>(1, static_cast<Index>(std::floor(std::min(e.max_ranks_bound, S))));
  e.causal_utilization = (N + 1.0) / (2.0 * N);
  e.causal_utilization_tri = N / (2.0 * N - 1.0);
  e.ulysses_recv_bytes = (N - 1.0) / N * B * L * (2.0 * H + 2.0 * HKV) * D * p;
  e.tp_bytes = 4.0 * B * S * H * D * p;
  e.verdict = verdict_for(e.step_comm_ratio, in.N > 1);
  return e;
}

}  // namespace ringattn::core
