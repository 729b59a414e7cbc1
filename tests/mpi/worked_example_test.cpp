// The five experiments on the worked example (five positions, D=2, float64,
// causal, dout = G/5) run through `ringattn lab`'s library call on real ranks. Each test fails
// when the property it names breaks. Most need N=2 (the worked example's two owners, partition {2, 3});
// the empty-rank experiments also run at N=3 with partition {2, 0, 3}.
//
// Tolerance: the worked example's tensors are O(1) and every output is a sum of at most five terms, so
// the ring and the dense reference differ by a few ulps of f64; 1e-14 of max|ref| is ~45 ulps.
// A broken property moves an output by 1e-2 or more (asserted below as > 1e-3).
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/ledger.hpp"
#include "ringattn/runtime/lab.hpp"
#include "mpi_test_util.hpp"

using namespace ringattn;
using namespace ringattn::core;
using runtime::LabEvent;
using runtime::LabEventKind;
using runtime::LabResult;

// Ledgers print as their fields in a failure message.
namespace ringattn::core {
void PrintTo(const Ledger& l, std::ostream* os) { *os << l.str(); }
}  // namespace ringattn::core

namespace {

constexpr double kExact = 1e-14;
constexpr double kBroken = 1e-3;

using test_util::world;

int ranks() { return world().size(); }

LabResult lab(std::vector<Index> partition, bool causal = true, bool skip_empty = false, int drop_grad_step = -1) {
  runtime::LabConfig cfg;
  cfg.partition = std::move(partition);
  cfg.causal = causal;
  cfg.skip_empty = skip_empty;
  cfg.drop_grad_step = drop_grad_step;
  return runtime::run_lab(world(), cfg);
}

struct RelErrors {
  double o, lse, dq, dk, dv;
};

RelErrors errors(const LabResult& r) {
  return {max_rel_error(r.o, r.ref.o), max_rel_error(r.lse, r.ref.lse), max_rel_error(r.dq, r.ref.dq),
          max_rel_error(r.dk, r.ref.dk), max_rel_error(r.dv, r.ref.dv)};
}

void expect_exact(const LabResult& r) {
  const RelErrors e = errors(r);
  EXPECT_LE(e.o, kExact);
  EXPECT_LE(e.lse, kExact);
  EXPECT_LE(e.dq, kExact);
  EXPECT_LE(e.dk, kExact);
  EXPECT_LE(e.dv, kExact);
  EXPECT_TRUE(r.report.check->passed);
}

// Softmax attention of the given query positions over one K/V block alone, with the kernels the
// ring uses (block_forward, then finalize): O [rows, D] and LSE [rows]. The worked example's shape
// is B=H=HKV=1, so the packed layout is the file layout.
struct BlockSoftmax {
  std::vector<double> o, lse;
};

BlockSoftmax block_softmax(const LabResult& r, std::vector<Index> qpos, std::vector<Index> kpos, const Mask& mask) {
  const Index D = r.in.shape.D, Lq = static_cast<Index>(qpos.size()), Lk = static_cast<Index>(kpos.size());
  std::vector<double> q(Lq * D), k(Lk * D), v(Lk * D);
  for (Index i = 0; i < Lq; ++i) std::copy_n(&r.in.q[qpos[i] * D], D, &q[i * D]);
  for (Index j = 0; j < Lk; ++j) {
    std::copy_n(&r.in.k[kpos[j] * D], D, &k[j * D]);
    std::copy_n(&r.in.v[kpos[j] * D], D, &v[j * D]);
  }
  const Packing pq{1, 1, 1, Lq, D}, pk{1, 1, 1, Lk, D};
  BlockSoftmax out{std::vector<double>(Lq * D), std::vector<double>(Lq)};
  std::vector<double> m(Lq), l(Lq);
  const OnlineState<double> st{m.data(), l.data(), out.o.data()};
  init_online_state(pq, st);
  Workspace<double> ws(resolve_tiling({}, D, std::max(Lq, Lk), 1), D);
  block_forward(QueryShard<double>{pq, qpos, q.data()}, KVBlock<double>{pk, kpos, k.data(), v.data()}, mask, r.scale,
                st, ws);
  finalize_forward(pq, st, out.lse.data());
  return out;
}

std::vector<Index> all_positions(const LabResult& r) {
  std::vector<Index> p(r.in.shape.S);
  for (Index i = 0; i < r.in.shape.S; ++i) p[i] = i;
  return p;
}

std::vector<Index> positions(const LabResult& r, int rank) {
  const auto s = r.layout.positions(rank);
  return {s.begin(), s.end()};
}

double max_abs(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (std::size_t n = 0; n < a.size(); ++n) d = std::max(d, std::abs(a[n] - b[n]));
  return d;
}

// The partition with an empty rank at this N (empty when this N has none).
std::vector<Index> partition_with_empty_rank() {
  if (ranks() == 2) return {0, 5};
  if (ranks() == 3) return {2, 0, 3};
  return {};
}

}  // namespace

// The running state the forward records, and the table prints, is the softmax's own in natural
// units whatever base the kernels work in: after each block, m = max_j S_ij and
// l = sum_j e^(S_ij - m) over the keys folded so far, and a/l is the prefix output. By hand from the
// example's fixed tensors, S_ij = q_i . k_j / sqrt(2) (D = 2):
//   q0 after k0 (r0, step 0): q0.k0 = 0.9*0.5 - 0.3*0.1 = 0.42, so m = 0.42/sqrt(2) = 0.296985,
//     l = 1, a/l = v0 = [1, 0].
//   q1 after k0, k1 (r0, step 0): q1.k0 = 0.2*0.5 + 0.8*0.1 = 0.18, q1.k1 = -0.2*0.4 + 0.8*0.7 = 0.48,
//     so m = 0.48/sqrt(2), l = 1 + e^(-0.30/sqrt(2)), a/l = (e^(-0.30/sqrt(2)) v0 + v1) / l.
//   q2 after k2 (r1, step 0): q2.k2 = -0.5*0.3 - 0.4*0.6 = -0.39, so m = -0.39/sqrt(2), l = 1,
//     a/l = v2 = [0.5, -0.5].
//   q2 after k0, k1 too (r1, step 1): q2.k0 = -0.25 + 0.04 = -0.21, q2.k1 = 0.2 + 0.28 = 0.48, so
//     m = 0.48/sqrt(2), l = 1 + e^(-0.69/sqrt(2)) + e^(-0.87/sqrt(2)) (k0, k2 against k1),
//     a/l = (v1 + e^(-0.69/sqrt(2)) v0 + e^(-0.87/sqrt(2)) v2) / l.
// A running max in log2 units would be log2 e times these (0.428459 for q0 after k0).
TEST(WorkedExample, RunningStateIsInTheSoftmaxsNaturalUnits) {
  if (ranks() != 2) GTEST_SKIP() << "the worked example's two owners need N=2";
  const LabResult r = lab({2, 3});
  const Index D = r.in.shape.D;
  ASSERT_EQ(D, 2);
  struct Want {
    int rank, step;
    Index pos;
    double m, l, o0, o1;  // o = a/l
  };
  const double s2 = std::sqrt(2.0), e030 = std::exp(-0.30 / s2), e069 = std::exp(-0.69 / s2),
               e087 = std::exp(-0.87 / s2);
  const double l1 = 1 + e030, l2 = 1 + e069 + e087;
  const Want by_hand[] = {
      {0, 0, 0, 0.42 / s2, 1, 1, 0},
      {0, 0, 1, 0.48 / s2, l1, e030 / l1, 1 / l1},
      {1, 0, 2, -0.39 / s2, 1, 0.5, -0.5},
      {1, 1, 2, 0.48 / s2, l2, (1.0 * e069 + 0.5 * e087) / l2, (1 - 0.5 * e087) / l2},
  };
  EXPECT_NEAR(by_hand[0].m, 0.296985, 5e-7) << "the value the worked example states for q0 after k0";
  for (const Want& w : by_hand) {
    SCOPED_TRACE(testing::Message() << "q" << w.pos << " on r" << w.rank << " after step " << w.step);
    const runtime::LabRow* row = nullptr;
    for (const LabEvent& e : r.events)
      if (e.kind == LabEventKind::forward_block && e.rank == w.rank && e.step == w.step)
        for (const auto& x : e.rows)
          if (x.pos == w.pos) row = &x;
    ASSERT_NE(row, nullptr);
    ASSERT_EQ(row->x.size(), std::size_t(2 + D));
    EXPECT_NEAR(row->x[0], w.m, kExact) << "running max m";
    EXPECT_NEAR(row->x[1], w.l, kExact) << "exp-sum l";
    EXPECT_NEAR(row->x[2] / row->x[1], w.o0, kExact) << "a/l";
    EXPECT_NEAR(row->x[3] / row->x[1], w.o1, kExact) << "a/l";
  }

  // Every forward row, against the softmax over the keys folded so far computed directly.
  int checked = 0;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<Index> folded;
    for (const LabEvent& e : r.events) {
      if (e.kind != LabEventKind::forward_block || e.rank != rank) continue;
      for (Index j : r.layout.positions(e.peer)) folded.push_back(j);
      for (const auto& row : e.rows) {
        SCOPED_TRACE(testing::Message() << "q" << row.pos << " on r" << rank << " after step " << e.step);
        const Index i = row.pos;
        std::vector<Index> keys;
        for (Index j : folded)
          if (r.mask.visible(i, j)) keys.push_back(j);
        ASSERT_FALSE(keys.empty());  // every row sees its own position in its own block, folded first
        std::vector<double> score;
        double m = -INFINITY;
        for (Index j : keys) {
          double dot = 0;
          for (Index d = 0; d < D; ++d) dot += r.in.q[i * D + d] * r.in.k[j * D + d];
          score.push_back(dot * r.scale);
          m = std::max(m, score.back());
        }
        double l = 0;
        std::vector<double> a(D, 0.0);
        for (std::size_t n = 0; n < keys.size(); ++n) {
          const double p = std::exp(score[n] - m);
          l += p;
          for (Index d = 0; d < D; ++d) a[d] += p * r.in.v[keys[n] * D + d];
        }
        EXPECT_NEAR(row.x[0], m, kExact) << "running max m";
        EXPECT_NEAR(row.x[1], l, kExact) << "exp-sum l";
        for (Index d = 0; d < D; ++d) EXPECT_NEAR(row.x[2 + d] / row.x[1], a[d] / l, kExact) << "a/l";
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 2 * 2 + 3 * 2);  // each rank's rows after each of the two steps
}

// Position 2, the first position of rank 1, attends rank 0's keys 0 and 1 across the rank
// boundary: the causal rule compares global positions (2 >= 0, 1), not local indices (position 2
// is local 0 on rank 1). Its output differs from attending its own block alone and from a causal
// rule on local indices, and equals the dense reference.
TEST(WorkedExample, CausalBoundaryPosition2SeesPositions0And1) {
  if (ranks() != 2) GTEST_SKIP() << "the worked example's two owners need N=2";
  const LabResult r = lab({2, 3});
  const Index D = r.in.shape.D;
  expect_exact(r);
  const std::vector<double> o2(&r.o[2 * D], &r.o[3 * D]), ref2(&r.ref.o[2 * D], &r.ref.o[3 * D]);
  EXPECT_LE(max_abs(o2, ref2), kExact);

  // The forward read of rank 0's block on rank 1 folds keys 0 and 1 into row 2's state.
  const LabEvent* own = nullptr;
  const LabEvent* remote = nullptr;
  for (const LabEvent& e : r.events)
    if (e.kind == LabEventKind::forward_block && e.rank == 1) (e.peer == 1 ? own : remote) = &e;
  ASSERT_NE(own, nullptr);
  ASSERT_NE(remote, nullptr);
  ASSERT_EQ(remote->rows.front().pos, 2);
  const std::vector<double>& before = own->rows.front().x;  // m, l, a[D]
  const std::vector<double>& after = remote->rows.front().x;
  EXPECT_GT(after[1], before[1] + kBroken) << "the exp-sum of row 2 grew by keys 0 and 1";
  std::vector<double> prefix(D);
  for (Index d = 0; d < D; ++d) prefix[d] = after[2 + d] / after[1];
  EXPECT_LE(max_abs(prefix, ref2), kExact) << "after keys 0,1 row 2's prefix output is its final output";

  // Its own block alone (key 2 only) is not the answer.
  const BlockSoftmax alone = block_softmax(r, {2}, positions(r, 1), r.mask);
  EXPECT_GT(max_abs(alone.o, ref2), kBroken);
  // Nor is a causal rule on local indices: position 2 is local 0 on rank 1, so such a rule lets
  // it see local key 0 of each block, that is keys 0 and 2.
  const BlockSoftmax local = block_softmax(r, {2}, {0, 2}, Mask::none());
  EXPECT_GT(max_abs(local.o, ref2), kBroken);
}

// A query row with no visible key in a block (rank 0's rows 0, 1 against rank 1's keys 2, 3, 4
// under causal, or any row against an empty rank's block) leaves its running state (m, l, a)
// bit for bit as it was, contributes exactly zero to that block's dK/dV, and nothing anywhere
// becomes NaN.
TEST(WorkedExample, EmptyRowsInABlockLeaveTheStateUntouchedWithoutNaN) {
  std::vector<Index> part = ranks() == 2 ? std::vector<Index>{2, 3} : partition_with_empty_rank();
  if (part.empty()) GTEST_SKIP() << "runs at N=2 and N=3";
  const LabResult r = lab(part);
  expect_exact(r);
  int untouched = 0, zero_contributions = 0;
  for (int rank = 0; rank < ranks(); ++rank) {
    const LabEvent* prev = nullptr;  // this rank's previous forward read
    for (const LabEvent& e : r.events) {
      if (e.rank != rank) continue;
      for (const auto& row : e.rows)
        for (double x : row.x) ASSERT_FALSE(std::isnan(x)) << "event of rank " << rank << " step " << e.step;
      const auto block = r.layout.positions(e.peer);
      if (e.kind == LabEventKind::forward_block) {
        for (std::size_t k = 0; k < e.rows.size() && prev; ++k) {
          bool any = false;
          for (Index j : block) any |= r.mask.visible(e.rows[k].pos, j);
          if (any) continue;
          EXPECT_EQ(e.rows[k].x, prev->rows[k].x) << "row " << e.rows[k].pos << " on block of rank " << e.peer;
          ++untouched;
        }
        prev = &e;
      } else if (e.kind == LabEventKind::replay_block && e.peer != rank) {
        bool seen = false;
        for (Index i : r.layout.positions(rank))
          for (Index j : block) seen |= r.mask.visible(i, j);
        if (seen) continue;
        for (const auto& row : e.rows)
          for (double x : row.x) EXPECT_EQ(x, 0.0);
        ++zero_contributions;
      }
    }
  }
  EXPECT_GT(untouched, 0) << "the experiment must contain an empty row";
  EXPECT_GT(zero_contributions, 0) << "the full protocol replays the causally empty block";
  for (const auto* v : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv})
    for (double x : *v) EXPECT_FALSE(std::isnan(x));
}

// A rank that owns no positions ({0, 5} at N=2, {2, 0, 3} at N=3) still forwards the ring: every
// output is exact, causal or not, with or without the all-zero gradient returns; it holds no
// Q/K/V and no online state, and receives no gradient.
TEST(WorkedExample, EmptyRowsOfARankWithNoPositionsStillGiveExactResults) {
  const std::vector<Index> part = partition_with_empty_rank();
  if (part.empty()) GTEST_SKIP() << "runs at N=2 and N=3";
  for (bool causal : {true, false})
    for (bool skip : {false, true}) {
      SCOPED_TRACE(testing::Message() << "causal " << causal << " skip_empty " << skip);
      const LabResult r = lab(part, causal, skip);
      expect_exact(r);
      for (int q = 0; q < ranks(); ++q) {
        const Ledger& g = r.report.ranks[q].ledger;
        Ledger want = expected_ledger(r.layout, r.in.shape, q, true, r.traffic, r.mask);
        want.ring_bytes(8, 8);  // float64 blocks and gradient returns
        EXPECT_EQ(g, want) << "rank " << q;
        if (part[q] != 0) continue;
        EXPECT_EQ(r.report.ranks[q].positions, 0);
        EXPECT_EQ(g.resident_qkv_elems, 0);
        EXPECT_EQ(g.online_state_elems, 0);
        EXPECT_EQ(g.grad_recv_elems, 0);
      }
    }
}

// Blocks of 2 and 3 positions (and 1 and 4) are exact, and every transfer has the exact size of
// the block it carries: no size message, no padding to the largest block. For the worked example's {2, 3}
// the ledger is the worked example's: rank 0 sends 8 + 8 + 12 elements (224 B) and receives 12 + 12 + 8
// (256 B), rank 1 the reverse; resident Q/K/V 12 and 18, remote block 12 and 8, online state 8, 12.
TEST(WorkedExample, DifferentBlockSizesAreExactAndMovedAtTheirExactSize) {
  if (ranks() != 2) GTEST_SKIP() << "the worked example's two owners need N=2";
  const Index e = 2 * 2;  // K and V of one position: 2 B HKV D with B = HKV = 1, D = 2
  for (const std::vector<Index>& part : {std::vector<Index>{2, 3}, {3, 2}, {1, 4}, {4, 1}}) {
    SCOPED_TRACE(testing::Message() << "partition " << part[0] << "," << part[1]);
    const LabResult r = lab(part);
    expect_exact(r);
    for (int q = 0; q < 2; ++q) {
      const Ledger& g = r.report.ranks[q].ledger;
      const Index mine = e * part[q], other = e * part[1 - q];
      EXPECT_EQ(g.fwd_kv_send_elems, mine);
      EXPECT_EQ(g.fwd_kv_recv_elems, other);
      EXPECT_EQ(g.replay_kv_recv_elems, other);
      EXPECT_EQ(g.remote_block_elems, other);
      EXPECT_EQ(g.grad_send_elems, other);  // a contribution to the other's block has its size
      EXPECT_EQ(g.grad_recv_elems, mine);   // one to our block has ours
    }
    for (const LabEvent& ev : r.events) {
      if (ev.kind == LabEventKind::grad_sent) {
        EXPECT_EQ(ev.elems, e * part[ev.peer]);
      }
      if (ev.kind == LabEventKind::grad_received) {
        EXPECT_EQ(ev.elems, e * part[ev.rank]);
      }
    }
  }
  const LabResult r = lab({2, 3});
  const Ledger& a = r.report.ranks[0].ledger;
  const Ledger& b = r.report.ranks[1].ledger;
  Ledger want_a{8, 12, 8, 12, 12, 8, 12, 12, 8}, want_b{12, 8, 12, 8, 8, 12, 18, 8, 12};
  want_a.ring_bytes(8, 8);  // float64: the example's 224 / 256 bytes
  want_b.ring_bytes(8, 8);
  EXPECT_EQ(a, want_a);
  EXPECT_EQ(b, want_b);
  EXPECT_EQ(a.send_bytes, 224);
  EXPECT_EQ(a.recv_bytes, 256);
  EXPECT_EQ(8 * a.send_elems(), 224);
  EXPECT_EQ(8 * a.recv_elems(), 256);
  EXPECT_EQ(8 * b.send_elems(), 256);
  EXPECT_EQ(8 * b.recv_elems(), 224);
}

// An owner that ignores the gradient contribution returned at step 1 ends with dK and dV far from
// the reference, while O, LSE and dQ (which never travel back) stay exact, and the lab's check
// fails: losing a return cannot go unnoticed.
TEST(WorkedExample, DroppedGradientReturnIsDetected) {
  if (ranks() != 2) GTEST_SKIP() << "the worked example's two owners need N=2";
  const LabResult r = lab({2, 3}, true, false, /*drop_grad_step=*/1);
  const RelErrors e = errors(r);
  EXPECT_LE(e.o, kExact);
  EXPECT_LE(e.lse, kExact);
  EXPECT_LE(e.dq, kExact);
  EXPECT_GT(e.dk, kBroken);
  EXPECT_GT(e.dv, kBroken);
  EXPECT_FALSE(r.report.check->passed);
  int dropped = 0;
  for (const LabEvent& ev : r.events) dropped += ev.dropped;
  EXPECT_EQ(dropped, 2);  // one receipt per owner at step 1
}

// Global normalization: averaging the per-block softmax outputs with equal weights gives both
// blocks the same total weight and misses the reference for every row that sees both blocks;
// weighting each block by its exp mass e^(LSE_b - LSE) recovers the reference, as does the
// ring's online merge.
TEST(WorkedExample, EqualWeightAveragingIsDetectedAsWrong) {
  if (ranks() != 2) GTEST_SKIP() << "the worked example's two owners need N=2";
  const LabResult r = lab({2, 3});
  expect_exact(r);
  const Index S = r.in.shape.S, D = r.in.shape.D;
  const std::vector<Index> rows = all_positions(r);
  const BlockSoftmax b0 = block_softmax(r, rows, positions(r, 0), r.mask);
  const BlockSoftmax b1 = block_softmax(r, rows, positions(r, 1), r.mask);
  std::vector<double> equal(S * D), mass(S * D);
  for (Index i = 0; i < S; ++i) {
    const double l0 = b0.lse[i], l1 = b1.lse[i];  // -inf for a block the row cannot see
    const int seen = std::isfinite(l0) + std::isfinite(l1);
    const double lse = std::max(l0, l1) + std::log(std::exp(l0 - std::max(l0, l1)) + std::exp(l1 - std::max(l0, l1)));
    for (Index d = 0; d < D; ++d) {
      const double o0 = b0.o[i * D + d], o1 = b1.o[i * D + d];  // 0 for an unseen block
      equal[i * D + d] = (o0 + o1) / seen;
      mass[i * D + d] = std::exp(l0 - lse) * o0 + std::exp(l1 - lse) * o1;
    }
  }
  EXPECT_GT(max_rel_error(equal, r.ref.o), kBroken) << "equal weights must be detected as wrong";
  EXPECT_LE(max_rel_error(mass, r.ref.o), kExact) << "exp-mass weights are the right merge";
  EXPECT_LE(max_rel_error(r.o, r.ref.o), kExact) << "the online merge is the right merge";
  // Rows 0 and 1 see only rank 0's block: there the two merges agree.
  for (Index n = 0; n < 2 * D; ++n) EXPECT_NEAR(equal[n], r.ref.o[n], kExact);
}
