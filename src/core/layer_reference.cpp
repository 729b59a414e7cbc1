#include "ringattn/core/layer_reference.hpp"

#include <fmt/format.h>

#include <numeric>

#include "ringattn/core/errors.hpp"
#include "ringattn/core/rope.hpp"

namespace ringattn::core {

namespace {

// c[m, n] (+)= op(a) op(b), row-major; op(a) is [m, k] (a stored [k, m] when ta), op(b) [k, n].
void matmul(const std::vector<double>& a, bool ta, const std::vector<double>& b, bool tb, Index m, Index k, Index n,
            std::vector<double>& c, bool accumulate = false) {
  if (!accumulate) c.assign(m * n, 0.0);
  for (Index i = 0; i < m; ++i)
    for (Index p = 0; p < k; ++p) {
      const double aip = ta ? a[p * m + i] : a[i * k + p];
      if (aip == 0.0) continue;
      for (Index j = 0; j < n; ++j) c[i * n + j] += aip * (tb ? b[j * k + p] : b[p * n + j]);
    }
}

void expect_size(const std::vector<double>& v, Index n, const char* name) {
  if (static_cast<Index>(v.size()) != n)
    throw InputError(fmt::format("reference_layer: {} has {} elements (expected {})", name, v.size(), n));
}

std::vector<Index> all_positions(Index S) {
  std::vector<Index> p(S);
  std::iota(p.begin(), p.end(), Index{0});
  return p;
}

}  // namespace

DenseResult reference_attention_rope(const Shape& s, const Mask& mask, double scale, double rope_theta,
                                     const std::vector<double>& q, const std::vector<double>& k,
                                     const std::vector<double>& v, const std::vector<double>& dout, bool backward,
                                     const AttentionExtras& extras) {
  const std::vector<Index> pos = all_positions(s.S);
  const Rope rope(rope_theta, s.D, pos);
  std::vector<double> qr = q, kr = k;
  rope.forward(s.B, s.H, qr.data());
  rope.forward(s.B, s.HKV, kr.data());
  DenseResult r = reference_attention(s, mask, scale, qr, kr, v, dout, backward, extras);
  if (backward) {
    rope.backward(s.B, s.H, r.dq.data());
    rope.backward(s.B, s.HKV, r.dk.data());
  }
  return r;
}

LayerResult reference_layer(const Shape& s, Index M, const Mask& mask, double scale, std::optional<double> rope_theta,
                            const LayerTensors& in, bool backward) {
  const Index BS = s.B * s.S, HD = s.H * s.D, KD = s.HKV * s.D;
  expect_size(in.x, BS * M, "x");
  expect_size(in.wq, M * HD, "wq");
  expect_size(in.wk, M * KD, "wk");
  expect_size(in.wv, M * KD, "wv");
  expect_size(in.wo, HD * M, "wo");
  expect_size(in.dy, BS * M, "dy");

  // step 1: projections, [B*S, M] x [M, H*D] -> [B*S, H*D] = [B, S, H, D]
  std::vector<double> q, k, v, dout;
  matmul(in.x, false, in.wq, false, BS, M, HD, q);
  matmul(in.x, false, in.wk, false, BS, M, KD, k);
  matmul(in.x, false, in.wv, false, BS, M, KD, v);
  // dO = dY Wo^T needs only inputs; the attention reference takes it with q, k, v.
  matmul(in.dy, false, in.wo, true, BS, M, HD, dout);

  // step 2: attention (with RoPE on global positions 0..S-1; dq, dk come back unrotated)
  const DenseResult att = rope_theta ? reference_attention_rope(s, mask, scale, *rope_theta, q, k, v, dout, backward)
                                     : reference_attention(s, mask, scale, q, k, v, dout, backward);

  // step 3: output projection Y = O Wo
  LayerResult r;
  matmul(att.o, false, in.wo, false, BS, HD, M, r.y);
  for (Index n = 0; n < BS * M; ++n) r.loss += in.dy[n] * r.y[n];
  if (!backward) return r;

  // in the forward pass this was: Y = O Wo, so now: dWo = O^T dY (dO was formed above)
  matmul(att.o, true, in.dy, false, HD, BS, M, r.dwo);
  // in the forward pass this was: Q = X Wq (and K, V), so now: dX = sum dQ Wq^T, dWq = X^T dQ
  matmul(att.dq, false, in.wq, true, BS, HD, M, r.dx);
  matmul(att.dk, false, in.wk, true, BS, KD, M, r.dx, true);
  matmul(att.dv, false, in.wv, true, BS, KD, M, r.dx, true);
  matmul(in.x, true, att.dq, false, M, BS, HD, r.dwq);
  matmul(in.x, true, att.dk, false, M, BS, KD, r.dwk);
  matmul(in.x, true, att.dv, false, M, BS, KD, r.dwv);
  return r;
}

}  // namespace ringattn::core
