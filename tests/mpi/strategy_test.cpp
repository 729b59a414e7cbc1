// The head-parallel strategies (ulysses, usp) and the all-gather strategy over real MPI ranks against the dense float64
// reference: every rank builds the whole input from a fixed seed and checks its own slice; every
// rank's ledger is asserted against the closed forms (the ring between the groups and the
// all-to-alls inside them); repeated runs agree bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/head_split.hpp"
#include "ringattn/core/inputs.hpp"
#include "ringattn/core/reference.hpp"
#include "ringattn/runtime/strategy.hpp"
#include "mpi_test_util.hpp"

using namespace ringattn;
using namespace ringattn::core;

namespace {

using runtime::StrategyKind;
using test_util::Errors;
using test_util::Problem;
using test_util::world;
constexpr std::uint64_t kSeed = 23;

struct Case {
  std::string name;
  Shape s;
  LayoutKind kind = LayoutKind::contiguous;
  bool causal = false;
  Index window = 0;
  std::vector<Index> docs;
  std::vector<Index> partition;
  Case(std::string n, Shape sh, LayoutKind k = LayoutKind::contiguous, bool c = false, Index w = 0,
       std::vector<Index> d = {}, std::vector<Index> p = {})
      : name(std::move(n)), s(sh), kind(k), causal(c), window(w), docs(std::move(d)), partition(std::move(p)) {}
};

template <class T>
struct Run {
  Errors err;
  std::vector<core::accum_t<T>> out;  // o, lse, dq, dk, dv of this rank, concatenated
  Ledger ledger;
};

// What rank r's ledger must be: the ring over the groups (its closed form on the grouped layout,
// the member's head slice) plus the all-to-alls' closed form.
Ledger expected(const Layout& layout, const Shape& s, int U, int r, const Mask& mask, Index es, Index ea) {
  if (U == 1) {
    Ledger l = expected_ledger(layout, s, r, true, Traffic::aware, mask);
    l.ring_bytes(es, ea);
    return l;
  }
  const Layout groups = Layout::grouped(layout, U);
  const Shape local = split_heads(s, U).local(s);
  Ledger l = expected_ledger(groups, local, r / U, true, Traffic::aware, mask);
  l.ring_bytes(es, ea);
  const Ledger a = expected_a2a_ledger(layout, s, U, r, true, es, ea);
  l.a2a_fwd_send_elems = a.a2a_fwd_send_elems;
  l.a2a_fwd_recv_elems = a.a2a_fwd_recv_elems;
  l.a2a_bwd_send_elems = a.a2a_bwd_send_elems;
  l.a2a_bwd_recv_elems = a.a2a_bwd_recv_elems;
  l.send_bytes += a.send_bytes;
  l.recv_bytes += a.recv_bytes;
  return l;
}

// What rank r gathers of owner q's positions, counted pair by pair: the smallest range of q's
// local indices holding every key some query of r sees ([0, 0) when none).
std::pair<Index, Index> needed(const Layout& layout, const Mask& mask, int r, int q) {
  const auto qp = layout.positions(r), kp = layout.positions(q);
  Index lo = Index(kp.size()), hi = 0;
  for (Index j = 0; j < Index(kp.size()); ++j)
    for (Index i : qp)
      if (mask.visible(i, kp[j])) {
        lo = std::min(lo, j), hi = std::max(hi, j + 1);
        break;
      }
  return hi > lo ? std::pair{lo, hi} : std::pair{Index(0), Index(0)};
}

// The all-gather strategy's ledger, per pass, from the positions each rank gathers: with a window
// or documents that leave some rank short of some block, rank r receives e |need(r, q)| of each
// other rank q (e = 2 B HKV D) and sends e |need(q, r)|; otherwise every rank receives every other
// rank's K/V, e (S - L_r), whatever the group size. The reduce-scatter returns what was gathered:
// it sends the received elements back (in the accumulation type) and receives what it sent.
Ledger expected_allgather(const Layout& layout, const Mask& mask, const Shape& s, int r, int G, Index es,
                          Index ea) {
  const int N = layout.ranks();
  const Index L = layout.size(r), e = 2 * s.B * s.HKV * s.D;
  bool sliced = false;
  if (mask.window() > 0 || mask.has_docs())
    for (int a = 0; a < N; ++a)
      for (int q = 0; q < N; ++q) {
        const auto [lo, hi] = needed(layout, mask, a, q);
        sliced = sliced || hi - lo < layout.size(q);
      }
  Index recv = 0, sent = 0;  // positions, over the other ranks
  for (int q = 0; q < N; ++q) {
    if (q == r) continue;
    const auto [rlo, rhi] = sliced ? needed(layout, mask, r, q) : std::pair{Index(0), layout.size(q)};
    const auto [slo, shi] = sliced ? needed(layout, mask, q, r) : std::pair{Index(0), L};
    recv += rhi - rlo;
    sent += shi - slo;
  }
  Ledger l;
  l.resident_qkv_elems = s.B * L * (s.H + 2 * s.HKV) * s.D;
  l.online_state_elems = L * s.B * s.H * (s.D + 2);
  l.remote_block_elems = 2 * s.B * G * s.D * recv;
  l.ag_fwd_recv_elems = l.ag_bwd_recv_elems = e * recv;
  l.rs_bwd_send_elems = e * recv;
  l.rs_bwd_recv_elems = e * sent;
  l.send_bytes = 2 * e * sent * es + e * recv * ea;
  l.recv_bytes = 2 * e * recv * es + e * sent * ea;
  return l;
}

template <class T>
Run<T> run(const Case& c, StrategyKind kind, int U, int G = 1) {
  using A = core::accum_t<T>;
  const comm::Comm& comm = world();
  const int r = comm.rank();
  const Shape& s = c.s;
  const Problem<T> pb(kSeed, s, c.kind, c.partition, c.causal, c.window, c.docs);
  runtime::StrategySetup setup = pb.setup(Tiling{16, 32});
  setup.kind = kind;
  setup.ulysses_degree = runtime::ulysses_degree(kind, U, comm.size());
  setup.kv_head_group = G;
  auto strategy = runtime::make_strategy<T>(comm, setup);
  strategy->load(pb.lq.data(), pb.lk.data(), pb.lv.data());
  strategy->load_dout(pb.ld.data());
  strategy->forward();
  strategy->backward();
  const Index L = pb.local_size();
  EXPECT_EQ(strategy->local_size(), L);
  std::vector<A> o(s.B * L * pb.qi), lse(s.B * s.H * L), dq(s.B * L * pb.qi), dk(s.B * L * pb.ki),
      dv(s.B * L * pb.ki);
  strategy->outputs(o.data(), lse.data(), dq.data(), dk.data(), dv.data());
  Run<T> out;
  out.err = pb.errors(o, lse, dq, dk, dv);
  for (const auto* t : {&o, &lse, &dq, &dk, &dv}) out.out.insert(out.out.end(), t->begin(), t->end());
  out.ledger = strategy->ledger();
  const int Ueff = runtime::ulysses_degree(kind, U, comm.size());
  const Ledger want = kind == StrategyKind::allgather
                          ? expected_allgather(pb.layout, pb.mask, s, r, G, Index(sizeof(T)), Index(sizeof(A)))
                          : expected(pb.layout, s, Ueff, r, pb.mask, Index(sizeof(T)), Index(sizeof(A)));
  EXPECT_EQ(out.ledger, want) << "rank " << r << "\n counted:  " << out.ledger.str() << "\n expected: " << want.str();
  return out;
}

// Cases whose H suits every U dividing N up to 16 is impossible with tiny shapes; each case names
// its heads, and strategies the rules forbid for it are skipped (the CLI tests cover the errors).
std::vector<Case> cases() {
  const int N = world().size();
  std::vector<Index> part(N, 0);  // uneven, with empty shards: everything on ranks 0 and N-1
  part[0] = 5;
  part[N - 1] += 6;
  return {
      {"noncausal_mha", Shape{1, 3 * N + 1, N, N, 8}},
      {"causal_zigzag_gqa", Shape{2, 2 * N + 3, 2 * N, N / 2 > 0 ? N / 2 : 1, 4}, LayoutKind::zigzag, true},
      {"causal_striped_mqa", Shape{1, 2 * N - 1, N, 1, 4}, LayoutKind::striped, true},  // kv heads replicated
      {"window_contiguous", Shape{1, 3 * N, 2 * N, 2, 4}, LayoutKind::contiguous, true, 3},
      {"documents_striped", Shape{1, 2 * N + 2, N, N, 4}, LayoutKind::striped, true, 0, {N, 0, 2, N}},
      {"window_documents_zigzag", Shape{1, 4 * N + 1, 2, 2, 4}, LayoutKind::zigzag, true, 3, {N + 1, 0, 3 * N}},
      {"documents_noncausal_contiguous", Shape{1, 3 * N + 2, 2, 1, 4}, LayoutKind::contiguous, false, 0,
       {2, N, 2 * N}},
      {"seq_below_ranks", Shape{1, N / 2 + 1, N, 1, 4}, LayoutKind::contiguous, true},
      {"partition_empty_shards", Shape{1, 11, N, N, 4}, LayoutKind::contiguous, true, 0, {}, part},
      {"window_partition_empty_shards", Shape{1, 11, N, N, 4}, LayoutKind::contiguous, true, 4, {}, part},
  };
}

std::vector<int> degrees() {  // every usp U dividing N (U = 1 is the ring, U = N ulysses)
  std::vector<int> u;
  for (int U = 1; U <= world().size(); ++U)
    if (world().size() % U == 0) u.push_back(U);
  return u;
}

template <class T>
void expect_all_within(double tol) {
  const int N = world().size();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    {
      SCOPED_TRACE("ring");
      EXPECT_LE(run<T>(c, StrategyKind::ring, 0).err.max(), tol);
    }
    {
      SCOPED_TRACE("ulysses");
      if (c.s.H % N == 0) {
        EXPECT_LE(run<T>(c, StrategyKind::ulysses, 0).err.max(), tol);
      }
    }
    for (int U : degrees()) {
      if (c.s.H % U != 0) continue;
      SCOPED_TRACE("usp U=" + std::to_string(U));
      EXPECT_LE(run<T>(c, StrategyKind::usp, U).err.max(), tol);
    }
    for (Index G : {Index(1), c.s.HKV}) {  // one KV head at a time, and all at once
      SCOPED_TRACE("allgather G=" + std::to_string(G));
      EXPECT_LE(run<T>(c, StrategyKind::allgather, 0, int(G)).err.max(), tol);
    }
  }
}

}  // namespace

// f64: the strategies reorder sums but nothing else (the ring too, for N = 8 and 16).
TEST(HeadParallel, EveryDegreeMatchesDenseReferenceFloat64) { expect_all_within<double>(1e-12); }

// f32: accumulation in float; 2e-5 of max|ref| as for the ring.
TEST(HeadParallel, EveryDegreeMatchesDenseReferenceFloat32) { expect_all_within<float>(2e-5); }

// usp with U = 4 on the ranks given (N = 16 in ctest): four groups of four, each ring of four.
TEST(HeadParallel, UspFourByFourMatchesDenseReference) {
  const int N = world().size();
  if (N % 4 != 0) GTEST_SKIP() << "needs N divisible by 4";
  const Case c{"usp4", Shape{1, 2 * N + 5, 8, 2, 4}, LayoutKind::zigzag, true};
  EXPECT_LE(run<double>(c, StrategyKind::usp, 4).err.max(), 1e-12);
}

// Even shards and HKV % N == 0: each rank receives (N-1)/N B (S/N) (2H + 2HKV) D elements per
// pass, plus the forward's LSE (N-1)/N B (S/N) H.
TEST(HeadParallel, UlyssesReceivesTheClosedForm) {
  const Index N = world().size();
  const Shape s{2, 3 * N, 2 * N, N, 4};
  const Case c{"even", s};
  const Ledger l = run<double>(c, StrategyKind::ulysses, 0).ledger;
  const Index moved = (N - 1) * s.B * (s.S / N) * (2 * s.H + 2 * s.HKV) * s.D / N;
  const Index lse = (N - 1) * s.B * (s.S / N) * s.H / N;
  EXPECT_EQ(l.a2a_fwd_recv_elems, moved + lse);
  EXPECT_EQ(l.a2a_bwd_recv_elems, moved);
  EXPECT_EQ(l.a2a_fwd_send_elems, moved + lse);
  EXPECT_EQ(l.a2a_bwd_send_elems, moved);
  EXPECT_EQ(l.fwd_kv_recv_elems + l.replay_kv_recv_elems + l.grad_recv_elems, 0);  // no ring: one group
  EXPECT_EQ(l.recv_bytes, (moved + lse) * 8 + moved * 8);
}

// A fixed all-to-all layout and a fixed order of summing replicated heads: the same bits twice.
TEST(HeadParallel, ResultsAreBitwiseReproducible) {
  const int N = world().size();
  const Case c{"repro", Shape{1, 4 * N + 3, 2 * N, 1, 8}, LayoutKind::zigzag, true};
  for (int U : degrees()) {
    SCOPED_TRACE("usp U=" + std::to_string(U));
    const auto a = run<float>(c, StrategyKind::usp, U), b = run<float>(c, StrategyKind::usp, U);
    ASSERT_EQ(a.out.size(), b.out.size());
    EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)), 0);
  }
}

// Even shards: each rank receives (N-1)/N B S 2 HKV D elements of K/V per pass, whatever G.
TEST(AllGather, ReceivesTheClosedForm) {
  const Index N = world().size();
  const Shape s{2, 4 * N, 4, 4, 4};
  for (int G : {1, 2, 4}) {
    SCOPED_TRACE("G=" + std::to_string(G));
    const Ledger l = run<double>(Case{"even", s}, StrategyKind::allgather, 0, G).ledger;
    const Index kv = (N - 1) * s.B * s.S * 2 * s.HKV * s.D / N;
    EXPECT_EQ(l.ag_fwd_recv_elems, kv);
    EXPECT_EQ(l.ag_bwd_recv_elems, kv);
    EXPECT_EQ(l.rs_bwd_recv_elems, kv);
    EXPECT_EQ(l.fwd_kv_recv_elems + l.replay_kv_recv_elems + l.grad_recv_elems + l.a2a_fwd_recv_elems, 0);
  }
}

// A causal window of W on even contiguous shards of 4: rank r gathers only the W - 1 positions
// before its first, e min(W - 1, 4 r) elements per pass, and returns dK/dV for them alone.
TEST(AllGather, WindowGathersOnlyTheKeysItsRowsSee) {
  const Index N = world().size(), r = world().rank(), W = 6;
  const Shape s{2, 4 * N, 4, 2, 4};
  for (int G : {1, 2}) {
    SCOPED_TRACE("G=" + std::to_string(G));
    const Case c{"window", s, LayoutKind::contiguous, true, W};
    const auto out = run<double>(c, StrategyKind::allgather, 0, G);
    EXPECT_LE(out.err.max(), 1e-12);
    const Index e = 2 * s.B * s.HKV * s.D;
    EXPECT_EQ(out.ledger.ag_fwd_recv_elems, e * std::min(W - 1, 4 * r));
    EXPECT_EQ(out.ledger.ag_bwd_recv_elems, e * std::min(W - 1, 4 * r));
    EXPECT_EQ(out.ledger.rs_bwd_send_elems, e * std::min(W - 1, 4 * r));
    // What the ranks after r need of its 4 positions: all of them (r + 1), the last one (r + 2).
    const Index given = (r + 1 < N ? 4 : 0) + (r + 2 < N ? 1 : 0);
    EXPECT_EQ(out.ledger.rs_bwd_recv_elems, e * given);
  }
}

// Packed documents, causal, contiguous: rank r gathers the part of its first document that lies
// before its shard, nothing else.
TEST(AllGather, DocumentsGatherOnlyTheirOwnStart) {
  const Index N = world().size(), r = world().rank();
  const Shape s{1, 3 * N, 2, 2, 4};
  const std::vector<Index> docs{N + 1, 2 * N - 1};  // a boundary inside rank N / 3's shard
  const Case c{"documents", s, LayoutKind::contiguous, true, 0, docs};
  const auto out = run<double>(c, StrategyKind::allgather, 0, 1);
  EXPECT_LE(out.err.max(), 1e-12);
  const Index first = 3 * r, start = first < N + 1 ? 0 : N + 1;  // its first position's document
  EXPECT_EQ(out.ledger.ag_fwd_recv_elems, 2 * s.B * s.HKV * s.D * (N > 1 ? first - start : 0));
}

// A fixed order of blocks and of summing the contributions: the same bits twice, for each G.
TEST(AllGather, ResultsAreBitwiseReproducible) {
  const int N = world().size();
  const Case full{"repro", Shape{1, 4 * N + 3, 4, 2, 8}, LayoutKind::zigzag, true};
  const Case sliced{"repro_window", Shape{1, 4 * N + 3, 4, 2, 8}, LayoutKind::contiguous, true, 5};
  for (const Case& c : {full, sliced})
    for (int G : {1, 2}) {
      SCOPED_TRACE(c.name + " G=" + std::to_string(G));
      const auto a = run<float>(c, StrategyKind::allgather, 0, G), b = run<float>(c, StrategyKind::allgather, 0, G);
      ASSERT_EQ(a.out.size(), b.out.size());
      EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)), 0);
    }
}

// usp with U = 1 is the ring: the same bits.
TEST(HeadParallel, UspDegreeOneIsTheRing) {
  const int N = world().size();
  const Case c{"ring", Shape{2, 3 * N + 2, 4, 2, 8}, LayoutKind::zigzag, true};
  const auto a = run<float>(c, StrategyKind::usp, 1), b = run<float>(c, StrategyKind::ring, 1);
  ASSERT_EQ(a.out.size(), b.out.size());
  EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)), 0);
  EXPECT_EQ(a.ledger, b.ledger);
}
