// RoPE (rotate-half) on shards with global positions: the formula, its backward, and that a
// shard's rotation depends only on the global positions it holds.
#include "ringattn/core/rope.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <numeric>
#include <random>

#include "ringattn/core/errors.hpp"
#include "ringattn/core/layout.hpp"

using namespace ringattn;
using namespace ringattn::core;

namespace {
std::vector<double> randn(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d;
  std::vector<double> x(n);
  for (double& v : x) v = d(gen);
  return x;
}

std::vector<Index> iota(Index n, Index first = 0) {
  std::vector<Index> p(n);
  std::iota(p.begin(), p.end(), first);
  return p;
}
}  // namespace

// D = 2 has one frequency, THETA^0 = 1: position p rotates (x0, x1) by p radians.
TEST(Rope, TwoDimsRotateByThePositionInRadians) {
  const std::vector<Index> pos = {0, 1, 3};
  const Rope rope(10000.0, 2, pos);
  std::vector<double> x = {1, 0, 1, 0, 0, 2};  // [B=1, L=3, heads=1, D=2]
  rope.forward(1, 1, x.data());
  EXPECT_DOUBLE_EQ(x[0], 1);
  EXPECT_DOUBLE_EQ(x[1], 0);
  EXPECT_DOUBLE_EQ(x[2], std::cos(1.0));
  EXPECT_DOUBLE_EQ(x[3], std::sin(1.0));
  EXPECT_DOUBLE_EQ(x[4], -2 * std::sin(3.0));
  EXPECT_DOUBLE_EQ(x[5], 2 * std::cos(3.0));
}

// Rotate-half pairs element i with i + D/2 and turns the pair like the complex number
// x[i] + i x[i+D/2] times e^(i p THETA^(-2i/D)) (computed here with std::complex, independently).
TEST(Rope, MatchesComplexRotationOfHalfPairs) {
  const Index B = 2, L = 5, heads = 3, D = 8;
  const double theta = 500.0;
  const std::vector<Index> pos = {0, 7, 8, 31, 1000};
  const std::vector<double> x = randn(B * L * heads * D, 1);
  std::vector<double> y = x;
  Rope(theta, D, pos).forward(B, heads, y.data());
  for (Index b = 0; b < B; ++b)
    for (Index l = 0; l < L; ++l)
      for (Index h = 0; h < heads; ++h)
        for (Index i = 0; i < D / 2; ++i) {
          const Index at = ((b * L + l) * heads + h) * D;
          const std::complex<double> z(x[at + i], x[at + i + D / 2]);
          const std::complex<double> w = z * std::polar(1.0, double(pos[l]) / std::pow(theta, 2.0 * i / D));
          EXPECT_NEAR(y[at + i], w.real(), 1e-12);
          EXPECT_NEAR(y[at + i + D / 2], w.imag(), 1e-12);
        }
}

// The backward is the adjoint of the forward: <R x, g> = <x, R^T g> for any x, g.
TEST(Rope, BackwardIsTheAdjointOfForward) {
  const Index B = 2, L = 6, heads = 2, D = 6;
  const Rope rope(10000.0, D, iota(L, 40));
  const std::vector<double> x = randn(B * L * heads * D, 2), g = randn(B * L * heads * D, 3);
  std::vector<double> rx = x, rtg = g;
  rope.forward(B, heads, rx.data());
  rope.backward(B, heads, rtg.data());
  double lhs = 0, rhs = 0;
  for (std::size_t n = 0; n < x.size(); ++n) {
    lhs += rx[n] * g[n];
    rhs += x[n] * rtg[n];
  }
  EXPECT_NEAR(lhs, rhs, 1e-12 * std::abs(lhs) + 1e-12);
  // ... and, the rotation being orthogonal, its inverse.
  rope.backward(B, heads, rx.data());
  for (std::size_t n = 0; n < x.size(); ++n) EXPECT_NEAR(rx[n], x[n], 1e-13);
}

// A zigzag shard rotated with its global positions equals those rows of the whole tensor rotated
// at 0..S-1, bitwise; rotated with its local indices it does not.
TEST(Rope, ShardRotationDependsOnlyOnGlobalPositions) {
  const Index B = 2, S = 23, heads = 2, D = 4;
  const std::vector<double> whole = randn(B * S * heads * D, 4);
  std::vector<double> rotated = whole;
  Rope(10000.0, D, iota(S)).forward(B, heads, rotated.data());
  const Layout layout = Layout::zigzag(S, 3);
  for (int r = 0; r < 3; ++r) {
    const auto pos = layout.positions(r);
    const Index L = layout.size(r);
    std::vector<float> shard(B * L * heads * D), local(B * L * heads * D);
    for (Index b = 0; b < B; ++b)
      for (Index l = 0; l < L; ++l)
        for (Index e = 0; e < heads * D; ++e)
          shard[(b * L + l) * heads * D + e] = static_cast<float>(whole[(b * S + pos[l]) * heads * D + e]);
    local = shard;
    Rope(10000.0, D, pos).forward(B, heads, shard.data());
    Rope(10000.0, D, iota(L)).forward(B, heads, local.data());
    double local_err = 0;
    for (Index b = 0; b < B; ++b)
      for (Index l = 0; l < L; ++l)
        for (Index e = 0; e < heads * D; ++e) {
          const Index at = (b * L + l) * heads * D + e;
          // float shard vs double whole: the rotation is computed in double and rounded once
          EXPECT_NEAR(shard[at], rotated[(b * S + pos[l]) * heads * D + e], 1e-6) << "rank " << r;
          local_err = std::max(local_err, std::abs(local[at] - rotated[(b * S + pos[l]) * heads * D + e]));
        }
    // even rank 0, whose first chunk starts at 0, holds the last chunk too
    EXPECT_GT(local_err, 1e-2) << "local indices of rank " << r << " went unnoticed";
  }
}

// RoPE turns absolute positions into relative ones: q_i . k_j after rotation depends on i - j only.
// (So a shift common to all positions cancels; a per-rank shift, as local indices give, does not.)
TEST(Rope, ScoresDependOnlyOnThePositionDifference) {
  const Index D = 8;
  const std::vector<double> q0 = randn(D, 5), k0 = randn(D, 6);
  auto score = [&](Index pi, Index pj) {
    std::vector<double> q = q0, k = k0;
    Rope(10000.0, D, std::vector<Index>{pi}).forward(1, 1, q.data());
    Rope(10000.0, D, std::vector<Index>{pj}).forward(1, 1, k.data());
    return std::inner_product(q.begin(), q.end(), k.begin(), 0.0);
  };
  EXPECT_NEAR(score(10, 3), score(107, 100), 1e-12);
  EXPECT_GT(std::abs(score(10, 3) - score(10, 5)), 1e-3);
}

TEST(Rope, RejectsOddHeadDimAndBadBase) {
  EXPECT_THROW(validate_rope(10000.0, 7), InputError);
  EXPECT_THROW(validate_rope(0.0, 8), InputError);
  EXPECT_THROW(validate_rope(-5.0, 8), InputError);
  EXPECT_THROW(validate_rope(std::nan(""), 8), InputError);
  EXPECT_THROW(Rope(10000.0, 3, iota(2)), InputError);
  EXPECT_NO_THROW(validate_rope(10000.0, 8));
}

// Attention mode: the ring gets rotated copies, the inputs stay as given, and dq, dk map back
// through the transpose rotation.
TEST(ShardRope, RotatesCopiesAndMapsGradientsBack) {
  const Shape s{2, 5, 4, 2, 6};
  const std::vector<Index> pos = {3, 4, 11, 12, 20};
  const std::vector<double> q = randn(s.B * s.S * s.H * s.D, 9), k = randn(s.B * s.S * s.HKV * s.D, 10);
  const ShardRope<double> sr(1000.0, s, pos, q.data(), k.data());
  std::vector<double> rq = q, rk = k;
  const Rope rope(1000.0, s.D, pos);
  rope.forward(s.B, s.H, rq.data());
  rope.forward(s.B, s.HKV, rk.data());
  for (std::size_t n = 0; n < q.size(); ++n) ASSERT_EQ(sr.q()[n], rq[n]);
  for (std::size_t n = 0; n < k.size(); ++n) ASSERT_EQ(sr.k()[n], rk[n]);
  std::vector<double> dq = rq, dk = rk;  // R^T R x = x
  sr.backward(dq.data(), dk.data());
  for (std::size_t n = 0; n < q.size(); ++n) EXPECT_NEAR(dq[n], q[n], 1e-13);
  for (std::size_t n = 0; n < k.size(); ++n) EXPECT_NEAR(dk[n], k[n], 1e-13);
}
