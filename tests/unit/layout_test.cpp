#include "ringattn/core/layout.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <string>

#include "ringattn/core/errors.hpp"

using namespace ringattn::core;

namespace {

// Every position has exactly one owner, local indices enumerate each rank's positions in
// increasing global order, and runs cover exactly those positions.
void expect_consistent(const Layout& l) {
  const Index S = l.seq();
  std::vector<int> seen(S, 0);
  Index total = 0;
  for (int r = 0; r < l.ranks(); ++r) {
    auto pos = l.positions(r);
    ASSERT_EQ(static_cast<Index>(pos.size()), l.size(r));
    total += l.size(r);
    for (Index i = 0; i < l.size(r); ++i) {
      ++seen[pos[i]];
      EXPECT_EQ(l.owner(pos[i]), r);
      EXPECT_EQ(l.local_index(pos[i]), i);
      if (i > 0) {
        EXPECT_LT(pos[i - 1], pos[i]);
      }
    }
    Index covered = 0;
    for (const Run& run : l.runs(r)) {
      for (Index k = 0; k < run.length; ++k) EXPECT_EQ(pos[run.local_begin + k], run.global_begin + k);
      covered += run.length;
    }
    EXPECT_EQ(covered, l.size(r));
  }
  EXPECT_EQ(total, S);
  for (Index p = 0; p < S; ++p) EXPECT_EQ(seen[p], 1) << "position " << p;
}

}  // namespace

TEST(Layout, ContiguousBalancedGivesFirstRanksTheRemainder) {
  const Layout l = Layout::contiguous(11, 4);
  EXPECT_EQ(l.sizes(), (std::vector<Index>{3, 3, 3, 2}));
  expect_consistent(l);
  EXPECT_EQ(l.runs(1).size(), 1u);
  EXPECT_EQ(l.runs(1)[0].global_begin, 3);
}

TEST(Layout, ContiguousWithFewerPositionsThanRanksLeavesEmptyShards) {
  const Layout l = Layout::contiguous(3, 5);
  EXPECT_EQ(l.sizes(), (std::vector<Index>{1, 1, 1, 0, 0}));
  expect_consistent(l);
  EXPECT_TRUE(l.runs(4).empty());
}

TEST(Layout, ExplicitPartitionWithZerosRoundTrips) {
  const Layout l = Layout::partitioned({10, 0, 27});
  EXPECT_EQ(l.seq(), 37);
  EXPECT_EQ(l.size(1), 0);
  EXPECT_EQ(l.positions(2)[0], 10);
  expect_consistent(l);
}

TEST(Layout, NegativePartitionIsRejected) {
  EXPECT_THROW(Layout::partitioned({3, -1, 2}), ringattn::InputError);
}

TEST(Layout, StripedDealsPositionsRoundRobin) {
  const Layout l = Layout::striped(10, 4);
  EXPECT_EQ(l.sizes(), (std::vector<Index>{3, 3, 2, 2}));
  EXPECT_EQ(std::vector<Index>(l.positions(1).begin(), l.positions(1).end()), (std::vector<Index>{1, 5, 9}));
  expect_consistent(l);
}

TEST(Layout, ZigzagPairsChunkRWithChunk2NMinus1MinusR) {
  // S = 16, N = 4: chunks of 2; rank 0 owns chunks 0 and 7.
  const Layout l = Layout::zigzag(16, 4);
  EXPECT_EQ(std::vector<Index>(l.positions(0).begin(), l.positions(0).end()), (std::vector<Index>{0, 1, 14, 15}));
  EXPECT_EQ(std::vector<Index>(l.positions(3).begin(), l.positions(3).end()), (std::vector<Index>{6, 7, 8, 9}));
  expect_consistent(l);
}

TEST(Layout, ZigzagHandlesAnySIncludingSBelow2N) {
  for (int N = 1; N <= 6; ++N)
    for (Index S = 1; S <= 30; ++S) {
      SCOPED_TRACE(testing::Message() << "S=" << S << " N=" << N);
      expect_consistent(Layout::zigzag(S, N));
      expect_consistent(Layout::striped(S, N));
      expect_consistent(Layout::contiguous(S, N));
    }
  // S = 5, N = 3: 6 chunks, first 5 of length 1; rank 0 owns chunks 0 and 5 (empty).
  const Layout l = Layout::zigzag(5, 3);
  EXPECT_EQ(l.sizes(), (std::vector<Index>{1, 2, 2}));
}

TEST(Layout, ParseRejectsUnknownNames) {
  EXPECT_EQ(layout_from_name("zigzag"), LayoutKind::zigzag);
  EXPECT_EQ(layout_from_name("diagonal"), std::nullopt);
}

// A Ulysses group owns the union of its members' positions, in increasing order; the ring over the
// groups sees one shard per group.
TEST(Layout, GroupedTakesTheUnionOfConsecutiveRanks) {
  const Layout z = Layout::zigzag(16, 4);  // chunks of 2: rank r owns chunks r and 7-r
  const Layout g = Layout::grouped(z, 2);
  ASSERT_EQ(g.ranks(), 2);
  EXPECT_EQ(g.kind(), LayoutKind::zigzag);
  const std::vector<Index> g0(g.positions(0).begin(), g.positions(0).end());
  const std::vector<Index> g1(g.positions(1).begin(), g.positions(1).end());
  EXPECT_EQ(g0, (std::vector<Index>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(g1, (std::vector<Index>{4, 5, 6, 7, 8, 9, 10, 11}));
  for (Index p = 0; p < 16; ++p) EXPECT_EQ(g.owner(p), z.owner(p) / 2);
  EXPECT_EQ(Layout::grouped(z, 1).sizes(), z.sizes());
  EXPECT_EQ(Layout::grouped(z, 4).sizes(), std::vector<Index>{16});
  EXPECT_THROW(Layout::grouped(z, 3), ringattn::InputError);
}

namespace {
// A layout store like the simulation's: what keep() was given, by key, kept for the life of the
// process (as the simulation's store keeps it: never destroyed, so its tables stay reachable).
std::map<std::string, const void*>& g_kept = *new std::map<std::string, const void*>;
const void* find_kept(const std::string& key) {
  auto it = g_kept.find(key);
  return it == g_kept.end() ? nullptr : it->second;
}
void keep(const std::string& key, const void* tables) { g_kept[key] = tables; }
}  // namespace

TEST(Layout, EqualLayoutsShareTablesThroughTheStoreAndOnlyThey) {
  set_layout_store({find_kept, keep});
  const Layout a = Layout::zigzag(64, 4), b = Layout::zigzag(64, 4);
  EXPECT_EQ(a.positions(1).data(), b.positions(1).data());  // one copy of the tables
  const Layout c = Layout::zigzag(64, 8), d = Layout::striped(64, 4), e = Layout::contiguous(64, 4);
  const Layout f = Layout::partitioned({16, 16, 16, 16}), h = Layout::partitioned({10, 22, 16, 16});
  for (const Layout* o : {&c, &d, &e, &h}) EXPECT_NE(a.positions(0).data(), o->positions(0).data());
  EXPECT_EQ(e.positions(2).data(), f.positions(2).data());  // contiguous(64, 4) is that partition
  const Layout g1 = Layout::grouped(a, 2), g2 = Layout::grouped(b, 2), g4 = Layout::grouped(a, 4);
  EXPECT_EQ(g1.positions(0).data(), g2.positions(0).data());
  EXPECT_NE(g1.positions(0).data(), g4.positions(0).data());
  EXPECT_NE(Layout::grouped(c, 2).positions(0).data(), g1.positions(0).data());
  set_layout_store({});
  const Layout own = Layout::zigzag(64, 4);  // without a store: tables of its own, the same values
  EXPECT_NE(own.positions(1).data(), a.positions(1).data());
  for (const Layout* l : {&a, &c, &d, &e, &h, &g1, &g4, &own}) expect_consistent(*l);
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(std::equal(own.positions(r).begin(), own.positions(r).end(), a.positions(r).begin(),
                           a.positions(r).end()));
}
