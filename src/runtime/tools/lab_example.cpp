// The two-rank, five-position worked example's fixed tensors, the lab's small input files, and the
// layer the worked example grows into with --layer.
#include <fmt/format.h>

#include <cmath>

#include "lab_detail.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/io/npy.hpp"
#include "ringattn/runtime/paths.hpp"

namespace ringattn::runtime {

using core::Shape;

LabInputs example_inputs() {
  // Small, distinct values so that every block's exp mass differs and every output is visibly
  // different from any single block's softmax.
  LabInputs in;
  in.shape = Shape{1, 5, 1, 1, 2};
  in.q = {0.9, -0.3, 0.2, 0.8, -0.5, 0.4, 0.7, 0.6, -0.1, -0.9};
  in.k = {0.5, 0.1, -0.4, 0.7, 0.3, -0.6, 0.8, 0.2, -0.2, -0.5};
  in.v = {1.0, 0.0, 0.0, 1.0, 0.5, -0.5, -1.0, 0.5, 0.2, 0.8};
  in.g = {1.0, -0.5, 0.3, 0.8, -0.7, 0.2, 0.4, -1.0, 0.6, 0.1};
  // The global mean: every query carries the same weight, dout = G / (B S).
  for (double x : in.g) in.dout.push_back(x / double(in.shape.B * in.shape.S));
  return in;
}

namespace detail {

LabInputs read_inputs(const std::string& dir) {
  auto path = [&](const char* name) { return path_in(dir, name); };
  const char* names[] = {"q.npy", "k.npy", "v.npy", "dout.npy"};
  io::NpyHeader h[4];
  for (int t = 0; t < 4; ++t) {
    h[t] = io::read_npy_header(path(names[t]));
    if (h[t].shape.size() != 4)
      throw InputError(fmt::format("{}: has shape {} (expected 4 dimensions: [B, S, heads, D])", path(names[t]),
                                   shape_str(h[t].shape)));
  }
  const auto& q = h[0].shape;
  LabInputs in;
  in.shape = Shape{q[0], q[1], q[2], h[1].shape[2], q[3]};
  const std::vector<Index> kv = {q[0], q[1], in.shape.HKV, q[3]};
  for (int t = 1; t < 4; ++t) {
    const std::vector<Index>& want = t == 3 ? q : kv;
    if (h[t].shape != want)
      throw InputError(fmt::format("{}: shape {} does not match q.npy {} (expected {})", path(names[t]),
                                   shape_str(h[t].shape), shape_str(q), shape_str(want)));
  }
  std::vector<double>* dst[] = {&in.q, &in.k, &in.v, &in.dout};
  for (int t = 0; t < 4; ++t) {
    *dst[t] = io::read_npy<double>(path(names[t]), h[t]);  // f4 widens to f64 exactly
    for (double x : *dst[t])
      if (!std::isfinite(x))
        throw InputError(fmt::format("{}: non-finite value {} (expected finite inputs)", path(names[t]), x));
  }
  return in;
}

// `lab --layer`: the worked example's shape with a model dimension M = 2. X takes the example's q values
// and dY = G/5 takes dout's place; the weights are small fixed matrices. q, k, v and dout of the
// worked example become X Wq, X Wk, X Wv and dY Wo^T (row-vector convention: [1, M] x [M, H*D]).
LabLayer example_layer(LabInputs& in) {
  const Shape& s = in.shape;
  LabLayer L;
  L.M = 2;
  const Index M = L.M, HD = s.H * s.D, KD = s.HKV * s.D, rows = s.B * s.S;
  L.in.x = in.q;
  L.in.dy = in.dout;
  L.in.wq = {0.8, -0.2, 0.3, 0.9};
  L.in.wk = {0.5, 0.4, -0.6, 0.7};
  L.in.wv = {1.0, 0.2, -0.3, 0.8};
  L.in.wo = {0.6, -0.4, 0.5, 0.9};
  auto times = [&](const std::vector<double>& a, Index ac, const std::vector<double>& w, Index wc, bool w_t) {
    std::vector<double> out(rows * wc, 0.0);  // a [rows, ac] x (w [ac, wc], or w^T with w [wc, ac])
    for (Index r = 0; r < rows; ++r)
      for (Index j = 0; j < wc; ++j)
        for (Index m = 0; m < ac; ++m) out[r * wc + j] += a[r * ac + m] * (w_t ? w[j * ac + m] : w[m * wc + j]);
    return out;
  };
  in.q = times(L.in.x, M, L.in.wq, HD, false);
  in.k = times(L.in.x, M, L.in.wk, KD, false);
  in.v = times(L.in.x, M, L.in.wv, KD, false);
  in.dout = times(L.in.dy, M, L.in.wo, HD, true);
  in.g.clear();  // dout is derived now, not G / 5
  return L;
}

}  // namespace detail

}  // namespace ringattn::runtime
