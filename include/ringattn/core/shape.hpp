#pragma once
// Shape letters, defined once for the whole project:
//   B batch, S total positions, H query heads, HKV key/value heads, D head dim,
//   G = H / HKV query heads per kv head, N ranks, L positions on one rank.
#include <cstdint>
#include <string>

namespace ringattn::core {

using Index = std::int64_t;

struct Shape {
  Index B = 1, S = 1, H = 1, HKV = 1, D = 1;
  Index G() const { return H / HKV; }
  // Throws InputError naming the offending field.
  void validate() const;
  std::string str() const;  // "B=1 S=5 H=1 HKV=1 D=2"
};

enum class DType { f32, f64 };
inline std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 8; }
inline const char* dtype_name(DType t) { return t == DType::f32 ? "f32" : "f64"; }

}  // namespace ringattn::core
