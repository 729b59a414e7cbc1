#include "ringattn/core/rope.hpp"

#include <fmt/format.h>

#include <cmath>

#include "ringattn/core/errors.hpp"

namespace ringattn::core {

// Preconditions (the plan checks the options before anything is built).
void validate_rope(double theta, Index D) {
  if (!std::isfinite(theta) || theta <= 0)
    throw InputError(fmt::format("Rope: theta {} is not a positive finite base (expected e.g. 10000)", theta));
  if (D % 2 != 0) throw InputError(fmt::format("Rope: head dim D = {} is odd (expected D even)", D));
}

Rope::Rope(double theta, Index D, std::span<const Index> positions)
    : D_(D), L_(static_cast<Index>(positions.size())) {
  validate_rope(theta, D);
  const Index half = D / 2;
  cos_.resize(L_ * half);
  sin_.resize(L_ * half);
  std::vector<double> inv_freq(half);
  for (Index i = 0; i < half; ++i) inv_freq[i] = std::pow(theta, -2.0 * double(i) / double(D));
  for (Index l = 0; l < L_; ++l)
    for (Index i = 0; i < half; ++i) {
      const double angle = double(positions[l]) * inv_freq[i];
      cos_[l * half + i] = std::cos(angle);
      sin_[l * half + i] = std::sin(angle);
    }
}

// B, L, heads, D = shard shape; sign +1 rotates by +angle (forward), -1 by -angle (backward).
template <class T>
void Rope::rotate(Index B, Index heads, T* x, double sign) const {
  const Index half = D_ / 2;
  for (Index b = 0; b < B; ++b)
    for (Index l = 0; l < L_; ++l) {
      const double* c = &cos_[l * half];
      const double* s = &sin_[l * half];
      for (Index h = 0; h < heads; ++h) {
        T* row = x + ((b * L_ + l) * heads + h) * D_;
        for (Index i = 0; i < half; ++i) {
          const double x1 = value_cast<double>(row[i]), x2 = value_cast<double>(row[i + half]), sn = sign * s[i];
          row[i] = value_cast<T>(x1 * c[i] - x2 * sn);
          row[i + half] = value_cast<T>(x2 * c[i] + x1 * sn);
        }
      }
    }
}

template <class T>
void Rope::forward(Index B, Index heads, T* x) const {
  rotate(B, heads, x, 1.0);
}

template <class T>
void Rope::backward(Index B, Index heads, T* dx) const {
  // in the forward pass this was: x' = R(angle) x, so now: dx = R(angle)^T dx' = R(-angle) dx'
  rotate(B, heads, dx, -1.0);
}

template void Rope::forward<float>(Index, Index, float*) const;
template void Rope::forward<double>(Index, Index, double*) const;
template void Rope::backward<float>(Index, Index, float*) const;
template void Rope::backward<double>(Index, Index, double*) const;
template void Rope::forward<bf16>(Index, Index, bf16*) const;
template void Rope::forward<f16>(Index, Index, f16*) const;

template <class T>
ShardRope<T>::ShardRope(double theta, const Shape& s, std::span<const Index> positions, const T* q, const T* k)
    : rope_(theta, s.D, positions), B_(s.B), H_(s.H), HKV_(s.HKV) {
  const Index L = rope_.positions();
  q_.assign(q, q + s.B * L * s.H * s.D);
  k_.assign(k, k + s.B * L * s.HKV * s.D);
  rope_.forward(B_, H_, q_.data());
  rope_.forward(B_, HKV_, k_.data());
}

template <class T>
void ShardRope<T>::backward(accum_t<T>* dq, accum_t<T>* dk) const {
  rope_.backward(B_, H_, dq);
  rope_.backward(B_, HKV_, dk);
}

template class ShardRope<float>;
template class ShardRope<double>;
template class ShardRope<bf16>;
template class ShardRope<f16>;

}  // namespace ringattn::core
