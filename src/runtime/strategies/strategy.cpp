#include "ringattn/runtime/strategy.hpp"

#include <fmt/format.h>

#include "ringattn/core/errors.hpp"
#include "ringattn/runtime/allgather_attention.hpp"
#include "ringattn/runtime/ring_attention.hpp"
#include "ringattn/runtime/ulysses_attention.hpp"

namespace ringattn::runtime {

const char* strategy_name(StrategyKind k) {
  switch (k) {
    case StrategyKind::ring: return "ring";
    case StrategyKind::ulysses: return "ulysses";
    case StrategyKind::usp: return "usp";
    case StrategyKind::allgather: return "allgather";
  }
  return "?";
}

int ulysses_degree(StrategyKind k, int given, int N) {
  switch (k) {
    case StrategyKind::ring: return 1;
    case StrategyKind::ulysses: return N;
    case StrategyKind::usp: return given;
    case StrategyKind::allgather: return 1;
  }
  return 1;
}

bool has_ring_traffic(StrategyKind k) { return k == StrategyKind::ring || k == StrategyKind::usp; }

std::string strategy_rule_violation(StrategyKind k, int given, Index H, int N) {
  if (k == StrategyKind::ulysses && H % N != 0)
    return fmt::format("@strategy ulysses: H={} query heads do not split over N={} ranks (expected H % N == 0); "
                       "use @strategy usp with a @ulysses_degree that divides H and N, or @strategy ring",
                       H, N);
  if (k != StrategyKind::usp) return {};
  if (given == 0)
    return "@strategy usp: needs @ulysses_degree U (U divides N and H; U = 1 is ring, U = N is ulysses)";
  if (given < 1) return fmt::format("@ulysses_degree: {} is not >= 1", given);
  if (N % given != 0)
    return fmt::format("@ulysses_degree: U={} does not divide N={} ranks (expected N % U == 0)", given, N);
  if (H % given != 0)
    return fmt::format("@ulysses_degree: H={} query heads do not split over U={} ranks (expected H % U == 0); "
                       "use a U that divides H and N, or @strategy ring",
                       H, given);
  return {};
}

template <class S>
std::unique_ptr<Strategy<S>> make_strategy(const comm::Comm& comm, const StrategySetup& setup) {
  if (setup.kind == StrategyKind::ring) return std::make_unique<RingAttention<S>>(comm, setup);
  if (setup.kind == StrategyKind::allgather) return std::make_unique<AllGatherAttention<S>>(comm, setup);
  return std::make_unique<UlyssesAttention<S>>(comm, setup);
}

template <class S>
std::vector<double> sink_gradient(const comm::Group& group, const Strategy<S>& strategy, Index H) {
  std::vector<double> mine(H, 0.0);
  strategy.add_sink_grad(mine.data());
  const auto shares = group.all_gatherv(std::span<const double>(mine));
  std::vector<double> total(H, 0.0);
  for (const auto& share : shares)  // rank order
    for (Index h = 0; h < H && h < Index(share.size()); ++h) total[h] += share[h];
  return total;
}

template std::vector<double> sink_gradient<float>(const comm::Group&, const Strategy<float>&, Index);
template std::vector<double> sink_gradient<double>(const comm::Group&, const Strategy<double>&, Index);
template std::vector<double> sink_gradient<core::bf16>(const comm::Group&, const Strategy<core::bf16>&, Index);
template std::vector<double> sink_gradient<core::f16>(const comm::Group&, const Strategy<core::f16>&, Index);

template std::unique_ptr<Strategy<float>> make_strategy<float>(const comm::Comm&, const StrategySetup&);
template std::unique_ptr<Strategy<double>> make_strategy<double>(const comm::Comm&, const StrategySetup&);
template std::unique_ptr<Strategy<core::bf16>> make_strategy<core::bf16>(const comm::Comm&, const StrategySetup&);
template std::unique_ptr<Strategy<core::f16>> make_strategy<core::f16>(const comm::Comm&, const StrategySetup&);

}  // namespace ringattn::runtime
