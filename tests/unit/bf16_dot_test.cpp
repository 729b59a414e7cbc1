// The vdpbf16ps score products of bf16 operands (src/core/bf16_dot.hpp) against a float64
// reference. Skipped where the CPU, the OS or the build has no AVX512_BF16; on such a machine they
// must run.
#include "core/bf16_dot.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "ringattn/core/half.hpp"

using namespace ringattn::core;
using Index = std::int64_t;

namespace {

#define REQUIRE_BF16DOT()                                                                     \
  if (!bf16dot::available()) GTEST_SKIP() << "no bf16 dot products here (AVX512_BF16 or Arm BF16: CPU, OS or build)"

std::vector<std::uint16_t> random_bf16(Index n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<std::uint16_t> x(n);
  for (auto& b : x) b = to_bf16(nd(rng)).bits;
  return x;
}

double value(std::uint16_t b) { return double(to_float(bf16{b})); }

struct Case {
  Index n, tk, D, i0, k0;  // rows and keys of the product, head dim, row and key offset into the packed operands
};

// Every epilogue on random tiles, with the packing the AMX path uses: alpha times the float64 dot
// product to f32 rounding of the sum (the products are exact); max and store give the same bits,
// the row max is the max of the stored row, and nothing is written past tk or past n.
TEST(Bf16Dot, ScoresMatchFloat64OnRandomBf16Tiles) {
  REQUIRE_BF16DOT();
  std::mt19937 rng(11);
  for (const Case c : {Case{1, 1, 5, 0, 0}, Case{6, 16, 32, 0, 0}, Case{37, 45, 37, 3, 5}, Case{128, 256, 64, 0, 0},
                       Case{33, 17, 128, 16, 31}, Case{7, 100, 80, 1, 2}, Case{50, 64, 1, 0, 0},
                       Case{64, 33, 96, 32, 0}, Case{13, 65, 64, 0, 15}}) {
    SCOPED_TRACE(testing::Message() << "n=" << c.n << " tk=" << c.tk << " D=" << c.D);
    const Index rows = c.i0 + c.n, keys = c.k0 + c.tk, Dp = amx::padded_depth(c.D), ldk = amx::packed_keys(keys);
    const std::vector<std::uint16_t> Q = random_bf16(rows * c.D, rng), K = random_bf16(keys * c.D, rng);
    std::vector<std::uint16_t> A((rows + amx::kTileRows) * Dp, 0xFFFF), B(Dp * ldk, 0xFFFF);
    amx::pack_rows(Q.data(), rows, c.D, A.data());
    amx::pack_pairs(K.data(), keys, c.D, ldk, B.data());
    const float alpha = 0.3f, kSentinel = 12345.f;
    const Index lds = c.tk + 16, out_rows = c.n + 2;  // two rows past n must stay untouched
    std::vector<float> Smax(out_rows * lds, kSentinel), Sstore(out_rows * lds, kSentinel), rmax(c.n + 2, kSentinel);
    const std::uint16_t* a = A.data() + c.i0 * Dp;
    const std::uint16_t* b = B.data() + 2 * c.k0;
    bf16dot::scores(amx::Epilogue::max, a, c.n, b, ldk, c.tk, Dp, Smax.data(), lds, alpha, nullptr, nullptr, rmax.data());
    bf16dot::scores(amx::Epilogue::store, a, c.n, b, ldk, c.tk, Dp, Sstore.data(), lds, alpha, nullptr, nullptr, nullptr);
    std::vector<float> P(out_rows * lds), delta(c.n), G(out_rows * lds, kSentinel);
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    for (auto& p : P) p = ud(rng);
    for (auto& d : delta) d = ud(rng) - 0.5f;
    bf16dot::scores(amx::Epilogue::grad, a, c.n, b, ldk, c.tk, Dp, G.data(), lds, alpha, P.data(), delta.data(), nullptr);
    double worst = 0, worst_grad = 0;
    for (Index i = 0; i < c.n; ++i) {
      float m = -std::numeric_limits<float>::infinity();
      for (Index j = 0; j < c.tk; ++j) {
        double dot = 0, mag = 0;
        for (Index d = 0; d < c.D; ++d) {
          const double p = value(Q[(c.i0 + i) * c.D + d]) * value(K[(c.k0 + j) * c.D + d]);
          dot += p;
          mag += std::abs(p);
        }
        // f32 sum of exact products: |error| <= D eps sum |products| (a loose bound of any order)
        worst = std::max(worst, std::abs(Smax[i * lds + j] - alpha * dot) / (alpha * (mag + 1e-30)));
        ASSERT_EQ(Smax[i * lds + j], Sstore[i * lds + j]) << i << "," << j;
        m = std::max(m, Smax[i * lds + j]);
        const double want_grad = double(alpha) * P[i * lds + j] * (dot - delta[i]);
        worst_grad = std::max(worst_grad, std::abs(G[i * lds + j] - want_grad) / (alpha * (mag + std::abs(delta[i]))));
      }
      EXPECT_EQ(rmax[i], m) << "row " << i;
      for (Index j = c.tk; j < lds; ++j) {
        ASSERT_EQ(Smax[i * lds + j], kSentinel) << "written past tk: " << i << "," << j;
        ASSERT_EQ(G[i * lds + j], kSentinel) << "written past tk: " << i << "," << j;
      }
    }
    for (Index i = c.n; i < out_rows; ++i)
      for (Index j = 0; j < lds; ++j) ASSERT_EQ(Smax[i * lds + j], kSentinel) << "written past n: " << i << "," << j;
    EXPECT_EQ(rmax[c.n], kSentinel) << "row max written past n";
    EXPECT_LE(worst, 2e-6 * std::max<double>(1.0, double(c.D) / 8));
    EXPECT_LE(worst_grad, 4e-6 * std::max<double>(1.0, double(c.D) / 8));
    EXPECT_GT(worst, 0.0) << "an exact match on every score would mean the reference is the code";
  }
}

// O = c O + A B with B as pairs of consecutive rows of X (the layout of the accumulate products:
// rounded P or dS against V, K, dO or Q): the float64 sum to f32 rounding, c null or per row, and
// nothing written past D or past n.
TEST(Bf16Dot, AccumulateMatchesFloat64) {
  REQUIRE_BF16DOT();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  struct Acc {
    Index n, depth, D;
    bool scaled;
  };
  for (const Acc t : {Acc{1, 1, 16, false}, Acc{6, 32, 64, true}, Acc{37, 45, 37, true}, Acc{128, 256, 64, true},
                      Acc{13, 100, 128, false}, Acc{7, 3, 80, true}}) {
    SCOPED_TRACE(testing::Message() << "n=" << t.n << " depth=" << t.depth << " D=" << t.D);
    const Index Kp = amx::padded_depth(t.depth), ldc = (t.D + 15) / 16 * 16 + 16, pairs = Kp / 2;
    const std::vector<std::uint16_t> Araw = random_bf16(t.n * t.depth, rng), X = random_bf16(t.depth * t.D, rng);
    std::vector<std::uint16_t> A(t.n * Kp, 0), B(pairs * 2 * ldc, 0);
    for (Index i = 0; i < t.n; ++i)
      for (Index k = 0; k < t.depth; ++k) A[i * Kp + k] = Araw[i * t.depth + k];
    for (Index kk = 0; kk < pairs; ++kk)
      for (Index d = 0; d < t.D; ++d)
        for (Index u = 0; u < 2; ++u)
          if (2 * kk + u < t.depth) B[kk * 2 * ldc + 2 * d + u] = X[(2 * kk + u) * t.D + d];
    const Index ldo = t.D + 3, rows = t.n + 1;
    const float kSentinel = 12345.f;
    std::vector<float> O(rows * ldo, kSentinel), c(t.n);
    for (Index i = 0; i < t.n; ++i)
      for (Index d = 0; d < t.D; ++d) O[i * ldo + d] = nd(rng);
    for (auto& x : c) x = 0.5f + 0.25f * nd(rng);
    const std::vector<float> O0 = O;
    bf16dot::accumulate(A.data(), t.n, Kp, B.data(), ldc, t.D, O.data(), ldo, t.scaled ? c.data() : nullptr);
    double worst = 0;
    for (Index i = 0; i < t.n; ++i) {
      for (Index d = 0; d < t.D; ++d) {
        double sum = 0, mag = 0;
        for (Index k = 0; k < t.depth; ++k) {
          const double p = value(Araw[i * t.depth + k]) * value(X[k * t.D + d]);
          sum += p;
          mag += std::abs(p);
        }
        const double ci = t.scaled ? c[i] : 1.0;
        const double want = ci * O0[i * ldo + d] + sum;
        worst = std::max(worst, std::abs(O[i * ldo + d] - want) / (mag + std::abs(ci * O0[i * ldo + d]) + 1e-30));
      }
      for (Index d = t.D; d < ldo; ++d) ASSERT_EQ(O[i * ldo + d], kSentinel) << "written past D: " << i << "," << d;
    }
    for (Index d = 0; d < ldo; ++d) ASSERT_EQ(O[t.n * ldo + d], kSentinel) << "written past n";
    EXPECT_LE(worst, 2e-6 * std::max<double>(1.0, double(t.depth) / 8));
    EXPECT_GT(worst, 0.0) << "an exact match everywhere would mean the reference is the code";
  }
}

TEST(Bf16Dot, EnvironmentSwitch) {
  EXPECT_EQ(bf16dot::requested(nullptr), -1);
  EXPECT_EQ(bf16dot::requested(""), -1);
  EXPECT_EQ(bf16dot::requested("1"), 1);
  EXPECT_EQ(bf16dot::requested("0"), 0);
  const bool was = bf16dot::enabled();
  bf16dot::set_enabled(false);
  EXPECT_FALSE(bf16dot::enabled());
  bf16dot::set_enabled(true);
  EXPECT_EQ(bf16dot::enabled(), bf16dot::available());
  bf16dot::set_enabled(was);
  std::printf("bf16 dot products (vdpbf16ps or BFDOT) available: %s\n", bf16dot::available() ? "yes" : "no");
}

}  // namespace
