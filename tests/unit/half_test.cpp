// bf16 and f16: widening is exact and narrowing rounds to nearest, ties to even, checked against
// a brute-force search over every finite value of the 16-bit type.
#include "ringattn/core/half.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace ringattn::core {
namespace {

// The value of an f16 bit pattern from its definition: (-1)^s 2^(e-15) (1 + m/1024), subnormals
// 2^-14 (m/1024).
double f16_by_definition(std::uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v;
  if (e == 0) v = std::ldexp(double(m), -24);
  else if (e == 31) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else v = std::ldexp(1.0 + m / 1024.0, e - 15);
  return s ? -v : v;
}

double bf16_by_definition(std::uint16_t h) {
  const int s = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
  double v;
  if (e == 0) v = std::ldexp(double(m), -133);
  else if (e == 255) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else v = std::ldexp(1.0 + m / 128.0, e - 127);
  return s ? -v : v;
}

// The nearest of the non-negative finite values `grid` (increasing; index = bit pattern) to |x|,
// ties to the even pattern; beyond the largest, infinity from halfway to the next power up.
std::uint16_t nearest(const std::vector<double>& grid, double top_half_step, double x) {
  const double a = std::abs(x);
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double largest = grid.back();
  if (a >= largest + top_half_step) return sign | static_cast<std::uint16_t>(grid.size());  // inf follows
  auto it = std::lower_bound(grid.begin(), grid.end(), a);
  if (it == grid.end()) return sign | static_cast<std::uint16_t>(grid.size() - 1);
  const auto hi = static_cast<std::uint16_t>(it - grid.begin());
  if (*it == a || hi == 0) return sign | hi;
  const std::uint16_t lo = hi - 1;
  const double dl = a - grid[lo], dh = grid[hi] - a;
  if (dl < dh) return sign | lo;
  if (dh < dl) return sign | hi;
  return sign | ((lo & 1) ? hi : lo);
}

TEST(Half, F16WidensEveryPatternExactly) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const double want = f16_by_definition(static_cast<std::uint16_t>(h));
    const float got = to_float(f16{static_cast<std::uint16_t>(h)});
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
      EXPECT_TRUE(std::isnan(to_float(to_f16(got)))) << h;
    } else {
      ASSERT_EQ(double(got), want) << "pattern " << h;
      ASSERT_EQ(to_f16(got).bits, h) << "round trip of pattern " << h;
    }
  }
}

TEST(Half, Bf16WidensEveryPatternExactly) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const double want = bf16_by_definition(static_cast<std::uint16_t>(h));
    const float got = to_float(bf16{static_cast<std::uint16_t>(h)});
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
      EXPECT_TRUE(std::isnan(to_float(to_bf16(got)))) << h;
    } else {
      ASSERT_EQ(double(got), want) << "pattern " << h;
      ASSERT_EQ(to_bf16(got).bits, h) << "round trip of pattern " << h;
    }
  }
}

// Random floats over the whole range of each type, the exact midpoints between neighbours and
// their float neighbours, and the overflow edge.
std::vector<float> probes(const std::vector<double>& grid) {
  std::vector<float> out;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> expo(std::log2(grid[1]) - 2, std::log2(grid.back()) + 1.5);
  for (int i = 0; i < 200000; ++i) {
    const float x = static_cast<float>(std::exp2(expo(rng)));
    out.push_back(i % 2 ? x : -x);
  }
  for (std::size_t i = 0; i + 1 < grid.size(); i += 7) {
    const float mid = static_cast<float>((grid[i] + grid[i + 1]) / 2);  // exact in float for both types
    out.push_back(mid);
    out.push_back(std::nextafter(mid, 0.0f));
    out.push_back(std::nextafter(mid, 1e30f));
  }
  out.push_back(0.0f);
  out.push_back(-0.0f);
  out.push_back(std::numeric_limits<float>::max());
  out.push_back(std::numeric_limits<float>::denorm_min());
  return out;
}

TEST(Half, F16RoundsToNearestEven) {
  std::vector<double> grid;
  for (std::uint16_t h = 0; h < 0x7c00; ++h) grid.push_back(f16_by_definition(h));
  const double top_half_step = (65536.0 - 65504.0) / 2;  // halfway from 65504 to 2^16
  for (float x : probes(grid)) ASSERT_EQ(to_f16(x).bits, nearest(grid, top_half_step, x)) << x;
  EXPECT_EQ(to_f16(65519.996f).bits, 0x7bff);
  EXPECT_EQ(to_f16(65520.0f).bits, 0x7c00);
}

TEST(Half, Bf16RoundsToNearestEven) {
  std::vector<double> grid;
  for (std::uint16_t h = 0; h < 0x7f80; ++h) grid.push_back(bf16_by_definition(h));
  const double top_half_step = std::ldexp(1.0, 127 - 8);  // half an ulp of the largest finite bf16
  for (float x : probes(grid)) ASSERT_EQ(to_bf16(x).bits, nearest(grid, top_half_step, x)) << x;
}

TEST(Half, DoublesRoundThroughFloatAsTorchDoes) {
  // 1 + 2^-8 + 2^-30 rounds to float 1 + 2^-8 (a bf16 tie), then to even: 1. Directly it would be
  // above the tie and round up; torch converts double to float first, and so do we.
  const double x = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  EXPECT_EQ(value_cast<bf16>(x).bits, to_bf16(1.0f).bits);
  EXPECT_EQ(value_cast<double>(value_cast<f16>(0.1)), double(to_float(to_f16(0.1f))));
  EXPECT_TRUE(std::isnan(value_cast<float>(value_cast<bf16>(std::nan("")))));
  EXPECT_EQ(value_cast<float>(value_cast<f16>(1e6)), std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace ringattn::core
