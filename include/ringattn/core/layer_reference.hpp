#pragma once
// Dense float64 reference of a whole attention layer over global tensors, forward and backward.
// Only --check and the tests use it. Plain loops; attention is core::reference_attention.
//   x, y, dy, dx [B, S, M];  wq, dwq [M, H*D];  wk, wv, dwk, dwv [M, HKV*D];  wo, dwo [H*D, M]
// Forward:  Q = X Wq, K = X Wk, V = X Wv (head h = columns h*D .. h*D+D-1, so Q as [B, S, H*D] is
//           the attention layout [B, S, H, D]); optional RoPE on Q and K at positions 0..S-1;
//           O = attention(Q, K, V); Y = O Wo.
// Backward from dY (loss = sum dY . Y): dO = dY Wo^T, attention backward, RoPE backward on dQ, dK,
//           dX = dQ Wq^T + dK Wk^T + dV Wv^T, dWq = X^T dQ, dWk = X^T dK, dWv = X^T dV, dWo = O^T dY.
#include <optional>
#include <vector>

#include "ringattn/core/mask.hpp"
#include "ringattn/core/reference.hpp"

namespace ringattn::core {

struct LayerTensors {
  std::vector<double> x, wq, wk, wv, wo, dy;
};

struct LayerResult {
  std::vector<double> y, dx, dwq, dwk, dwv, dwo;
  double loss = 0;  // sum dy . y
};

// Throws InputError when a tensor's size does not match the shape.
LayerResult reference_layer(const Shape& s, Index M, const Mask& mask, double scale, std::optional<double> rope_theta,
                            const LayerTensors& in, bool backward = true);

// Attention with RoPE on q and k at positions 0..S-1 (`run --rope` without --layer): o and lse of
// the rotated inputs; dq and dk with respect to q and k before rotation.
DenseResult reference_attention_rope(const Shape& s, const Mask& mask, double scale, double rope_theta,
                                     const std::vector<double>& q, const std::vector<double>& k,
                                     const std::vector<double>& v, const std::vector<double>& dout,
                                     bool backward = true, const AttentionExtras& extras = {});

}  // namespace ringattn::core
