#include "ringattn/core/cost_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ringattn/core/errors.hpp"
#include "ringattn/core/head_split.hpp"

namespace ringattn::core {

void CostInputs::validate() const {
  // The shape's rules are the plan's (runtime::check_shape, which `ringattn plan` applies first);
  // here only what the cost model adds.
  if (B < 1 || S < 1 || H < 1 || HKV < 1 || D < 1 || H % HKV != 0)
    throw InputError(fmt::format("cost model: shape B={} S={} H={} HKV={} D={} was not checked by the plan", B, S, H,
                                 HKV, D));
  if (N < 1) throw InputError(fmt::format("--ranks: {} is not a positive size (expected >= 1)", N));
  if (N > std::numeric_limits<int>::max())  // MPI numbers ranks with an int
    throw InputError(fmt::format("--ranks: {} is more ranks than MPI can number (expected at most {})", N,
                                 std::numeric_limits<int>::max()));
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

namespace {

StrategyEstimate estimate_strategy(const CostInputs& in, const CostEstimate& ring, const char* name, Index U) {
  StrategyEstimate e;
  e.strategy = name;
  e.U = U;
  if (in.N % U != 0) {
    e.impossible = fmt::format("U={} does not divide N={} (expected N % U == 0)", U, in.N);
    return e;
  }
  if (in.H % U != 0) {
    e.impossible = fmt::format("H={} query heads do not split over U={} devices (expected H % U == 0)", in.H, U);
    return e;
  }
  const HeadSplit h = split_heads(Shape{in.B, in.S, in.H, in.HKV, in.D}, U);
  const double S = double(in.S), N = double(in.N), B = double(in.B), D = double(in.D), p = in.bytes;
  const double u = double(U), R = N / u, L = S / N, HKVg = u * double(h.HKVu);
  e.a2a_recv_elems = (u - 1) / u * B * L * (2.0 * double(in.H) + 2.0 * HKVg) * D;
  e.lse_recv_elems = (u - 1) / u * B * L * double(in.H);
  e.a2a_recv_bytes = (e.a2a_recv_elems + e.lse_recv_elems) * p;
  e.ring_recv_bytes = (R - 1) * 2.0 * B * (S / R) * double(h.HKVu) * D * p;
  e.recv_bytes = e.a2a_recv_bytes + e.ring_recv_bytes;
  e.compute_s = ring.compute_s;  // the same pairs per device, whatever the split
  e.a2a_s = e.a2a_recv_bytes / in.bandwidth;
  if (R > 1) {
    e.step_intensity = step_intensity(S / R, h.Hu, h.HKVu, p, in.causal);
    e.step_comm_ratio = ring.beta / e.step_intensity;
  }
  e.predicted_s = e.compute_s * std::max(1.0, e.step_comm_ratio) + e.a2a_s;
  e.comm_ratio = e.a2a_s / e.compute_s + e.step_comm_ratio;
  e.verdict = verdict_for(e.comm_ratio, in.N > 1);
  return e;
}

// Forward: group g+1's gather overlaps group g's compute; the first gather is exposed, and a group
// whose gather outlasts its compute exposes the difference.
StrategyEstimate estimate_allgather(const CostInputs& in, const CostEstimate& ring) {
  StrategyEstimate e;
  e.strategy = "allgather";
  const double S = double(in.S), N = double(in.N), B = double(in.B), D = double(in.D), p = in.bytes;
  e.kv_head_group = default_kv_head_group(in.B, in.S, in.HKV, in.D, p);
  const double groups = double(in.HKV / e.kv_head_group);
  e.ag_recv_bytes = (N - 1) / N * B * S * 2.0 * double(in.HKV) * D * p;
  e.recv_bytes = e.ag_recv_bytes;
  e.gathered_bytes = 2.0 * 2.0 * B * double(e.kv_head_group) * S * D * p;
  e.compute_s = ring.compute_s;
  const double gather = e.ag_recv_bytes / groups / in.bandwidth, compute = e.compute_s / groups;
  e.exposed_gather_s = gather + (groups - 1) * std::max(0.0, gather - compute);
  e.predicted_s = e.compute_s + e.exposed_gather_s;
  e.comm_ratio = e.exposed_gather_s / e.compute_s;
  e.verdict = verdict_for(e.comm_ratio, in.N > 1);
  return e;
}

}  // namespace

Index default_kv_head_group(Index B, Index S, Index HKV, Index D, double bytes) {
  const double per_head = 2.0 * 2.0 * double(B) * double(S) * double(D) * bytes, budget = 256.0 * 1048576.0;
  auto fits = [&](Index G) { return HKV / G >= 2 && double(G) * per_head <= budget; };
  // The largest divisor G of HKV that fits, from the divisor pairs (d, HKV/d) with d <= sqrt(HKV):
  // the first d whose partner fits gives it; else the largest d that fits. The walk stops at the
  // first d too large to fit (no later d nor its partner, which is larger, fits either), so it
  // takes at most min(sqrt(HKV), the heads that fit) steps, even for a prime HKV.
  Index best = 1;
  for (Index d = 1; d <= HKV / d && fits(d); ++d) {
    if (HKV % d != 0) continue;
    if (fits(HKV / d)) return HKV / d;
    best = d;
  }
  return best;
}

std::vector<StrategyEstimate> estimate_strategies(const CostInputs& in) {
  const CostEstimate ring = estimate_cost(in);
  std::vector<StrategyEstimate> out = {estimate_strategy(in, ring, "ring", 1)};
  StrategyEstimate uly = estimate_strategy(in, ring, "ulysses", in.N);
  if (!uly.impossible.empty())
    uly.impossible = fmt::format("H={} query heads do not split over N={} devices (expected H % N == 0)", in.H, in.N);
  out.push_back(uly);
  std::vector<Index> us;  // every U with 1 < U < N dividing N, from the pairs (d, N/d), d <= sqrt(N)
  for (Index d = 2; d <= in.N / d; ++d)
    if (in.N % d == 0) {
      us.push_back(d);
      if (d != in.N / d) us.push_back(in.N / d);
    }
  std::sort(us.begin(), us.end());
  for (const Index U : us) out.push_back(estimate_strategy(in, ring, "usp", U));
  out.push_back(estimate_allgather(in, ring));
  return out;
}

const StrategyEstimate& predicted_best(const std::vector<StrategyEstimate>& e) {
  const StrategyEstimate* best = &e.front();
  for (const StrategyEstimate& x : e)
    if (x.impossible.empty() && x.predicted_s < best->predicted_s) best = &x;
  return *best;
}

}  // namespace ringattn::core
