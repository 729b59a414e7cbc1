#pragma once
// The two 16-bit storage types, bf16 and f16, and the one conversion every path uses.
//
// Both are bit containers: arithmetic happens in float after widening (exact for both). Narrowing
// rounds to nearest, ties to even, as torch's `.to()` does; a double is first rounded to float,
// as torch does (so double -> bf16 may round twice, exactly like torch). NaN stays NaN (quiet),
// values beyond the largest finite become infinities.
#include <bit>
#include <cstdint>
#include <type_traits>

namespace ringattn::core {

struct bf16 {
  std::uint16_t bits = 0;
  friend bool operator==(bf16, bf16) = default;
};
struct f16 {
  std::uint16_t bits = 0;
  friend bool operator==(f16, f16) = default;
};

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

inline float to_float(bf16 x) { return std::bit_cast<float>(std::uint32_t{x.bits} << 16); }

inline float to_float(f16 x) {
  const std::uint32_t h = x.bits, sign = (h & 0x8000u) << 16, em = h & 0x7fffu;
  // Exponent and mantissa moved to float's positions and rebiased by 2^(127-15) with one exact
  // multiply: that also normalises subnormals. Infinities and NaN keep an all-ones exponent.
  std::uint32_t u = std::bit_cast<std::uint32_t>(std::bit_cast<float>(em << 13) * 0x1p112f);
  if (em >= 0x7c00u) u = 0x7f800000u | ((em & 0x3ffu) << 13);
  return std::bit_cast<float>(u | sign);
}

inline bf16 to_bf16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);  // to nearest, ties to even; may carry to inf
  return bf16{static_cast<std::uint16_t>(rounded >> 16)};
}

inline f16 to_f16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  std::uint32_t h;
  if (u > 0x7f800000u) {
    h = 0x7e00u;  // NaN
  } else if (u >= 0x477ff000u) {
    h = 0x7c00u;  // from halfway above 65504 on: infinity
  } else if (u < 0x38800000u) {
    // Below the smallest normal (2^-14): adding 0.5 puts the value's bits where f16's subnormal
    // mantissa (units of 2^-24) sits in 0.5's mantissa, and the FPU rounds to nearest even.
    h = std::bit_cast<std::uint32_t>(std::bit_cast<float>(u) + 0.5f) - 0x3f000000u;
  } else {
    const std::uint32_t odd = (u >> 13) & 1u;
    u += (std::uint32_t(15 - 127) << 23) + 0xfffu + odd;  // rebias, round to nearest even
    h = u >> 13;
  }
  return f16{static_cast<std::uint16_t>(h | sign)};
}

// Any storage or accumulation type to any other: widening is exact; narrowing to a 16-bit type
// goes through float and rounds to nearest even.
template <class To, class From>
inline To value_cast(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (is_half_v<From>) {
    return value_cast<To>(to_float(x));
  } else if constexpr (std::is_same_v<To, bf16>) {
    return to_bf16(static_cast<float>(x));
  } else if constexpr (std::is_same_v<To, f16>) {
    return to_f16(static_cast<float>(x));
  } else {
    return static_cast<To>(x);
  }
}

}  // namespace ringattn::core
