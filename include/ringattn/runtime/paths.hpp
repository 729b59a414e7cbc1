#pragma once
// Paths, small formatting helpers and the gather of positional tensors the job modes share.
#include <span>
#include <string>
#include <vector>

#include "ringattn/comm/group.hpp"
#include "ringattn/core/layout.hpp"

#include "ringattn/core/shape.hpp"

namespace ringattn::runtime {

// DIR/FILE as a string.
std::string path_in(const std::string& dir, const std::string& file);
// A shape as "[2, 3]", for messages.
std::string shape_str(const std::vector<core::Index>& v);
// "0,1,2" (or with another separator).
std::string join(std::span<const core::Index> v, const char* sep = ",");

// Every rank's [outer, L, inner] part of a positional tensor, placed at the layout's positions:
// the global [outer, S, inner], on `root` (others get nothing) or with root < 0 on every rank.
// Collective.
std::vector<double> gather_positions(const comm::Group& g, std::span<const double> mine, core::Index outer,
                                     core::Index inner, const core::Layout& l, int root);

}  // namespace ringattn::runtime
