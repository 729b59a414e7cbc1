#include "ringattn/runtime/strategy.hpp"

#include <fmt/format.h>

#include "ringattn/core/errors.hpp"
#include "ringattn/runtime/ring_attention.hpp"

namespace ringattn::runtime {

const char* strategy_name(StrategyKind k) {
  switch (k) {
    case StrategyKind::ring: return "ring";
    case StrategyKind::ulysses: return "ulysses";
    case StrategyKind::usp: return "usp";
  }
  return "?";
}

StrategyKind parse_strategy(const std::string& name) {
  if (name == "ring") return StrategyKind::ring;
  throw InputError(fmt::format("--strategy: unknown strategy '{}' (expected ring)", name));
}

template <class S>
std::unique_ptr<Strategy<S>> make_strategy(const comm::Comm& comm, const StrategySetup& setup) {
  return std::make_unique<RingAttention<S>>(comm, setup);
}

template std::unique_ptr<Strategy<float>> make_strategy<float>(const comm::Comm&, const StrategySetup&);
template std::unique_ptr<Strategy<double>> make_strategy<double>(const comm::Comm&, const StrategySetup&);
template std::unique_ptr<Strategy<core::bf16>> make_strategy<core::bf16>(const comm::Comm&, const StrategySetup&);
template std::unique_ptr<Strategy<core::f16>> make_strategy<core::f16>(const comm::Comm&, const StrategySetup&);

}  // namespace ringattn::runtime
