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

// Both references are the gradient of their loss, checked above for the GEMM one; here the
// GEMM form is held to the plain loops on every mask, GQA, B > 1, S = 0, and
// S above the GEMM form's 256-row blocks.
TEST(Reference, GemmFormMatchesTheLoops) {
  std::mt19937 gen(5);
  struct Case {
    Shape s;
    bool causal;
    Index window;
    std::vector<Index> docs;
  };
  const std::vector<Case> cases = {
      {Shape{1, 9, 2, 2, 4}, false, 0, {}},          {Shape{2, 11, 4, 2, 3}, true, 0, {}},
      {Shape{1, 13, 3, 1, 5}, true, 4, {}},           {Shape{1, 12, 2, 1, 4}, false, 0, {5, 0, 7}},
      {Shape{2, 10, 2, 2, 2}, true, 0, {3, 3, 4}},    {Shape{1, 300, 2, 1, 8}, true, 0, {}},
      {Shape{1, 261, 4, 2, 4}, true, 40, {100, 161}}, {Shape{1, 0, 2, 1, 4}, true, 0, {}}};
  for (const Case& c : cases) {
    const Shape& s = c.s;
    const Mask mask = Mask::make(s.S, c.causal, c.window, c.docs);
    auto q = randn(s.B * s.S * s.H * s.D, gen), k = randn(s.B * s.S * s.HKV * s.D, gen),
         v = randn(s.B * s.S * s.HKV * s.D, gen), dout = randn(s.B * s.S * s.H * s.D, gen);
    const DenseResult a = reference_attention(s, mask, 0.6, q, k, v, dout);
    const DenseResult b = reference_attention_loops(s, mask, 0.6, q, k, v, dout);
    SCOPED_TRACE(s.str() + " " + mask.describe());
    EXPECT_LE(max_rel_error(a.o, b.o), 1e-13);
    EXPECT_LE(max_rel_error(a.lse, b.lse), 1e-13);
    EXPECT_LE(max_rel_error(a.dq, b.dq), 1e-13);
    EXPECT_LE(max_rel_error(a.dk, b.dk), 1e-13);
    EXPECT_LE(max_rel_error(a.dv, b.dv), 1e-13);
    EXPECT_NEAR(a.loss, b.loss, 1e-12 * std::max(1.0, std::abs(b.loss)));
  }
}

TEST(Reference, MaxRelErrorCatchesNanAndMisplacedInfinity) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(max_rel_error({1, 2}, {1, 2}), 0);
  EXPECT_NEAR(max_rel_error({1, 2.5}, {1, 2}), 0.25, 1e-15);
  EXPECT_EQ(max_rel_error({1, std::nan("")}, {1, 2}), inf);
  EXPECT_EQ(max_rel_error({-inf, 2}, {-inf, 2}), 0);
  EXPECT_EQ(max_rel_error({0, 2}, {-inf, 2}), inf);
}

// Where the reference vanishes (a gradient that cancels), the error is measured against the
// output's natural magnitude instead: rounding noise on an exact zero is not a failure.
TEST(MaxRelError, FloorReplacesAVanishingReference) {
  const std::vector<double> ref = {0.0, 1e-17, -2e-18}, got = {1e-9, -1e-9, 0.0};
  EXPECT_GT(max_rel_error(got, ref), 1e7);            // relative to max |ref| = 1e-17: absurd
  EXPECT_NEAR(max_rel_error(got, ref, 10.0), 1e-10, 1e-16);  // relative to the floor
  const std::vector<double> big = {5.0, -20.0}, near = {5.0, -19.0};
  EXPECT_DOUBLE_EQ(max_rel_error(near, big, 10.0), 1.0 / 20.0);  // a larger max |ref| wins
}
