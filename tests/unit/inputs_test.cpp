#include "ringattn/core/inputs.hpp"

#include <gtest/gtest.h>

#include <cmath>

using namespace ringattn::core;

// Generating a shard for any layout gives exactly the global tensor's values at its positions.
TEST(Inputs, ShardsOfAnyLayoutAgreeWithTheGlobalTensor) {
  const Index outer = 2, S = 23, inner = 6;
  std::vector<float> global(outer * S * inner);
  const ringattn::core::Run all{0, 0, S};
  generate_positions<float>(5, InputTensor::q, outer, S, inner, {&all, 1}, S, global.data());
  for (const Layout& l : {Layout::contiguous(S, 3), Layout::striped(S, 4), Layout::zigzag(S, 5),
                          Layout::partitioned({0, 23})}) {
    for (int r = 0; r < l.ranks(); ++r) {
      const Index L = l.size(r);
      std::vector<float> shard(outer * L * inner);
      const auto runs = l.runs(r);
      generate_positions<float>(5, InputTensor::q, outer, S, inner, runs, L, shard.data());
      auto pos = l.positions(r);
      for (Index a = 0; a < outer; ++a)
        for (Index i = 0; i < L; ++i)
          for (Index e = 0; e < inner; ++e)
            ASSERT_EQ(shard[(a * L + i) * inner + e], global[(a * S + pos[i]) * inner + e]);
    }
  }
}

TEST(Inputs, ValuesLookStandardNormalAndDependOnSeedAndTensor) {
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = input_value(1, InputTensor::k, i);
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.02);
  EXPECT_NE(input_value(1, InputTensor::k, 3), input_value(2, InputTensor::k, 3));
  EXPECT_NE(input_value(1, InputTensor::k, 3), input_value(1, InputTensor::v, 3));
}
