#pragma once
// Helpers the MPI tests share: the world communicator, global inputs generated from a seed (the
// same numbers whatever N), one rank's slice of a global tensor, its error against a global
// reference, and a whole attention problem (inputs, reference, slices, a strategy's setup).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/inputs.hpp"
#include "ringattn/core/layout.hpp"
#include "ringattn/core/mask.hpp"
#include "ringattn/core/reference.hpp"
#include "ringattn/runtime/strategy.hpp"

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

// Max relative error over all ranks of rank r's slice `mine` of a global [outer, S, inner] tensor
// against its reference `ref` (relative to max |ref|; a NaN, or an inf where the reference has
// none, is an infinite error).
template <class T>
double rel_error(const std::vector<T>& mine, const std::vector<double>& ref, core::Index outer, core::Index inner,
                 const core::Layout& l, int r) {
  const std::vector<double> want = local_slice<double>(ref, outer, inner, l, r);
  double diff = 0, scale = 0;
  for (double x : ref)
    if (std::isfinite(x)) scale = std::max(scale, std::abs(x));
  for (std::size_t n = 0; n < want.size(); ++n) {
    const double x = static_cast<double>(mine[n]);
    if (std::isnan(x) || ((std::isinf(x) || std::isinf(want[n])) && x != want[n])) {
      diff = std::numeric_limits<double>::infinity();
      break;
    }
    if (std::isfinite(x)) diff = std::max(diff, std::abs(x - want[n]));
  }
  return world().max(diff) / (scale > 0 ? scale : 1.0);
}

struct Errors {
  double o = 0, lse = 0, dq = 0, dk = 0, dv = 0;
  double max() const { return std::max({o, lse, dq, dk, dv}); }
};

// One attention problem on the world's ranks: the layout and mask, the global inputs from `seed`
// (rounded to T), the dense float64 reference, this rank's slices of the inputs, and a strategy
// setup that points at the layout and mask (so a Problem stays where it was made).
template <class T>
struct Problem {
  core::Shape s;
  core::Layout layout;
  core::Mask mask;
  double scale;
  core::Index qi, ki;  // elements per position: H D and HKV D
  std::vector<double> q, k, v, dout;
  core::DenseResult ref;
  std::vector<T> lq, lk, lv, ld;

  Problem(std::uint64_t seed, const core::Shape& shape, core::LayoutKind kind, const std::vector<core::Index>& partition,
          bool causal, core::Index window, const std::vector<core::Index>& docs)
      : s(shape),
        layout(core::Layout::make(kind, shape.S, world().size(), partition)),
        mask(core::Mask::make(shape.S, causal, window, docs)),
        scale(1.0 / std::sqrt(double(shape.D))),
        qi(shape.H * shape.D),
        ki(shape.HKV * shape.D),
        q(global_input<T>(seed, core::InputTensor::q, s.B, s.S, qi)),
        k(global_input<T>(seed, core::InputTensor::k, s.B, s.S, ki)),
        v(global_input<T>(seed, core::InputTensor::v, s.B, s.S, ki)),
        dout(global_input<T>(seed, core::InputTensor::dout, s.B, s.S, qi)),
        ref(core::reference_attention(s, mask, scale, q, k, v, dout)),
        lq(local_slice<T>(q, s.B, qi, layout, rank())),
        lk(local_slice<T>(k, s.B, ki, layout, rank())),
        lv(local_slice<T>(v, s.B, ki, layout, rank())),
        ld(local_slice<T>(dout, s.B, qi, layout, rank())) {}
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  static int rank() { return world().rank(); }
  core::Index local_size() const { return layout.size(rank()); }

  runtime::StrategySetup setup(core::Tiling tiling) const {
    runtime::StrategySetup st;
    st.shape = s;
    st.layout = &layout;
    st.mask = &mask;
    st.scale = scale;
    st.tiling = tiling;
    return st;
  }

  // This rank's outputs (file order) against the reference, max over the ranks.
  template <class A>
  Errors errors(const std::vector<A>& o, const std::vector<A>& lse, const std::vector<A>& dq, const std::vector<A>& dk,
                const std::vector<A>& dv) const {
    const int r = rank();
    return Errors{rel_error(o, ref.o, s.B, qi, layout, r), rel_error(lse, ref.lse, s.B * s.H, 1, layout, r),
                  rel_error(dq, ref.dq, s.B, qi, layout, r), rel_error(dk, ref.dk, s.B, ki, layout, r),
                  rel_error(dv, ref.dv, s.B, ki, layout, r)};
  }
};

}  // namespace ringattn::test_util
