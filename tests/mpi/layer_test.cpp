// The distributed layer (projections, RoPE, ring attention, output projection, summed weight
// gradients) against the dense float64 layer reference on real MPI ranks, and the fixed-order
// all-reduce it uses. Every rank builds the whole input from a fixed seed, computes the serial
// reference and checks its own positions of y and dx and its own copy of every weight gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "ringattn/comm/comm.hpp"
#include "ringattn/comm/reduce.hpp"
#include "ringattn/core/inputs.hpp"
#include "ringattn/core/layer_reference.hpp"
#include "ringattn/runtime/layer.hpp"
#include "mpi_test_util.hpp"

using namespace ringattn;
using namespace ringattn::core;

namespace {

using test_util::global_input;
using test_util::local_slice;
using test_util::world;
constexpr std::uint64_t kSeed = 23;  // the inputs of every case

struct LayerCase {
  std::string name;
  Shape s;
  Index M;
  LayoutKind kind = LayoutKind::contiguous;
  bool causal = false;
  std::optional<double> rope;
  bool all_on_last_rank = false;  // contiguous partition 0, .., 0, S: empty ranks
};

struct Hooks {
  bool average = false, local_positions = false;
};

template <class T>
struct LayerRun {
  double err[6] = {0, 0, 0, 0, 0, 0};  // y, dx, dwq, dwk, dwv, dwo
  std::vector<T> dw;                   // dwq | dwk | dwv | dwo, this rank's copy
  runtime::LayerStats bwd;
};

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Max over ranks of max |mine - ref| / max |ref|; NaN or inf gives +inf.
template <class T>
double rel_error(std::span<const T> mine, const std::vector<double>& ref) {
  double diff = 0;
  for (std::size_t n = 0; n < ref.size(); ++n) {
    const double d = std::abs(double(mine[n]) - ref[n]);
    diff = std::isfinite(d) ? std::max(diff, d) : std::numeric_limits<double>::infinity();
  }
  return world().max(diff) / max_abs(ref);
}

template <class T>
LayerRun<T> run_layer(const LayerCase& c, Hooks hooks = {}) {
  const comm::Comm& comm = world();
  const int r = comm.rank(), N = comm.size();
  const Shape& s = c.s;
  const Index M = c.M, HD = s.H * s.D, KD = s.HKV * s.D;
  std::vector<Index> partition;
  if (c.all_on_last_rank) {
    partition.assign(N, 0);
    partition.back() = s.S;
  }
  const Layout layout = Layout::make(c.kind, s.S, N, partition);
  const Mask mask = Mask::make(s.S, c.causal, 0, {});
  const double scale = 1.0 / std::sqrt(double(s.D));
  const double wscale = 1.0 / std::sqrt(double(M));
  LayerTensors g{global_input<T>(kSeed, InputTensor::x, 1, s.B * s.S, M, 1.0),
                 global_input<T>(kSeed, InputTensor::wq, 1, M, HD, wscale),
                 global_input<T>(kSeed, InputTensor::wk, 1, M, KD, wscale),
                 global_input<T>(kSeed, InputTensor::wv, 1, M, KD, wscale),
                 global_input<T>(kSeed, InputTensor::wo, 1, HD, M, 1.0 / std::sqrt(double(HD))),
                 global_input<T>(kSeed, InputTensor::dy, 1, s.B * s.S, M, 1.0)};
  const LayerResult ref = reference_layer(s, M, mask, scale, c.rope, g);

  runtime::LayerSetup setup;
  setup.attention.shape = s;
  setup.attention.layout = &layout;
  setup.attention.mask = &mask;
  setup.attention.scale = scale;
  setup.attention.tiling = Tiling{16, 32};
  setup.M = M;
  setup.rope = c.rope;
  setup.average_weight_grads = hooks.average;
  setup.rope_local_positions = hooks.local_positions;
  runtime::Layer<T> layer(comm, setup);
  auto to_t = [](const std::vector<double>& v) { return std::vector<T>(v.begin(), v.end()); };
  const auto x = local_slice<T>(g.x, s.B, M, layout, r), dy = local_slice<T>(g.dy, s.B, M, layout, r);
  const auto wq = to_t(g.wq), wk = to_t(g.wk), wv = to_t(g.wv), wo = to_t(g.wo);
  layer.load(x.data(), wq.data(), wk.data(), wv.data(), wo.data(), dy.data());
  layer.forward();
  LayerRun<T> out;
  out.bwd = layer.backward();
  const std::vector<double> ref_y = local_slice<double>(ref.y, s.B, M, layout, r),
                            ref_dx = local_slice<double>(ref.dx, s.B, M, layout, r);
  // Positional outputs are compared on this rank's positions, scaled by the global max |ref|.
  auto rel_local = [&](std::span<const T> mine, const std::vector<double>& want, const std::vector<double>& whole) {
    double diff = 0;
    for (std::size_t n = 0; n < want.size(); ++n) {
      const double d = std::abs(double(mine[n]) - want[n]);
      diff = std::isfinite(d) ? std::max(diff, d) : std::numeric_limits<double>::infinity();
    }
    return world().max(diff) / max_abs(whole);
  };
  out.err[0] = rel_local(layer.y(), ref_y, ref.y);
  out.err[1] = rel_local(layer.dx(), ref_dx, ref.dx);
  out.err[2] = rel_error(layer.dwq(), ref.dwq);
  out.err[3] = rel_error(layer.dwk(), ref.dwk);
  out.err[4] = rel_error(layer.dwv(), ref.dwv);
  out.err[5] = rel_error(layer.dwo(), ref.dwo);
  for (auto w : {layer.dwq(), layer.dwk(), layer.dwv(), layer.dwo()}) out.dw.insert(out.dw.end(), w.begin(), w.end());
  return out;
}

std::vector<LayerCase> cases() {
  const std::optional<double> rope = 10000.0;
  return {
      {"contiguous_causal_rope_gqa_b2", Shape{2, 37, 4, 2, 8}, 12, LayoutKind::contiguous, true, rope},
      {"striped_rope_gqa", Shape{1, 29, 4, 1, 8}, 16, LayoutKind::striped, false, rope},
      {"zigzag_causal_rope_b2", Shape{2, 41, 2, 2, 6}, 10, LayoutKind::zigzag, true, rope},
      {"zigzag_no_rope", Shape{1, 24, 2, 1, 4}, 8, LayoutKind::zigzag, false, std::nullopt},
      {"contiguous_rope_S3_fewer_positions_than_ranks", Shape{1, 3, 2, 1, 4}, 6, LayoutKind::contiguous, true, rope},
      {"all_on_last_rank_causal_rope", Shape{1, 19, 2, 2, 4}, 8, LayoutKind::contiguous, true, rope, true},
  };
}

const char* kNames[6] = {"y", "dx", "dwq", "dwk", "dwv", "dwo"};

template <class T>
void expect_all_within(double tol) {
  for (const LayerCase& c : cases()) {
    const LayerRun<T> run = run_layer<T>(c);
    for (int t = 0; t < 6; ++t) EXPECT_LE(run.err[t], tol) << c.name << " " << kNames[t];
  }
}

}  // namespace

// float64 end to end: only rounding separates the ring from the dense reference.
TEST(LayerRing, MatchesDenseReferenceFloat64) { expect_all_within<double>(1e-12); }

// float32: the GEMMs sum at most B*S = 82 products in float and the attention kernels add their
// own few ulps; about 4.4e-7 is observed here (f64: 1.2e-15), so 5e-6 leaves ~10x headroom while
// any wrong term (a missing rank, a wrong angle) is off by O(1).
TEST(LayerRing, MatchesDenseReferenceFloat32) { expect_all_within<float>(5e-6); }

// The ranks compute one sequence: the weight gradient is the SUM of their partials. DDP's averaging
// (divide by N) must fail the check while y and dx, which do not depend on it, still pass.
TEST(LayerRing, AveragingWeightGradientsIsCaught) {
  if (world().size() < 2) GTEST_SKIP() << "with one rank the sum and the average coincide";
  const LayerCase c = cases()[0];
  const LayerRun<double> run = run_layer<double>(c, Hooks{true, false});
  EXPECT_LE(run.err[0], 1e-12);
  EXPECT_LE(run.err[1], 1e-12);
  const double expected = 1.0 - 1.0 / world().size();  // every entry shrinks by 1/N
  for (int t = 2; t < 6; ++t) EXPECT_NEAR(run.err[t], expected, 1e-9) << kNames[t];
}

// Under zigzag every rank holds two distant chunks: rotating by local index instead of global
// position changes the relative positions between chunks and ranks, and y must fail the check.
TEST(LayerRing, RopeAtLocalPositionsIsCaughtUnderZigzag) {
  if (world().size() < 2) GTEST_SKIP() << "with one rank local and global positions coincide";
  const LayerCase c = cases()[2];
  ASSERT_EQ(c.kind, LayoutKind::zigzag);
  const LayerRun<double> good = run_layer<double>(c);
  const LayerRun<double> bad = run_layer<double>(c, Hooks{false, true});
  EXPECT_LE(good.err[0], 1e-12);
  EXPECT_GT(bad.err[0], 1e-3);
  EXPECT_GT(bad.err[2], 1e-3);  // and the gradients of Wq with it
}

// The same job twice gives the same bits, and every rank holds the same bits.
TEST(LayerRing, WeightGradientsAreBitwiseIdenticalOnEveryRankAndRun) {
  for (const LayerCase& c : {cases()[0], cases()[1], cases()[2]}) {
    const LayerRun<float> a = run_layer<float>(c), b = run_layer<float>(c);
    ASSERT_EQ(a.dw.size(), b.dw.size());
    EXPECT_EQ(std::memcmp(a.dw.data(), b.dw.data(), a.dw.size() * sizeof(float)), 0) << c.name;
    std::vector<double> mine(a.dw.begin(), a.dw.end()), root = mine;  // float -> double is exact
    world().broadcast(root, 0);
    EXPECT_EQ(std::memcmp(mine.data(), root.data(), mine.size() * sizeof(double)), 0)
        << c.name << ": rank " << world().rank() << " differs from rank 0";
  }
}

// dWo's reduction runs across the ring backward: it reports its traffic and an exposed time that
// is part of (never more than) its elapsed time.
TEST(LayerRing, DwoReductionReportsTrafficAndExposedTime) {
  const LayerCase c = cases()[0];
  const LayerRun<double> run = run_layer<double>(c);
  const int N = world().size(), r = world().rank();
  const std::int64_t n = c.s.H * c.s.D * c.M, own = comm::segment_size(n, N, r);
  EXPECT_EQ(run.bwd.dwo.elems, n);
  EXPECT_EQ(run.bwd.dwo.send_elems, (n - own) + (N - 1) * own);
  EXPECT_EQ(run.bwd.dwo.recv_elems, (N - 1) * own + (n - own));
  EXPECT_GE(run.bwd.dwo.exposed_s, 0.0);
  EXPECT_LE(run.bwd.dwo.exposed_s, run.bwd.dwo.elapsed_s);
  if (run.bwd.dwo.hidden) {
    EXPECT_EQ(run.bwd.dwo.exposed_s, 0.0);
  }
  if (N == 1) {
    EXPECT_TRUE(run.bwd.dwo.hidden);
  }
}

// ---- the fixed-order all-reduce on its own ---------------------------------------------------

// Values whose float sum depends on the order of the additions.
float partial_value(int rank, std::int64_t e) {
  const float big = (rank % 2 ? -1.0f : 1.0f) * 3.0e7f * float(1 + e % 3);
  return big + 0.1f * float(rank + 1) + 1e-3f * float(e % 7);
}

TEST(OrderedAllreduce, SumIsTheRankOrderedSumOnEveryRank) {
  const comm::Comm& comm = world();
  const int N = comm.size(), r = comm.rank();
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{N - 1}, std::int64_t{7}, std::int64_t{1001}}) {
    std::vector<float> part(n), total(n, -1.0f), want(n);
    for (std::int64_t e = 0; e < n; ++e) {
      part[e] = partial_value(r, e);
      double acc = 0;  // rank order 0..N-1, in double, rounded once
      for (int q = 0; q < N; ++q) acc += double(partial_value(q, e));
      want[e] = float(acc);
    }
    const comm::ReduceStats st = comm::ordered_allreduce(comm, part.data(), total.data(), n);
    if (n > 0) {  // memcmp must not see the null data() of an empty vector
      EXPECT_EQ(std::memcmp(total.data(), want.data(), n * sizeof(float)), 0) << "n = " << n;
    }
    const std::int64_t own = comm::segment_size(n, N, r);
    EXPECT_EQ(st.send_elems, (n - own) + (N - 1) * own);
  }
}

TEST(OrderedAllreduce, SegmentsCoverTheBufferInBalancedPieces) {
  for (int N : {1, 2, 3, 5})
    for (std::int64_t n : {0, 1, 4, 7, 23}) {
      std::int64_t next = 0;
      for (int c = 0; c < N; ++c) {
        EXPECT_EQ(comm::segment_begin(n, N, c), next);
        EXPECT_LE(comm::segment_size(n, N, c), n / N + 1);
        next += comm::segment_size(n, N, c);
      }
      EXPECT_EQ(next, n);
    }
}

// Polled to completion before wait(): nothing exposed, and wait() says so.
TEST(OrderedAllreduce, CompletedBeforeWaitIsReportedHidden) {
  const comm::Comm& comm = world();
  std::vector<double> part(4096, 1.0 + comm.rank()), total(4096);
  comm::OrderedAllreduce<double> red(comm);
  red.start(part.data(), total.data(), 4096);
  const double t0 = comm::wtime();
  while (!red.test()) ASSERT_LT(comm::wtime() - t0, 30.0) << "the reduction never completed";
  red.wait();
  EXPECT_TRUE(red.stats().hidden);
  EXPECT_EQ(red.stats().exposed_s, 0.0);
  const double N = comm.size();
  for (double x : total) ASSERT_EQ(x, N * (N + 1) / 2);
}
