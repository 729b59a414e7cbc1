#include "ringattn/core/mask.hpp"

#include <gtest/gtest.h>

#include <random>

#include "ringattn/core/errors.hpp"

using namespace ringattn::core;

TEST(Mask, CausalWindowAndDocumentRules) {
  const Mask causal = Mask::make(10, true, 0, {});
  EXPECT_TRUE(causal.visible(2, 0));
  EXPECT_TRUE(causal.visible(2, 2));
  EXPECT_FALSE(causal.visible(2, 3));
  const Mask window = Mask::make(10, false, 3, {});  // i-3 < j <= i, causal by definition
  EXPECT_TRUE(window.causal());
  EXPECT_TRUE(window.visible(5, 3));
  EXPECT_FALSE(window.visible(5, 2));
  EXPECT_FALSE(window.visible(5, 6));
  const Mask docs = Mask::make(10, false, 0, {4, 6});
  EXPECT_TRUE(docs.visible(1, 3));
  EXPECT_FALSE(docs.visible(3, 4));
  EXPECT_TRUE(docs.visible(4, 9));
  const Mask causal_docs = Mask::make(10, true, 0, {4, 6});
  EXPECT_FALSE(causal_docs.visible(4, 9));
}

TEST(Mask, DocLensMustSumToSeq) { EXPECT_THROW(Mask::make(10, false, 0, {4, 5}), ringattn::InputError); }

// The tile classifier may say "partial" when unsure, but "empty" and "full" must be exact.
TEST(Mask, ClassifyNeverClaimsWrongEmptyOrFull) {
  std::mt19937 gen(7);
  const Index S = 40;
  const std::vector<Mask> masks = {Mask::none(), Mask::make(S, true, 0, {}), Mask::make(S, false, 5, {}),
                                   Mask::make(S, false, 0, {7, 13, 20}), Mask::make(S, true, 0, {7, 13, 20}),
                                   Mask::make(S, true, 9, {7, 13, 20})};
  std::uniform_int_distribution<Index> pick(0, S - 1);
  for (const Mask& m : masks) {
    for (int trial = 0; trial < 3000; ++trial) {
      Index q0 = pick(gen), q1 = pick(gen), k0 = pick(gen), k1 = pick(gen);
      if (q0 > q1) std::swap(q0, q1);
      if (k0 > k1) std::swap(k0, k1);
      bool any = false, all = true;
      for (Index i = q0; i <= q1; ++i)
        for (Index j = k0; j <= k1; ++j) {
          any |= m.visible(i, j);
          all &= m.visible(i, j);
        }
      const TileClass c = m.classify(q0, q1, k0, k1);
      if (c == TileClass::empty) {
        EXPECT_FALSE(any) << m.describe();
      }
      if (c == TileClass::full) {
        EXPECT_TRUE(all) << m.describe();
      }
      // For contiguous ranges the causal rule is decided exactly.
      if (!m.has_docs() && m.window() == 0 && m.causal()) {
        EXPECT_EQ(c == TileClass::empty, !any);
        EXPECT_EQ(c == TileClass::full, all);
      }
    }
  }
}
