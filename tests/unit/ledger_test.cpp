#include "ringattn/core/ledger.hpp"

#include <gtest/gtest.h>

using namespace ringattn::core;

// Seed 000's two-rank, five-position example (D = 2, H = HKV = B = 1, float64): rank 0 sends
// 8 + 8 + 12 elements (224 B) and receives 12 + 12 + 8 (256 B); rank 1 the reverse.
TEST(Ledger, SeedExampleMatchesThePublishedAccounting) {
  const Layout l = Layout::partitioned({2, 3});
  const Shape s{1, 5, 1, 1, 2};
  const Ledger r0 = expected_ledger(l, s, 0, true), r1 = expected_ledger(l, s, 1, true);
  EXPECT_EQ(r0.fwd_kv_send_elems, 8);
  EXPECT_EQ(r0.replay_kv_send_elems, 8);
  EXPECT_EQ(r0.grad_send_elems, 12);
  EXPECT_EQ(r0.send_elems() * 8, 224);
  EXPECT_EQ(r0.fwd_kv_recv_elems, 12);
  EXPECT_EQ(r0.replay_kv_recv_elems, 12);
  EXPECT_EQ(r0.grad_recv_elems, 8);
  EXPECT_EQ(r0.recv_elems() * 8, 256);
  EXPECT_EQ(r1.send_elems() * 8, 256);
  EXPECT_EQ(r1.recv_elems() * 8, 224);
  EXPECT_EQ(r0.resident_qkv_elems, 12);
  EXPECT_EQ(r1.resident_qkv_elems, 18);
  EXPECT_EQ(r0.remote_block_elems, 12);
  EXPECT_EQ(r1.remote_block_elems, 8);
  EXPECT_EQ(r0.online_state_elems, 8);
  EXPECT_EQ(r1.online_state_elems, 12);
}

// Every element sent is received by someone: totals balance for any layout and N.
TEST(Ledger, SendsAndReceivesBalanceOverTheRing) {
  const Shape s{2, 37, 4, 2, 16};
  for (const Layout& l : {Layout::partitioned({10, 0, 27}), Layout::contiguous(37, 5), Layout::striped(37, 4),
                          Layout::zigzag(37, 3), Layout::contiguous(37, 1)}) {
    Index fs = 0, fr = 0, gs = 0, gr = 0;
    for (int r = 0; r < l.ranks(); ++r) {
      const Ledger x = expected_ledger(l, s, r, true);
      fs += x.fwd_kv_send_elems;
      fr += x.fwd_kv_recv_elems;
      gs += x.grad_send_elems;
      gr += x.grad_recv_elems;
      EXPECT_EQ(x.replay_kv_send_elems, x.fwd_kv_send_elems);
    }
    EXPECT_EQ(fs, fr);
    EXPECT_EQ(gs, gr);
    // each block visits the N-1 other ranks once
    EXPECT_EQ(fr, 2 * s.B * s.HKV * s.D * s.S * (l.ranks() - 1));
  }
}

TEST(Ledger, ForwardOnlyMovesNoGradients) {
  const Ledger x = expected_ledger(Layout::contiguous(9, 3), Shape{1, 9, 2, 2, 4}, 1, false);
  EXPECT_EQ(x.replay_kv_send_elems + x.replay_kv_recv_elems + x.grad_send_elems + x.grad_recv_elems, 0);
  EXPECT_GT(x.fwd_kv_send_elems, 0);
}
