#pragma once
// The worked example's data and the lab's input files (private to src/runtime).
#include <string>

#include "ringattn/runtime/lab.hpp"

namespace ringattn::runtime::detail {

// q.npy k.npy v.npy dout.npy of `dir`, whole, as float64; each validated (InputError).
LabInputs read_inputs(const std::string& dir);
// --layer: the worked example with a model dimension M = 2; q, k, v and dout become X Wq, X Wk, X Wv and
// dY Wo^T in `in`.
LabLayer example_layer(LabInputs& in);

}  // namespace ringattn::runtime::detail
