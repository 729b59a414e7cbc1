// The dense layer reference: its backward is the gradient of its own loss sum(dY . Y), checked
// by central differences on every input, with RoPE, GQA, B > 1 and a causal document mask.
#include "ringattn/core/layer_reference.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ringattn/core/errors.hpp"

using namespace ringattn::core;

namespace {
std::vector<double> randn(std::size_t n, std::mt19937& gen, double scale = 1.0) {
  std::normal_distribution<double> d;
  std::vector<double> x(n);
  for (double& v : x) v = scale * d(gen);
  return x;
}

// Central differences of loss() over every element of x against the analytic gradient.
template <class Loss>
double max_fd_error(std::vector<double>& x, const std::vector<double>& grad, Loss&& loss) {
  const double h = 1e-5;
  double err = 0, scale = 0;
  for (std::size_t n = 0; n < x.size(); ++n) {
    const double keep = x[n];
    x[n] = keep + h;
    const double up = loss();
    x[n] = keep - h;
    const double down = loss();
    x[n] = keep;
    err = std::max(err, std::abs((up - down) / (2 * h) - grad[n]));
    scale = std::max(scale, std::abs(grad[n]));
  }
  return err / scale;
}
}  // namespace

TEST(LayerReference, GradientsMatchFiniteDifferencesOfTheLoss) {
  std::mt19937 gen(7);
  const Shape s{2, 6, 4, 2, 4};
  const Index M = 5, HD = s.H * s.D, KD = s.HKV * s.D;
  const Mask mask = Mask::make(s.S, true, 0, {2, 4});
  LayerTensors in{randn(s.B * s.S * M, gen), randn(M * HD, gen, 0.5), randn(M * KD, gen, 0.5),
                  randn(M * KD, gen, 0.5),   randn(HD * M, gen, 0.5), randn(s.B * s.S * M, gen)};
  const double scale = 0.5;
  const LayerResult r = reference_layer(s, M, mask, scale, 100.0, in);
  auto loss = [&] { return reference_layer(s, M, mask, scale, 100.0, in, false).loss; };
  EXPECT_LT(max_fd_error(in.x, r.dx, loss), 1e-7);
  EXPECT_LT(max_fd_error(in.wq, r.dwq, loss), 1e-7);
  EXPECT_LT(max_fd_error(in.wk, r.dwk, loss), 1e-7);
  EXPECT_LT(max_fd_error(in.wv, r.dwv, loss), 1e-7);
  EXPECT_LT(max_fd_error(in.wo, r.dwo, loss), 1e-7);
}

// `run --rope` without --layer: dq and dk are gradients with respect to q and k before rotation.
TEST(LayerReference, AttentionWithRopeGradientsAreForUnrotatedInputs) {
  std::mt19937 gen(8);
  const Shape s{1, 7, 2, 1, 6};
  const Mask mask = Mask::make(s.S, false, 0, {});
  auto q = randn(s.B * s.S * s.H * s.D, gen), k = randn(s.B * s.S * s.HKV * s.D, gen),
       v = randn(s.B * s.S * s.HKV * s.D, gen), dout = randn(s.B * s.S * s.H * s.D, gen);
  const DenseResult r = reference_attention_rope(s, mask, 0.4, 10.0, q, k, v, dout);
  auto loss = [&] { return reference_attention_rope(s, mask, 0.4, 10.0, q, k, v, dout, false).loss; };
  EXPECT_LT(max_fd_error(q, r.dq, loss), 1e-7);
  EXPECT_LT(max_fd_error(k, r.dk, loss), 1e-7);
  EXPECT_LT(max_fd_error(v, r.dv, loss), 1e-7);
  // RoPE changes the result (positions matter), so the test above is not vacuous.
  const DenseResult plain = reference_attention(s, mask, 0.4, q, k, v, dout);
  double diff = 0;
  for (std::size_t n = 0; n < plain.o.size(); ++n) diff = std::max(diff, std::abs(plain.o[n] - r.o[n]));
  EXPECT_GT(diff, 1e-3);
}

TEST(LayerReference, WrongTensorSizeIsAnInputError) {
  const Shape s{1, 2, 1, 1, 2};
  LayerTensors in{std::vector<double>(2 * 3), std::vector<double>(3 * 2), std::vector<double>(3 * 2),
                  std::vector<double>(3 * 2), std::vector<double>(2 * 3), std::vector<double>(5)};
  EXPECT_THROW(reference_layer(s, 3, Mask::none(), 1.0, std::nullopt, in), ringattn::InputError);
}
