#pragma once
// Shape letters, defined once for the whole project:
//   B batch, S total positions, H query heads, HKV key/value heads, D head dim,
//   G = H / HKV query heads per kv head, N ranks, L positions on one rank.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ringattn::core {

using Index = std::int64_t;

struct Shape {
  Index B = 1, S = 1, H = 1, HKV = 1, D = 1;
  Index G() const { return H / HKV; }  // the plan (runtime/plan.hpp) checks H % HKV == 0
  std::string str() const;  // "B=1 S=5 H=1 HKV=1 D=2"
};

// Element types of stored tensors: bf16 and f16 are storage only (computed in f32).
enum class DType { f32, f64, bf16, f16 };
inline std::size_t dtype_size(DType t) { return t == DType::f64 ? 8 : t == DType::f32 ? 4 : 2; }
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}
// The DType whose dtype_name is `name`, if any.
inline std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    if (name == dtype_name(t)) return t;
  return std::nullopt;
}
// The type bf16 and f16 runs compute and write their outputs in.
inline DType accum_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

}  // namespace ringattn::core
