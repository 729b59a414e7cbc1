#include "ringattn/core/ledger.hpp"
#include "ringattn/core/head_split.hpp"

#include <gtest/gtest.h>

using namespace ringattn::core;

// The worked two-rank, five-position example (D = 2, H = HKV = B = 1, float64): rank 0 sends
// 8 + 8 + 12 elements (224 B) and receives 12 + 12 + 8 (256 B); rank 1 the reverse.
TEST(Ledger, WorkedExampleMatchesTheHandAccounting) {
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

// Member u holds query heads [u Hu, (u+1) Hu) and the kv heads they read, in runs of gcd(Hu, G).
TEST(HeadSplit, MembersHoldTheKvHeadsTheirQueryHeadsRead) {
  const HeadSplit even = split_heads(Shape{1, 8, 8, 4, 2}, 2);  // G = 2, Hu = 4: kv heads 0,1 | 2,3
  EXPECT_EQ(even.HKVu, 2);
  EXPECT_EQ(even.Gu, 2);
  EXPECT_EQ(even.kv_head(1, 0), 2);
  EXPECT_EQ(even.kv_head(1, 1), 3);
  EXPECT_FALSE(even.replicates(Shape{1, 8, 8, 4, 2}));
  const HeadSplit mqa = split_heads(Shape{1, 8, 4, 1, 2}, 4);  // every member reads kv head 0
  EXPECT_EQ(mqa.HKVu, 1);
  EXPECT_EQ(mqa.kv_head(3, 0), 0);
  EXPECT_TRUE(mqa.replicates(Shape{1, 8, 4, 1, 2}));
  // H = 12, HKV = 3 (G = 4), U = 4: Hu = 3 straddles kv heads, so one kv head per query head.
  const HeadSplit odd = split_heads(Shape{1, 8, 12, 3, 2}, 4);
  EXPECT_EQ(odd.Gu, 1);
  EXPECT_EQ(odd.HKVu, 3);
  for (int u = 0; u < 4; ++u)
    for (Index j = 0; j < 3; ++j) EXPECT_EQ(odd.kv_head(u, j), odd.q_head(u, j) / 4);
}

// Ulysses with even shards and HKV % N == 0: each pass receives (N-1)/N B (S/N) (2H + 2HKV) D, plus
// the forward's LSE; what a rank keeps for itself is not counted.
TEST(Ledger, UlyssesAllToAllMatchesTheClosedForm) {
  for (int N : {2, 4, 8}) {
    const Shape s{2, 16 * N, 2 * N, N, 8};
    const Layout l = Layout::contiguous(s.S, N);
    const Index L = s.S / N;
    const Index moved = (N - 1) * s.B * L * (2 * s.H + 2 * s.HKV) * s.D / N, lse = (N - 1) * s.B * L * s.H / N;
    for (int r = 0; r < N; ++r) {
      const Ledger a = expected_a2a_ledger(l, s, N, r, true, 4, 4);
      EXPECT_EQ(a.a2a_fwd_recv_elems, moved + lse);
      EXPECT_EQ(a.a2a_bwd_recv_elems, moved);
      EXPECT_EQ(a.a2a_fwd_send_elems, moved + lse);
      EXPECT_EQ(a.recv_bytes, 4 * (2 * moved + lse));
    }
  }
  // LSE is under 2% of the forward here (H / (2H + 2HKV) / D).
  const Shape s{1, 64, 8, 8, 64};
  const Ledger a = expected_a2a_ledger(Layout::contiguous(64, 4), s, 4, 0, false, 2, 4);
  const double lse = 3.0 / 4 * 16 * 8;
  EXPECT_LT(lse / double(a.a2a_fwd_recv_elems), 0.02);
  EXPECT_EQ(a.a2a_bwd_recv_elems, 0);
}
