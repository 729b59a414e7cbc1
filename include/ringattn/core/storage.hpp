#pragma once
// Storage and accumulation types. The storage type S is how Q, K, V and dO are held and sent
// (K/V blocks travel in it); the accumulation type A = accum_t<S> is what scores, the online
// softmax state, O, LSE and every gradient are computed and summed in: double for double, float
// for float, bf16 and f16.
#include <type_traits>

#include "ringattn/core/half.hpp"
#include "ringattn/core/shape.hpp"

namespace ringattn::core {

template <class S>
struct Accum {
  using type = float;
};
template <>
struct Accum<double> {
  using type = double;
};
template <class S>
using accum_t = typename Accum<S>::type;

template <class S>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<S, double>) return DType::f64;
  else if constexpr (std::is_same_v<S, bf16>) return DType::bf16;
  else if constexpr (std::is_same_v<S, f16>) return DType::f16;
  else return DType::f32;
}

// Calls fn.template operator()<S>() with the storage type of t.
template <class Fn>
decltype(auto) with_storage(DType t, Fn&& fn) {
  switch (t) {
    case DType::f64: return fn.template operator()<double>();
    case DType::bf16: return fn.template operator()<bf16>();
    case DType::f16: return fn.template operator()<f16>();
    case DType::f32: break;
  }
  return fn.template operator()<float>();
}

}  // namespace ringattn::core
