#pragma once
// The head-major layout the kernels work in, and conversion from the file layout.
//
// File and public layout: q, o, dout, dq are [B, L, H, D]; k, v, dk, dv are
// [B, L, HKV, D]; lse is [B, H, S]. Inside a rank everything is grouped by kv head so that the
// G = H/HKV query heads sharing a kv head are one matrix and a K/V block is contiguous:
//   query-like  [B, HKV, L, G, D]  row r of group (b, g) is local position r / G, head g*G + r % G
//   kv-like     [B, HKV, L, D]
//   row stats   [B, HKV, L, G]     (m, l, lse, delta)
// A K/V block on the wire is [K | V], each kv-like; a gradient return is [dK | dV].
#include <cstring>
#include <vector>

#include "ringattn/core/shape.hpp"

namespace ringattn::core {

struct Packing {
  Index B, HKV, G, L, D;
  Index H() const { return HKV * G; }
  Index q_elems() const { return B * HKV * L * G * D; }
  Index kv_elems() const { return B * HKV * L * D; }
  Index row_elems() const { return B * HKV * L * G; }
  Index q_group(Index b, Index g) const { return (b * HKV + g) * L * G * D; }
  Index kv_group(Index b, Index g) const { return (b * HKV + g) * L * D; }
  Index row_group(Index b, Index g) const { return (b * HKV + g) * L * G; }
};

// [B, L, H, D] -> [B, HKV, L, G, D] (with G = 1, H = HKV this packs k and v).
template <class T>
void pack_heads(const Packing& p, const T* file, T* packed) {
  const Index H = p.H();
  for (Index b = 0; b < p.B; ++b)
    for (Index i = 0; i < p.L; ++i)
      for (Index g = 0; g < p.HKV; ++g)
        std::memcpy(packed + p.q_group(b, g) + i * p.G * p.D, file + ((b * p.L + i) * H + g * p.G) * p.D,
                    sizeof(T) * p.G * p.D);
}

template <class T>
void unpack_heads(const Packing& p, const T* packed, T* file) {
  const Index H = p.H();
  for (Index b = 0; b < p.B; ++b)
    for (Index i = 0; i < p.L; ++i)
      for (Index g = 0; g < p.HKV; ++g)
        std::memcpy(file + ((b * p.L + i) * H + g * p.G) * p.D, packed + p.q_group(b, g) + i * p.G * p.D,
                    sizeof(T) * p.G * p.D);
}

// Row statistics [B, H, L] (file order, as lse) -> [B, HKV, L, G], and back.
template <class T>
void pack_rows(const Packing& p, const T* file, T* packed) {
  for (Index b = 0; b < p.B; ++b)
    for (Index g = 0; g < p.HKV; ++g)
      for (Index i = 0; i < p.L; ++i)
        for (Index t = 0; t < p.G; ++t) packed[p.row_group(b, g) + i * p.G + t] = file[(b * p.H() + g * p.G + t) * p.L + i];
}

template <class T>
void unpack_rows(const Packing& p, const T* packed, T* file) {
  for (Index b = 0; b < p.B; ++b)
    for (Index g = 0; g < p.HKV; ++g)
      for (Index i = 0; i < p.L; ++i)
        for (Index t = 0; t < p.G; ++t) file[(b * p.H() + g * p.G + t) * p.L + i] = packed[p.row_group(b, g) + i * p.G + t];
}

}  // namespace ringattn::core
