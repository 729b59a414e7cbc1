#pragma once
// Rotary position embedding (RoPE), rotate-half convention, on shards with global positions.
//   x [B, L, heads, D] (file order; heads = H for q, HKV for k), D even, positions[L] global.
//   For i < D/2: angle = p * THETA^(-2i/D)
//     x'[i]       = x[i]       * cos - x[i + D/2] * sin
//     x'[i + D/2] = x[i + D/2] * cos + x[i]       * sin
// The position is always the token's global position, whatever the layout: a rank that used its
// local index instead would rotate every token of a striped or zigzag shard by the wrong angle.
// The rotation is orthogonal, so its backward (dL/dx from dL/dx') is the rotation by -angle.
// Pure: no MPI, no I/O; angles and their cos/sin are computed in double for every dtype.
#include <span>
#include <vector>

#include "ringattn/core/shape.hpp"
#include "ringattn/core/storage.hpp"

namespace ringattn::core {

// Throws InputError unless THETA is finite and > 0 and D is even.
void validate_rope(double theta, Index D);

class Rope {
 public:
  // The cos/sin table of `positions` [L] (global), [L, D/2] each.
  Rope(double theta, Index D, std::span<const Index> positions);

  Index positions() const { return L_; }

  // x [B, L, heads, D] in place: x' = R(angle) x.
  template <class T>
  void forward(Index B, Index heads, T* x) const;
  // dx' [B, L, heads, D] in place: dx = R(angle)^T dx' = R(-angle) dx'.
  template <class T>
  void backward(Index B, Index heads, T* dx) const;

 private:
  template <class T>
  void rotate(Index B, Index heads, T* x, double sign) const;
  Index D_, L_;
  std::vector<double> cos_, sin_;  // [L, D/2]
};

// RoPE around plain attention (`run --rope`): rotated copies of one rank's q [B, L, H, D] and
// k [B, L, HKV, D] for the ring, and the map of its dq, dk (gradients with respect to the rotated
// q, k) back to gradients with respect to the q, k given. The inputs themselves stay as given.
template <class T>
class ShardRope {
 public:
  ShardRope(double theta, const Shape& s, std::span<const Index> positions, const T* q, const T* k);
  const T* q() const { return q_.data(); }
  const T* k() const { return k_.data(); }
  // in the forward pass this was: q' = R q, k' = R k, so now: dq = R^T dq', dk = R^T dk' (in place)
  void backward(accum_t<T>* dq, accum_t<T>* dk) const;  // gradients in the accumulation type

 private:
  Rope rope_;
  Index B_, H_, HKV_;
  std::vector<T> q_, k_;
};

}  // namespace ringattn::core
