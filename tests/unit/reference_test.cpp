#include "ringattn/core/reference.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace ringattn::core;

namespace {
std::vector<double> randn(std::size_t n, std::mt19937& gen) {
  std::normal_distribution<double> d;
  std::vector<double> x(n);
  for (double& v : x) v = d(gen);
  return x;
}
}  // namespace

// With causal masking position 0 sees only key 0: O_0 = V_0 and LSE_0 = scale q0.k0.
TEST(Reference, FirstCausalRowCopiesItsOwnValue) {
  const Shape s{1, 3, 1, 1, 2};
  const std::vector<double> q = {1, 2, 0, 1, 1, 0}, k = {3, -1, 2, 2, 0, 1}, v = {5, 6, 7, 8, 9, 10};
  const std::vector<double> dout(6, 1.0);
  const DenseResult r = reference_attention(s, Mask::make(3, true, 0, {}), 0.5, q, k, v, dout);
  EXPECT_DOUBLE_EQ(r.o[0], 5);
  EXPECT_DOUBLE_EQ(r.o[1], 6);
  EXPECT_DOUBLE_EQ(r.lse[0], 0.5 * (1 * 3 + 2 * -1));
}

// The reference backward is the gradient of its own loss sum(dout . O): central differences.
TEST(Reference, GradientsMatchFiniteDifferencesOfTheLoss) {
  std::mt19937 gen(3);
  const Shape s{2, 7, 4, 2, 3};
  const Mask mask = Mask::make(s.S, true, 0, {3, 4});
  auto q = randn(s.B * s.S * s.H * s.D, gen), k = randn(s.B * s.S * s.HKV * s.D, gen),
       v = randn(s.B * s.S * s.HKV * s.D, gen), dout = randn(s.B * s.S * s.H * s.D, gen);
  const double scale = 0.7;
  const DenseResult r = reference_attention(s, mask, scale, q, k, v, dout);
  auto loss = [&] { return reference_attention(s, mask, scale, q, k, v, dout, false).loss; };
  const double h = 1e-5;
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
    for (std::size_t n = 0; n < x.size(); n += 5) {
      const double keep = x[n];
      x[n] = keep + h;
      const double up = loss();
      x[n] = keep - h;
      const double down = loss();
      x[n] = keep;
      EXPECT_NEAR(grad[n], (up - down) / (2 * h), 1e-7) << name << "[" << n << "]";
    }
  };
  check(q, r.dq, "dq");
  check(k, r.dk, "dk");
  check(v, r.dv, "dv");
}

TEST(Reference, MaxRelErrorCatchesNanAndMisplacedInfinity) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(max_rel_error({1, 2}, {1, 2}), 0);
  EXPECT_NEAR(max_rel_error({1, 2.5}, {1, 2}), 0.25, 1e-15);
  EXPECT_EQ(max_rel_error({1, std::nan("")}, {1, 2}), inf);
  EXPECT_EQ(max_rel_error({-inf, 2}, {-inf, 2}), 0);
  EXPECT_EQ(max_rel_error({0, 2}, {-inf, 2}), inf);
}
