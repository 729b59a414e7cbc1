#pragma once
// `ringattn plan --json`: the cost model's figures, with the inputs echoed under "inputs".
#include "ringattn/core/cost_model.hpp"
#include "ringattn/io/json.hpp"

namespace ringattn::io {

// With the strategies side by side under "strategies" and the one predicted fastest under
// "recommended" (its name) and "recommended_ulysses_degree".
Json plan_json(const core::CostInputs& in, const core::CostEstimate& e,
               const std::vector<core::StrategyEstimate>& strategies = {});

}  // namespace ringattn::io
