#pragma once
// Helpers the MPI tests share: the world communicator, global inputs generated from a seed (the
// same numbers whatever N), and one rank's slice of a global tensor.
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/inputs.hpp"
#include "ringattn/core/layout.hpp"

namespace ringattn::test_util {

// The world, with a watchdog: a test that hangs ends with a message instead of the ctest timeout.
inline const comm::Comm& world() {
  static const comm::Comm c = [] {
    comm::Comm w = comm::Comm::world();
    w.set_timeout(60);
    return w;
  }();
  return c;
}

// Global tensor [outer, S, inner] of input `id` from `seed`, times `scale`, rounded to T as the
// ranks see it, held in double for the references.
template <class T>
std::vector<double> global_input(std::uint64_t seed, core::InputTensor id, core::Index outer, core::Index S,
                                 core::Index inner, double scale = 1.0) {
  std::vector<double> g(outer * S * inner);
  const core::Run all{0, 0, S};
  core::generate_positions<double>(seed, id, outer, S, inner, {&all, 1}, S, g.data());
  for (double& x : g) x = static_cast<double>(static_cast<T>(x * scale));
  return g;
}

// Rank r's positions of a global [outer, S, inner] tensor: [outer, L_r, inner] in T.
template <class T>
std::vector<T> local_slice(const std::vector<double>& g, core::Index outer, core::Index inner, const core::Layout& l,
                           int r) {
  const core::Index L = l.size(r), S = l.seq();
  const auto pos = l.positions(r);
  std::vector<T> x(outer * L * inner);
  for (core::Index a = 0; a < outer; ++a)
    for (core::Index i = 0; i < L; ++i)
      for (core::Index e = 0; e < inner; ++e)
        x[(a * L + i) * inner + e] = static_cast<T>(g[(a * S + pos[i]) * inner + e]);
  return x;
}

}  // namespace ringattn::test_util
