#pragma once
// Storage and accumulation types. The storage type S is how Q, K, V and dO are held and sent
// (K/V blocks travel in it); the accumulation type A = accum_t<S> is what scores, the online
// softmax state, O, LSE and every gradient are computed and summed in.
#include <type_traits>

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
  else return DType::f32;
}

}  // namespace ringattn::core
