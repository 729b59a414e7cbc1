#pragma once
// `ringattn plan --json`: the cost model's figures, with the inputs echoed under "inputs".
#include "ringattn/core/cost_model.hpp"
#include "ringattn/io/json.hpp"

namespace ringattn::io {

Json plan_json(const core::CostInputs& in, const core::CostEstimate& e);

}  // namespace ringattn::io
