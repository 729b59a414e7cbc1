// The block kernels against the dense float64 reference, without MPI: a serial simulation of
// the ring (every rank's steps in turn) must reproduce the reference for any layout, mask,
// tiling and block order.
#include "ringattn/core/block_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ringattn/core/layout.hpp"
#include "ringattn/core/reference.hpp"
#include "ringattn/core/simd.hpp"
#include "test_targets.hpp"
#include "core/amx_tiles.hpp"  // amx::set_enabled: the portable path on a machine with AMX
#include "core/bf16_dot.hpp"   // bf16dot::set_enabled: the same with the dot products

using namespace ringattn::core;

namespace {

// A workspace for tiling t on the current target, for shards of at most Lmax positions.
template <class A>
Workspace<A> workspace(const Tiling& t, Index D, Index Lmax, Index G = 1, Precision precision = Precision::f32) {
  return Workspace<A>(resolve_tiling(t, D, Lmax, G), D, precision);
}

using ringattn::test::on_every_target;

// The targets this CPU runs, best first; the dispatch picks the first. Printed, so that a run under
// an emulator shows which vector extensions (and, for SVE, which vector length) it exercised.
TEST(BlockAttention, DispatchPicksTheBestTargetThisCpuRuns) {
  const std::vector<std::string> targets = simd::available();
  ASSERT_FALSE(targets.empty());
  simd::select(targets.front());
  std::string list;
  for (const std::string& t : targets) list += (list.empty() ? "" : " ") + t;
  std::printf("SIMD targets this CPU runs: %s; the best, %s, blocks f32 scores in %lld columns\n", list.c_str(),
              simd::current().c_str(), static_cast<long long>(simd::column_block(sizeof(float))));
  EXPECT_EQ(simd::current(), targets.front());
}

// The benchmark's piece timing: on every target, each of the three passes takes time and the
// product's flops are those of the target's default tiles at that head dim.
TEST(BlockAttention, PieceTimesCoverTheDefaultTiles) {
  on_every_target([] {
    const Tiling t = simd::default_tiling();
    for (const DType type : {DType::f32, DType::f64})
      for (const Index D : {Index(17), Index(64)}) {
        const simd::PieceTimes p = simd::piece_times(type, D, 2);
        EXPECT_GT(p.score, 0.0);
        EXPECT_GT(p.exp, 0.0);
        EXPECT_GT(p.accumulate, 0.0);
        // each repetition's piece takes at least the best of each pass
        EXPECT_GE(p.piece_median, p.score + p.exp + p.accumulate);
        EXPECT_EQ(p.product_flops, 2.0 * double(t.q_rows) * double(t.k_cols) * double(D));
      }
  });
}

// The kernels' 2^x, which forms every softmax weight (P = 2^(S - m)), on every target: within
// kMaxUlps of 2^x over a dense sweep of the whole kept range and of [-1, 0] (where its argument's
// fraction takes every value), against long double, never NaN; exactly 1 at 0 and 2^least at the
// least kept x; 0 below it (never a denormal) and at -inf; NaN for NaN.
TEST(BlockAttention, Exp2IsWithinItsUlps) {
  static_assert(std::numeric_limits<long double>::digits > 53, "the f64 reference needs a wider long double");
  on_every_target([] {
    for (const DType type : {DType::f32, DType::f64}) {
      const bool f64 = type == DType::f64;
      // f32, a degree-5 polynomial: 1.8 ulp where MulAdd is one fused operation, 2.1 where it is a
      // product and a sum (the targets without FMA: SSE4, SSE2, EMU128); f64, degree 13:
      // 1 ulp and 1.2
      const std::string t = simd::current();
      const bool fused = simd::fused_multiply_add();
      const double kMaxUlps = f64 ? (fused ? 1.0 : 1.2) : (fused ? 1.8 : 2.1);
      const int mantissa = f64 ? 52 : 23;
      const double least = f64 ? -1021.0 : -125.0, inf = std::numeric_limits<double>::infinity();
      auto kernel_exp2 = [&](std::vector<double> x) {
        if (!f64)
          for (double& e : x) e = double(float(e));
        std::vector<double> y(x.size());
        simd::exp2_values(type, x.data(), y.data(), Index(x.size()));
        return std::pair{x, y};
      };
      std::vector<double> sweep;
      for (int i = 0; i <= 200000; ++i) sweep.push_back(least * i / 200000);
      for (int i = 0; i <= 200000; ++i) sweep.push_back(-1.0 * i / 200000);
      const auto [x, y] = kernel_exp2(sweep);
      double worst = 0, at = 0;
      std::size_t nans = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        const long double ref = std::exp2l(static_cast<long double>(x[i]));
        const double ulps = double(std::fabs(static_cast<long double>(y[i]) - ref) /
                                   std::ldexp(1.0L, std::ilogb(ref) - mantissa));
        if (std::isnan(ulps)) ++nans;
        else if (ulps > worst) worst = ulps, at = x[i];
      }
      std::printf("%s %s%s: 2^x within %.3f ulp (at x = %.9g)\n", t.c_str(), f64 ? "f64" : "f32",
                  fused ? "" : " (multiply-add not fused)", worst, at);
      EXPECT_EQ(nans, 0u) << t << (f64 ? " f64" : " f32");
      EXPECT_LE(worst, kMaxUlps) << t << (f64 ? " f64" : " f32") << " at x = " << at;
      const double below = f64 ? std::nextafter(least, -inf) : double(std::nextafter(float(least), -HUGE_VALF));
      const auto [xs, ys] = kernel_exp2({0.0, least, below, least - 1, -1e6, -inf, std::nan("")});
      EXPECT_EQ(ys[0], 1.0);
      EXPECT_EQ(ys[1], std::ldexp(1.0, int(least)));
      EXPECT_EQ(ys[2], 0.0);
      EXPECT_EQ(ys[3], 0.0);
      EXPECT_EQ(ys[4], 0.0);
      EXPECT_EQ(ys[5], 0.0);
      EXPECT_TRUE(std::isnan(ys[6]));
      // no denormal just below the least kept x either: 0, or at least 2^least
      std::vector<double> edge;
      for (int i = 0; i <= 1000; ++i) edge.push_back(least - 2.0 * i / 1000);
      const auto [xe, ye] = kernel_exp2(edge);
      for (std::size_t i = 0; i < xe.size(); ++i)
        EXPECT_TRUE(ye[i] == 0.0 || ye[i] >= std::ldexp(1.0, int(least))) << t << " at x = " << xe[i];
    }
  });
}

struct Global {
  Shape s;
  std::vector<double> q, k, v, dout;
};

Global random_inputs(const Shape& s, unsigned seed, double q_scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d;
  Global g{s, {}, {}, {}, {}};
  for (auto* t : {&g.q, &g.dout}) t->resize(s.B * s.S * s.H * s.D);
  for (auto* t : {&g.k, &g.v}) t->resize(s.B * s.S * s.HKV * s.D);
  for (auto* t : {&g.q, &g.k, &g.v, &g.dout})
    for (double& x : *t) x = d(gen);
  for (double& x : g.q) x *= q_scale;
  return g;
}

// Gather the positions of rank r from a global [B, S, heads, D] tensor into packed form.
template <class T>
std::vector<T> shard_packed(const std::vector<double>& global, const Shape& s, Index heads, const Layout& l, int r) {
  const Index L = l.size(r);
  auto pos = l.positions(r);
  std::vector<T> file(s.B * L * heads * s.D);
  for (Index b = 0; b < s.B; ++b)
    for (Index i = 0; i < L; ++i)
      for (Index e = 0; e < heads * s.D; ++e)
        file[(b * L + i) * heads * s.D + e] = value_cast<T>(global[(b * s.S + pos[i]) * heads * s.D + e]);
  const Index G = heads == s.H ? s.G() : 1;
  const Packing pk{s.B, s.HKV, G, L, s.D};
  std::vector<T> packed(file.size());
  pack_heads(pk, file.data(), packed.data());
  return packed;
}

// Scatter a packed shard back into a global file-layout tensor.
template <class T>
void unshard(const std::vector<T>& packed, const Shape& s, Index heads, const Layout& l, int r,
             std::vector<double>& global) {
  const Index L = l.size(r);
  auto pos = l.positions(r);
  const Index G = heads == s.H ? s.G() : 1;
  std::vector<T> file(packed.size());
  unpack_heads(Packing{s.B, s.HKV, G, L, s.D}, packed.data(), file.data());
  for (Index b = 0; b < s.B; ++b)
    for (Index i = 0; i < L; ++i)
      for (Index e = 0; e < heads * s.D; ++e)
        global[(b * s.S + pos[i]) * heads * s.D + e] = static_cast<double>(file[(b * L + i) * heads * s.D + e]);
}

// Serial ring: forward over blocks in ring order, backward replaying them and returning
// contributions to their owners, summed in step order.
template <class S>
DenseResult simulate_ring(const Global& g, const Layout& l, const Mask& mask, double scale, const Tiling& tiling,
                          const AttentionExtras& x = {}, Precision precision = Precision::f32) {
  using A = accum_t<S>;
  const Shape& s = g.s;
  const int N = l.ranks();
  DenseResult out;
  if (!x.sinks.empty()) out.dsinks.assign(s.H, 0.0);
  out.o.assign(g.q.size(), 0);
  out.dq.assign(g.q.size(), 0);
  out.dk.assign(g.k.size(), 0);
  out.dv.assign(g.k.size(), 0);
  out.lse.assign(s.B * s.H * s.S, 0);
  std::vector<std::vector<S>> kv(N);
  std::vector<std::vector<A>> dkv(N);
  for (int o = 0; o < N; ++o) {
    auto k = shard_packed<S>(g.k, s, s.HKV, l, o), v = shard_packed<S>(g.v, s, s.HKV, l, o);
    kv[o] = k;
    kv[o].insert(kv[o].end(), v.begin(), v.end());
    dkv[o].assign(kv[o].size(), A(0));
  }
  auto block = [&](int o) {
    const Packing pk{s.B, s.HKV, 1, l.size(o), s.D};
    return KVBlock<S>{pk, l.positions(o), kv[o].data(), kv[o].data() + pk.kv_elems()};
  };
  Workspace<A> ws = workspace<A>(tiling, s.D, l.max_size(), s.G(), precision);
  // contributions[r][j]: rank r's contribution to block (r - j) mod N
  std::vector<std::vector<std::vector<A>>> contrib(N, std::vector<std::vector<A>>(N));
  for (int r = 0; r < N; ++r) {
    const Packing pq{s.B, s.HKV, s.G(), l.size(r), s.D};
    auto q = shard_packed<S>(g.q, s, s.H, l, r), dout = shard_packed<S>(g.dout, s, s.H, l, r);
    std::vector<A> m(pq.row_elems()), lsum(pq.row_elems()), lse(pq.row_elems()), acc(pq.q_elems()),
        delta(pq.row_elems()), dq(pq.q_elems(), A(0));
    const QueryShard<S> qs{pq, l.positions(r), q.data()};
    OnlineState<A> st{m.data(), lsum.data(), acc.data()};
    init_online_state(pq, st);
    for (int j = 0; j < N; ++j) block_forward(qs, block(((r - j) % N + N) % N), mask, A(scale), st, ws, {}, A(x.softcap));
    // every row sees its own position's key: a row left with l = 0 saw only -inf scores (NaN softmax)
    finalize_forward(pq, st, lse.data(), x.sinks.empty() ? nullptr : x.sinks.data(), /*every_row_sees_a_key=*/true);
    compute_delta(pq, dout.data(), acc.data(), delta.data());
    if (!x.dlse.empty())  // delta_i -= dLSE_i, the global [B, H, S] at this rank's rows
      for (Index b = 0; b < s.B; ++b)
        for (Index h = 0; h < s.H; ++h)
          for (Index i = 0; i < l.size(r); ++i)
            delta[pq.row_group(b, h / s.G()) + i * s.G() + h % s.G()] -=
                A(x.dlse[(b * s.H + h) * s.S + l.positions(r)[i]]);
    const GradQueryShard<S> gq{qs, dout.data(), m.data(), lsum.data(), delta.data(), dq.data()};
    for (int j = 0; j < N; ++j) {
      const int o = ((r - j) % N + N) % N;
      contrib[r][j].assign(kv[o].size(), A(0));
      A* c = contrib[r][j].data();
      block_backward(gq, block(o), mask, A(scale), c, c + kv[o].size() / 2, ws, {}, A(x.softcap));
    }
    if (!x.sinks.empty()) add_sink_grad(pq, m.data(), lsum.data(), delta.data(), x.sinks.data(), out.dsinks.data());
    unshard(acc, s, s.H, l, r, out.o);
    unshard(dq, s, s.H, l, r, out.dq);
    // lse rows [B, HKV, L, G] -> [B, H, S]
    for (Index b = 0; b < s.B; ++b)
      for (Index h = 0; h < s.H; ++h)
        for (Index i = 0; i < l.size(r); ++i)
          out.lse[(b * s.H + h) * s.S + l.positions(r)[i]] = lse[pq.row_group(b, h / s.G()) + i * s.G() + h % s.G()];
  }
  for (int o = 0; o < N; ++o) {
    // owner o receives at step j from rank (o + j) mod N
    for (int j = 0; j < N; ++j) {
      const auto& c = contrib[(o + j) % N][j];
      for (std::size_t e = 0; e < c.size(); ++e) dkv[o][e] += c[e];
    }
    std::vector<A> dk(dkv[o].begin(), dkv[o].begin() + dkv[o].size() / 2), dv(dkv[o].begin() + dkv[o].size() / 2,
                                                                                 dkv[o].end());
    unshard(dk, s, s.HKV, l, o, out.dk);
    unshard(dv, s, s.HKV, l, o, out.dv);
  }
  return out;
}

struct Case {
  const char* name;
  Shape s;
  Layout layout;
  Mask mask;
  Tiling tiling;
};

std::vector<Case> cases() {
  const Index S = 37;
  return {
      {"one_rank_full", Shape{1, S, 2, 2, 8}, Layout::contiguous(S, 1), Mask::none(), {}},
      {"causal_uneven_partition_gqa_b2", Shape{2, S, 4, 2, 16}, Layout::partitioned({10, 0, 27}),
       Mask::make(S, true, 0, {}), {}},
      {"causal_tiny_tiles", Shape{2, S, 4, 1, 8}, Layout::contiguous(S, 4), Mask::make(S, true, 0, {}), {5, 3, 32, 10}},
      {"noncausal_striped", Shape{1, S, 3, 3, 4}, Layout::striped(S, 5), Mask::none(), {4, 4}},
      {"causal_zigzag", Shape{1, S, 2, 1, 8}, Layout::zigzag(S, 3), Mask::make(S, true, 0, {}), {6, 7}},
      {"window_contiguous", Shape{1, S, 2, 2, 8}, Layout::contiguous(S, 4), Mask::make(S, true, 6, {}), {4, 5}},
      {"documents_causal_zigzag", Shape{2, S, 2, 2, 4}, Layout::zigzag(S, 2), Mask::make(S, true, 0, {5, 20, 12}),
       {3, 8}},
      {"seq_below_ranks", Shape{1, 3, 2, 1, 4}, Layout::contiguous(3, 5), Mask::make(3, true, 0, {}), {}},
  };
}

// Shapes that exercise every remainder of the kernels' register blocks on every target: head dims
// that are and are not multiples of the lanes (the column tail), query tiles that leave 1..7 rows
// after 8-, 6- and 4-row blocks, key tiles and trimmed strips that leave every column count of a
// score block, and partial tiles of every mask.
std::vector<Case> packed_cases() {
  const Index S = 83;
  return {
      {"d16_full_odd_tiles", Shape{1, S, 2, 2, 16}, Layout::contiguous(S, 2), Mask::none(), {13, 37}},
      {"d32_causal_zigzag_gqa", Shape{1, S, 4, 2, 32}, Layout::zigzag(S, 3), Mask::make(S, true, 0, {}), {19, 41, 5}},
      {"d48_causal_striped", Shape{2, S, 2, 1, 48}, Layout::striped(S, 2), Mask::make(S, true, 0, {}), {11, 50, 3}},
      {"d64_default_tiles", Shape{1, S, 2, 2, 64}, Layout::contiguous(S, 2), Mask::make(S, true, 0, {}), {}},
      {"d64_window_documents", Shape{1, S, 3, 1, 64}, Layout::zigzag(S, 2), Mask::make(S, true, 9, {30, 53}),
       {7, 33, 2}},
      {"d80_full_partitioned", Shape{1, S, 1, 1, 80}, Layout::partitioned({40, 0, 43}), Mask::none(), {17, 64}},
      {"d144_causal", Shape{1, S, 2, 2, 144}, Layout::contiguous(S, 3), Mask::make(S, true, 0, {}), {23, 29, 4}},
      {"d17_odd_head_dim_causal_gqa", Shape{1, S, 4, 2, 17}, Layout::zigzag(S, 2), Mask::make(S, true, 0, {}),
       {9, 21, 5}},
      {"d3_tiny_head_dim_window", Shape{2, S, 2, 1, 3}, Layout::contiguous(S, 2), Mask::make(S, true, 7, {}), {6, 11}},
      {"d32_row_chunks_of_two_tiles", Shape{1, S, 4, 2, 32}, Layout::contiguous(S, 1), Mask::make(S, true, 0, {}),
       {7, 16, 3, 14}},
  };
}

double rel(const std::vector<double>& x, const std::vector<double>& ref) { return max_rel_error(x, ref); }

// With extras: a soft cap (by default 0.7, which bends scores of order 1), a sink per head (head 0
// without one) and a gradient into LSE.
template <class T>
void expect_matches_reference(double tol, const std::vector<Case>& all = cases(), bool extras = false,
                              double cap = 0.7) {
  for (const Case& c : all) {
    SCOPED_TRACE(c.name);
    const Global g = random_inputs(c.s, 11);
    Global gin = g;  // the reference sees exactly the values the kernel sees
    for (auto* t : {&gin.q, &gin.k, &gin.v, &gin.dout})
      for (double& x : *t) x = value_cast<double>(value_cast<T>(x));
    const double scale = 1.0 / std::sqrt(double(c.s.D));
    AttentionExtras x;
    if (extras) {
      x.softcap = cap;
      for (Index h = 0; h < c.s.H; ++h) x.sinks.push_back(h == 0 ? -INFINITY : 0.5 * double(h) - 0.6);
      x.dlse = random_inputs(Shape{c.s.B, c.s.S, c.s.H, c.s.H, 1}, 12).q;  // [B, S, H, 1] read as [B, H, S]
      for (double& v : x.dlse) v = value_cast<double>(static_cast<accum_t<T>>(v));
    }
    const DenseResult ref = reference_attention(c.s, c.mask, scale, gin.q, gin.k, gin.v, gin.dout, true, x);
    const DenseResult got = simulate_ring<T>(gin, c.layout, c.mask, scale, c.tiling, x);
    EXPECT_LE(rel(got.o, ref.o), tol);
    EXPECT_LE(rel(got.lse, ref.lse), tol);
    EXPECT_LE(rel(got.dq, ref.dq), tol);
    EXPECT_LE(rel(got.dk, ref.dk), tol);
    EXPECT_LE(rel(got.dv, ref.dv), tol);
    if (extras) {
      EXPECT_LE(rel(got.dsinks, ref.dsinks), tol);
    }
  }
}

}  // namespace

TEST(BlockAttention, RingOfBlocksMatchesDenseReferenceFloat64) {
  on_every_target([] { expect_matches_reference<double>(1e-12); });
}

TEST(BlockAttention, RingOfBlocksMatchesDenseReferenceFloat32) {
  on_every_target([] { expect_matches_reference<float>(1e-5); });
}

// float32 rounding over D-long dot products and up to S-long sums, relative to the largest
// element: a few 1e-7 per step; 2e-5 leaves room and still fails any wrong index or mask.
// bf16 and f16 operands widen to float in the tile copies: against the reference on the rounded
// values, the error is float32's.
TEST(BlockAttention, RingOfBlocksMatchesDenseReferenceBf16AndF16Storage) {
  on_every_target([] {
    expect_matches_reference<bf16>(1e-5);
    expect_matches_reference<f16>(1e-5);
  });
}

TEST(BlockAttention, BlockRemaindersMatchDenseReferenceBf16AndF16Storage) {
  on_every_target([] {
    expect_matches_reference<bf16>(2e-5, packed_cases());
    expect_matches_reference<f16>(2e-5, packed_cases());
  });
}

TEST(BlockAttention, BlockRemaindersMatchDenseReferenceFloat32) {
  on_every_target([] { expect_matches_reference<float>(2e-5, packed_cases()); });
}

TEST(BlockAttention, BlockRemaindersMatchDenseReferenceFloat64) {
  on_every_target([] { expect_matches_reference<double>(1e-12, packed_cases()); });
}

// Soft-capping, sinks and a gradient into LSE on every target, through every tile remainder.
TEST(BlockAttention, SoftcapSinksAndLseGradientMatchDenseReference) {
  on_every_target([] {
    expect_matches_reference<double>(1e-12, cases(), true);
    expect_matches_reference<double>(1e-12, packed_cases(), true);
    expect_matches_reference<float>(2e-5, cases(), true);
    expect_matches_reference<float>(2e-5, packed_cases(), true);
    expect_matches_reference<bf16>(2e-5, cases(), true);
  });
}

// A cap far above the scores bends them by s^3 / (3 c^2): capped, they are the scores to rounding,
// and so is the result (tanh as (1 - e^-2x) / (1 + e^-2x) alone cancelled to a few bits of it, and a
// cap of 1e10 gave uniform attention in f32).
TEST(BlockAttention, CapsFarAboveTheScoresKeepTheirPrecision) {
  on_every_target([] {
    for (double cap : {8.0, 1e3, 1e6, 1e10}) {
      SCOPED_TRACE("softcap " + std::to_string(cap));
      expect_matches_reference<float>(2e-5, cases(), true, cap);
      expect_matches_reference<double>(1e-12, cases(), true, cap);
    }
    expect_matches_reference<double>(1e-12, cases(), true, 1e30);
  });
}

// Every target agrees with the best one to float rounding on the same inputs, forward and
// backward, and a single wrong value (here: one query element changed) is far outside that.
TEST(BlockAttention, EveryTargetAgreesWithTheBestToRounding) {
  const Shape s{1, 70, 2, 1, 64};
  const Mask mask = Mask::make(s.S, true, 0, {});
  const Layout whole = Layout::contiguous(s.S, 1);
  const Global g = random_inputs(s, 4);
  const Packing pq{s.B, s.HKV, s.G(), s.S, s.D};
  auto q = shard_packed<float>(g.q, s, s.H, whole, 0), dout = shard_packed<float>(g.dout, s, s.H, whole, 0);
  auto k = shard_packed<float>(g.k, s, s.HKV, whole, 0), v = shard_packed<float>(g.v, s, s.HKV, whole, 0);
  const KVBlock<float> kv{Packing{s.B, s.HKV, 1, s.S, s.D}, whole.positions(0), k.data(), v.data()};
  // o, lse, dq, dk, dv one after another
  auto run = [&](const std::vector<float>& qv) {
    std::vector<float> m(pq.row_elems()), l(pq.row_elems()), lse(pq.row_elems()), acc(pq.q_elems()),
        delta(pq.row_elems()), dq(pq.q_elems(), 0.f), dk(k.size(), 0.f), dv(v.size(), 0.f);
    OnlineState<float> st{m.data(), l.data(), acc.data()};
    init_online_state(pq, st);
    Workspace<float> ws = workspace<float>(Tiling{24, 40, 8}, s.D, s.S, s.G());
    const QueryShard<float> qs{pq, whole.positions(0), qv.data()};
    block_forward(qs, kv, mask, 0.125f, st, ws);
    finalize_forward(pq, st, lse.data());
    compute_delta(pq, dout.data(), acc.data(), delta.data());
    block_backward(GradQueryShard<float>{qs, dout.data(), m.data(), l.data(), delta.data(), dq.data()}, kv, mask,
                   0.125f, dk.data(), dv.data(), ws);
    std::vector<double> out;
    for (const auto* t : {&acc, &lse, &dq, &dk, &dv}) out.insert(out.end(), t->begin(), t->end());
    return out;
  };
  const std::vector<double> best = run(q);
  auto q2 = q;
  q2[37 * s.D + 5] += 0.5f;
  on_every_target([&] {
    EXPECT_LE(rel(run(q), best), 1e-6);
    EXPECT_GT(rel(run(q2), best), 1e-3);
  });
}

// The online-softmax update gives the same O and LSE for any order and split of the keys,
// including blocks in which some rows see nothing (future keys under the causal mask).
TEST(BlockAttention, OnlineSoftmaxIsIndependentOfBlockOrderAndSplit) {
  on_every_target([&] {
    const Shape s{1, 24, 2, 1, 8};
    const Mask mask = Mask::make(s.S, true, 0, {});
    const Global g = random_inputs(s, 5, 3.0);
    const double scale = 0.3;
    const DenseResult ref = reference_attention(s, mask, scale, g.q, g.k, g.v, g.dout, false);
    const Layout whole = Layout::contiguous(s.S, 1);
    auto q = shard_packed<double>(g.q, s, s.H, whole, 0);
    const Packing pq{s.B, s.HKV, s.G(), s.S, s.D};
    std::mt19937 gen(9);
    for (int trial = 0; trial < 20; ++trial) {
      // random cut of the keys into blocks, visited in random order
      std::vector<Index> cuts = {0, s.S};
      for (int c = 0; c < 1 + trial % 5; ++c) cuts.push_back(1 + gen() % (s.S - 1));
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      std::vector<Index> sizes;
      for (std::size_t c = 1; c < cuts.size(); ++c) sizes.push_back(cuts[c] - cuts[c - 1]);
      const Layout blocks = Layout::partitioned(sizes);
      std::vector<int> order(sizes.size());
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
      std::shuffle(order.begin(), order.end(), gen);
      std::vector<double> m(pq.row_elems()), l(pq.row_elems()), acc(pq.q_elems());
      OnlineState<double> st{m.data(), l.data(), acc.data()};
      init_online_state(pq, st);
      // strips of 1, 2 or 3 rows, or none (0)
      Workspace<double> ws = workspace<double>(Tiling{5, 4, trial % 4}, s.D, s.S, s.G());
      for (int o : order) {
        auto k = shard_packed<double>(g.k, s, s.HKV, blocks, o), v = shard_packed<double>(g.v, s, s.HKV, blocks, o);
        const KVBlock<double> kv{Packing{s.B, s.HKV, 1, blocks.size(o), s.D}, blocks.positions(o), k.data(), v.data()};
        block_forward(QueryShard<double>{pq, whole.positions(0), q.data()}, kv, mask, scale, st, ws);
      }
      std::vector<double> rows(pq.row_elems());
      finalize_forward(pq, st, rows.data());
      std::vector<double> o(g.q.size()), lse(s.B * s.H * s.S);
      unshard(acc, s, s.H, whole, 0, o);
      for (Index h = 0; h < s.H; ++h)
        for (Index i = 0; i < s.S; ++i) lse[h * s.S + i] = rows[i * s.G() + h];
      EXPECT_LE(rel(o, ref.o), 1e-13) << "trial " << trial;
      EXPECT_LE(rel(lse, ref.lse), 1e-13) << "trial " << trial;
    }
  });
}

// Merging per-block softmaxes with equal weights is wrong (blocks weigh by their exp mass), and
// the comparison used everywhere catches it.
TEST(BlockAttention, EqualWeightAveragingOfBlockSoftmaxesIsCaught) {
  on_every_target([&] {
    const Shape s{1, 16, 1, 1, 4};
    const Global g = random_inputs(s, 2, 2.0);
    const double scale = 0.5;
    const DenseResult ref = reference_attention(s, Mask::none(), scale, g.q, g.k, g.v, g.dout, false);
    const Layout whole = Layout::contiguous(s.S, 1), halves = Layout::partitioned({6, 10});
    auto q = shard_packed<double>(g.q, s, s.H, whole, 0);
    const Packing pq{s.B, s.HKV, s.G(), s.S, s.D};
    std::vector<double> avg(pq.q_elems(), 0.0);
    Workspace<double> ws = workspace<double>(Tiling{}, s.D, s.S);
    for (int o = 0; o < 2; ++o) {
      std::vector<double> m(pq.row_elems()), l(pq.row_elems()), acc(pq.q_elems());
      OnlineState<double> st{m.data(), l.data(), acc.data()};
      init_online_state(pq, st);
      auto k = shard_packed<double>(g.k, s, s.HKV, halves, o), v = shard_packed<double>(g.v, s, s.HKV, halves, o);
      block_forward(QueryShard<double>{pq, whole.positions(0), q.data()},
                    KVBlock<double>{Packing{1, 1, 1, halves.size(o), s.D}, halves.positions(o), k.data(), v.data()},
                    Mask::none(), scale, st, ws);
      std::vector<double> lse(pq.row_elems());
      finalize_forward(pq, st, lse.data());
      for (std::size_t e = 0; e < avg.size(); ++e) avg[e] += 0.5 * acc[e];
    }
    std::vector<double> o(g.q.size());
    unshard(avg, s, s.H, whole, 0, o);
    EXPECT_GT(rel(o, ref.o), 1e-2);
  });
}

// Whole blocks with no visible pair do no work at all; causal tiles above the diagonal are skipped.
TEST(BlockAttention, EmptyBlocksAndTilesAreSkipped) {
  on_every_target([&] {
    const Shape s{1, 64, 1, 1, 4};
    const Mask causal = Mask::make(s.S, true, 0, {});
    const Layout l = Layout::contiguous(s.S, 2);
    const Global g = random_inputs(s, 1);
    auto q0 = shard_packed<double>(g.q, s, s.H, l, 0);
    auto k1 = shard_packed<double>(g.k, s, s.HKV, l, 1), v1 = shard_packed<double>(g.v, s, s.HKV, l, 1);
    auto k0 = shard_packed<double>(g.k, s, s.HKV, l, 0), v0 = shard_packed<double>(g.v, s, s.HKV, l, 0);
    const Packing pq{1, 1, 1, 32, s.D};
    std::vector<double> m(32), ls(32), acc(32 * s.D);
    OnlineState<double> st{m.data(), ls.data(), acc.data()};
    init_online_state(pq, st);
    Workspace<double> ws = workspace<double>(Tiling{8, 8}, s.D, 32);
    const QueryShard<double> qs{pq, l.positions(0), q0.data()};
    // rank 0's queries against rank 1's (future) keys: nothing
    const Work none = block_forward(qs, KVBlock<double>{pq, l.positions(1), k1.data(), v1.data()}, causal, 1.0, st, ws);
    EXPECT_EQ(none.tile_pairs, 0);
    EXPECT_EQ(none.flops, 0);
    // its own block: 4x4 tiles of 8, only the 10 on or below the diagonal
    const Work own = block_forward(qs, KVBlock<double>{pq, l.positions(0), k0.data(), v0.data()}, causal, 1.0, st, ws);
    EXPECT_EQ(own.tile_pairs, 10);
    EXPECT_EQ(own.flops, 10 * 4.0 * 8 * 8 * s.D);
  });
}

namespace {
// Tile pairs computed by one rank's queries against its own block (positions 0 .. L-1).
Work self_block_work(Index L, const Mask& mask, Index T, Index D = 4, Index strip = 32) {
  const Shape s{1, L, 1, 1, D};
  const Layout l = Layout::contiguous(L, 1);
  const Global g = random_inputs(s, 3);
  auto q = shard_packed<double>(g.q, s, 1, l, 0), k = shard_packed<double>(g.k, s, 1, l, 0),
       v = shard_packed<double>(g.v, s, 1, l, 0);
  const Packing pk{1, 1, 1, L, D};
  std::vector<double> m(L), ls(L), acc(L * D);
  OnlineState<double> st{m.data(), ls.data(), acc.data()};
  init_online_state(pk, st);
  Workspace<double> ws = workspace<double>(Tiling{T, T, strip}, D, L);
  return block_forward(QueryShard<double>{pk, l.positions(0), q.data()},
                       KVBlock<double>{pk, l.positions(0), k.data(), v.data()}, mask, 1.0, st, ws);
}
}  // namespace

// Closed forms of the skipped work with n = L / T square tiles per side: causal keeps the
// n(n+1)/2 tiles on or below the diagonal; a window W <= T keeps the diagonal and, for W > 1,
// the subdiagonal (2n - 1); causal documents aligned to tiles keep sum n_d(n_d+1)/2.
TEST(BlockAttention, SkippedTilePairsFollowTheirClosedForms) {
  on_every_target([&] {
    const Index L = 96, T = 8, n = L / T;
    EXPECT_EQ(self_block_work(L, Mask::none(), T).tile_pairs, n * n);
    EXPECT_EQ(self_block_work(L, Mask::make(L, true, 0, {}), T).tile_pairs, n * (n + 1) / 2);
    EXPECT_EQ(self_block_work(L, Mask::make(L, true, 5, {}), T).tile_pairs, 2 * n - 1);
    EXPECT_EQ(self_block_work(L, Mask::make(L, true, 1, {}), T).tile_pairs, n);
    // documents of 16, 32, 48 positions = 2, 4, 6 tiles
    EXPECT_EQ(self_block_work(L, Mask::make(L, true, 0, {16, 32, 48}), T).tile_pairs, 3 + 10 + 21);
    EXPECT_EQ(self_block_work(L, Mask::make(L, false, 0, {16, 32, 48}), T).tile_pairs, 4 + 16 + 36);
    const Work causal = self_block_work(L, Mask::make(L, true, 0, {}), T, 4);
    EXPECT_EQ(causal.flops, causal.tile_pairs * 4.0 * T * T * 4);
  });
}

// A partial tile is computed as a staircase of strips, each trimmed to the keys its rows see: a
// causal diagonal tile of T rows in strips of s rows costs sum_{k=1..T/s} s * ks pairs instead
// of T^2.
TEST(BlockAttention, PartialTilesAreComputedAsTrimmedStrips) {
  on_every_target([&] {
    const Index L = 96, T = 16, n = L / T, D = 4;
    for (Index strip : {1, 4, 8, 16}) {
      const Work causal = self_block_work(L, Mask::make(L, true, 0, {}), T, D, strip);
      EXPECT_EQ(causal.tile_pairs, n * (n + 1) / 2) << "strip " << strip;
      const Index m = T / strip;
      const double diagonal_pairs = double(strip) * strip * m * (m + 1) / 2;  // sum_k s * (k s)
      EXPECT_EQ(causal.flops, 4.0 * D * (n * (n - 1) / 2 * double(T * T) + n * diagonal_pairs)) << "strip " << strip;
    }
    // Strips of 0 rows: none, every partial tile whole.
    EXPECT_EQ(self_block_work(L, Mask::make(L, true, 0, {}), T, D, 0).flops, 4.0 * D * n * (n + 1) / 2 * T * T);
    // Strips of one row compute exactly the visible pairs: L(L+1)/2 for causal, and for a window
    // of W rows i-W < j <= i: sum_i min(i+1, W).
    EXPECT_EQ(self_block_work(L, Mask::make(L, true, 0, {}), T, D, 1).flops, 4.0 * D * L * (L + 1) / 2);
    const Index W = 5;
    double window_pairs = 0;
    for (Index i = 0; i < L; ++i) window_pairs += double(std::min(i + 1, W));
    EXPECT_EQ(self_block_work(L, Mask::make(L, true, W, {}), T, D, 1).flops, 4.0 * D * window_pairs);
    // Documents of 10, 30, 56 positions (not aligned to tiles), non-causal, strips of one row:
    // exactly sum_d n_d^2 pairs.
    EXPECT_EQ(self_block_work(L, Mask::make(L, false, 0, {10, 30, 56}), T, D, 1).flops,
              4.0 * D * (10 * 10 + 30 * 30 + 56 * 56));
  });
}


// A timing-only simulation charges count_block_forward's work instead of running the kernels: it
// must be exactly what the kernels report, forward and backward (2.5x the flops), for every mask,
// layout, tiling, GQA group and block of the ring, including the empty ones.
TEST(BlockAttention, CountedWorkIsWhatTheKernelsReport) {
  std::vector<Case> all = cases();
  for (const Case& c : packed_cases()) all.push_back(c);
  for (const Case& c : all) {
    SCOPED_TRACE(c.name);
    const Shape& s = c.s;
    const Layout& l = c.layout;
    const Global g = random_inputs(s, 11);
    Workspace<double> ws = workspace<double>(c.tiling, s.D, l.max_size(), s.G());
    Index pairs = 0;
    for (int r = 0; r < l.ranks(); ++r) {
      const Packing pq{s.B, s.HKV, s.G(), l.size(r), s.D};
      auto q = shard_packed<double>(g.q, s, s.H, l, r), dout = shard_packed<double>(g.dout, s, s.H, l, r);
      std::vector<double> m(pq.row_elems()), lsum(pq.row_elems()), lse(pq.row_elems()), acc(pq.q_elems()),
          delta(pq.row_elems()), dq(pq.q_elems(), 0.0);
      const QueryShard<double> qs{pq, l.positions(r), q.data()};
      OnlineState<double> st{m.data(), lsum.data(), acc.data()};
      init_online_state(pq, st);
      for (int o = 0; o < l.ranks(); ++o) {
        const Packing pk{s.B, s.HKV, 1, l.size(o), s.D};
        auto k = shard_packed<double>(g.k, s, s.HKV, l, o), v = shard_packed<double>(g.v, s, s.HKV, l, o);
        const KVBlock<double> kv{pk, l.positions(o), k.data(), v.data()};
        const Work done = block_forward(qs, kv, c.mask, 0.5, st, ws);
        const Work counted = count_block_forward(qs, KVBlock<double>{pk, l.positions(o), nullptr, nullptr}, c.mask, ws);
        EXPECT_EQ(counted.tile_pairs, done.tile_pairs) << "rank " << r << " block " << o;
        EXPECT_EQ(counted.flops, done.flops) << "rank " << r << " block " << o;
        pairs += done.tile_pairs;
      }
      finalize_forward(pq, st, lse.data());
      compute_delta(pq, dout.data(), acc.data(), delta.data());
      const GradQueryShard<double> gq{qs, dout.data(), m.data(), lsum.data(), delta.data(), dq.data()};
      for (int o = 0; o < l.ranks(); ++o) {
        const Packing pk{s.B, s.HKV, 1, l.size(o), s.D};
        auto k = shard_packed<double>(g.k, s, s.HKV, l, o), v = shard_packed<double>(g.v, s, s.HKV, l, o);
        std::vector<double> dkv(2 * pk.kv_elems(), 0.0);
        const Work done = block_backward(gq, KVBlock<double>{pk, l.positions(o), k.data(), v.data()}, c.mask, 0.5,
                                         dkv.data(), dkv.data() + pk.kv_elems(), ws);
        const Work counted = count_block_forward(qs, KVBlock<double>{pk, l.positions(o), nullptr, nullptr}, c.mask, ws);
        EXPECT_EQ(counted.tile_pairs, done.tile_pairs) << "rank " << r << " block " << o;
        EXPECT_EQ(2.5 * counted.flops, done.flops) << "rank " << r << " block " << o;
      }
    }
    EXPECT_GT(pairs, 0);  // the case computes something
  }
}

// ---- non-finite inputs ----------------------------------------------------------------------------
//
// NaN and Inf in q, k, v or dO give what PyTorch's float64 autograd gives when each query row's
// softmax runs over the keys that row sees (tests/torch/nonfinite_check.py holds the Python package to
// torch itself): an output element is non-finite exactly when it depends, through a visible (query,
// key) pair, on a non-finite input, and the finite elements keep their values. Never zeros for NaN.

namespace {

// The definition, independent of the kernels and of reference.cpp: for each (b, h, i) the visible
// keys' scores, softmax(s) = exp(s - max s) / sum (NaN when a score is NaN, as torch's), O = P V; the
// backward as autograd takes it through softmax: dS = P o (dP - sum_j P_j dP_j), dP_j = dO . V_j.
// With softcap c > 0 the scores are s -> c tanh(s / c) (an infinite score becomes +-c) and dS takes
// the factor 1 - tanh^2, which is 0 for an infinite score: 0 times the infinite q or k is then NaN.
DenseResult visible_keys_reference(const Global& g, const Mask& mask, double scale, double softcap = 0) {
  const Shape& s = g.s;
  const Index B = s.B, S = s.S, H = s.H, HKV = s.HKV, D = s.D, G = s.G();
  const double inf = std::numeric_limits<double>::infinity();
  DenseResult r;
  r.o.assign(g.q.size(), 0.0);
  r.dq.assign(g.q.size(), 0.0);
  r.dk.assign(g.k.size(), 0.0);
  r.dv.assign(g.k.size(), 0.0);
  r.lse.assign(B * H * S, -inf);
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < S; ++i) {
        const double* q = &g.q[((b * S + i) * H + h) * D];
        const double* dO = &g.dout[((b * S + i) * H + h) * D];
        auto kv = [&](const std::vector<double>& t, Index j) { return &t[((b * S + j) * HKV + h / G) * D]; };
        std::vector<Index> keys;
        for (Index j = 0; j < S; ++j)
          if (mask.visible(i, j)) keys.push_back(j);
        if (keys.empty()) continue;
        std::vector<double> p(keys.size()), dp(keys.size()), capd(keys.size(), 1.0);
        double mx = -inf;
        bool nan = false;
        for (std::size_t n = 0; n < keys.size(); ++n) {
          double dot = 0;
          for (Index d = 0; d < D; ++d) dot += q[d] * kv(g.k, keys[n])[d];
          p[n] = dot * scale;
          if (softcap > 0) {
            const double t = std::tanh(p[n] / softcap);
            p[n] = softcap * t;
            capd[n] = 1 - t * t;
          }
          nan |= std::isnan(p[n]);
          mx = std::max(mx, p[n]);
        }
        if (nan) mx = std::nan("");
        double sum = 0;
        for (double& x : p) sum += (x = std::exp(x - mx));
        r.lse[(b * H + h) * S + i] = mx + std::log(sum);
        double* o = &r.o[((b * S + i) * H + h) * D];
        for (std::size_t n = 0; n < keys.size(); ++n) {
          p[n] /= sum;
          for (Index d = 0; d < D; ++d) o[d] += p[n] * kv(g.v, keys[n])[d];
        }
        double pdp = 0;
        for (std::size_t n = 0; n < keys.size(); ++n) {
          dp[n] = 0;
          for (Index d = 0; d < D; ++d) dp[n] += dO[d] * kv(g.v, keys[n])[d];
          pdp += p[n] * dp[n];
        }
        for (std::size_t n = 0; n < keys.size(); ++n) {
          const Index j = keys[n], kvo = ((b * S + j) * HKV + h / G) * D;
          const double ds = p[n] * (dp[n] - pdp) * capd[n];
          for (Index d = 0; d < D; ++d) {
            r.dq[((b * S + i) * H + h) * D + d] += scale * ds * g.k[kvo + d];
            r.dk[kvo + d] += scale * ds * q[d];
            r.dv[kvo + d] += p[n] * dO[d];
          }
        }
      }
  return r;
}

// One value put into one input: tensor 'q', 'k', 'v' or 'o' (dO), at [b, position, head, d].
struct Plant {
  const char* name;
  char tensor;
  Index b, pos, head, d;
  double value;
};

// Positions relative to S, so that they fall on different ranks and tiles.
std::vector<Plant> plants(const Shape& s) {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const Index S = s.S;
  return {
      {"q NaN", 'q', s.B - 1, S / 2, s.H - 1, s.D - 1, nan},
      {"k NaN", 'k', 0, S / 3, s.HKV - 1, 0, nan},
      {"k NaN at 0", 'k', s.B - 1, 0, 0, s.D / 2, nan},
      {"v NaN", 'v', s.B - 1, S / 4, 0, s.D / 2, nan},
      {"dout NaN", 'o', 0, S - 3, 0, 1 % s.D, nan},
      {"q +inf", 'q', 0, 2 * S / 3, 0, 0, inf},
      {"q -inf", 'q', s.B - 1, 1, s.H - 1, 0, -inf},
      {"k +inf", 'k', s.B - 1, S / 2 + 1, 0, s.D - 1, inf},
  };
}

void plant(Global& g, const Plant& p) {
  const Shape& s = g.s;
  std::vector<double>& t = p.tensor == 'q' ? g.q : p.tensor == 'k' ? g.k : p.tensor == 'v' ? g.v : g.dout;
  const Index heads = (p.tensor == 'k' || p.tensor == 'v') ? s.HKV : s.H;
  t[((p.b * s.S + p.pos) * heads + p.head) * s.D + p.d] = p.value;
}

// Non-finite exactly where ref is (NaN and +-inf alike), and the finite elements within tol of
// max |ref| over them.
void expect_pattern(const char* name, const std::vector<double>& got, const std::vector<double>& ref, double tol) {
  ASSERT_EQ(got.size(), ref.size()) << name;
  Index missed = 0, extra = 0, zeros = 0;
  double peak = 0, err = 0;
  for (std::size_t n = 0; n < ref.size(); ++n) {
    const bool gf = std::isfinite(got[n]), rf = std::isfinite(ref[n]);
    if (gf && !rf) ++missed, zeros += got[n] == 0;
    if (!gf && rf) ++extra;
    if (gf && rf) {
      peak = std::max(peak, std::abs(ref[n]));
      err = std::max(err, std::abs(got[n] - ref[n]));
    }
  }
  EXPECT_EQ(missed, 0) << name << ": finite where the reference is not (" << zeros << " of them 0)";
  EXPECT_EQ(extra, 0) << name << ": non-finite where the reference is finite";
  EXPECT_LE(err, tol * std::max(peak, 1e-300)) << name;
}

void expect_result_pattern(const DenseResult& got, const DenseResult& ref, double tol) {
  expect_pattern("o", got.o, ref.o, tol);
  expect_pattern("lse", got.lse, ref.lse, tol);
  expect_pattern("dq", got.dq, ref.dq, tol);
  expect_pattern("dk", got.dk, ref.dk, tol);
  expect_pattern("dv", got.dv, ref.dv, tol);
}

std::vector<Case> nonfinite_cases() {
  const Index S = 37;
  return {
      {"full_striped_gqa_b2", Shape{2, S, 4, 2, 8}, Layout::striped(S, 3), Mask::none(), {4, 5, 2}},
      {"causal_tiny_tiles_gqa", Shape{2, S, 4, 2, 8}, Layout::contiguous(S, 4), Mask::make(S, true, 0, {}),
       {5, 3, 2, 10}},
      {"causal_zigzag_default_tiles", Shape{1, S, 2, 1, 16}, Layout::zigzag(S, 2), Mask::make(S, true, 0, {}), {}},
      {"causal_one_block", Shape{1, S, 2, 2, 8}, Layout::contiguous(S, 1), Mask::make(S, true, 0, {}), {8, 8, 4}},
      {"window_documents_zigzag", Shape{2, S, 2, 2, 4}, Layout::zigzag(S, 3), Mask::make(S, true, 6, {5, 20, 12}),
       {3, 8}},
      {"d17_documents_full_partitioned", Shape{1, S, 4, 2, 17}, Layout::partitioned({10, 0, 27}),
       Mask::make(S, false, 0, {11, 26}), {6, 9, 4}},
  };
}

// Without and with soft-capping (the random scores are about N(0, 1), so a cap of 1.5 bends many).
constexpr double kCaps[] = {0.0, 1.5};

// Every planted value through the serial ring on every target, against the definition.
template <class T>
void expect_nonfinite_pattern(double tol, Precision precision = Precision::f32) {
  for (const Case& c : nonfinite_cases())
    for (const Plant& p : plants(c.s))
      for (double cap : kCaps) {
        SCOPED_TRACE(std::string(c.name) + ", " + p.name + ", softcap " + std::to_string(cap));
        Global g = random_inputs(c.s, 17);
        for (auto* t : {&g.q, &g.k, &g.v, &g.dout})  // the values the kernels see
          for (double& x : *t) x = value_cast<double>(value_cast<T>(x));
        plant(g, p);
        const double scale = 1.0 / std::sqrt(double(c.s.D));
        const DenseResult ref = visible_keys_reference(g, c.mask, scale, cap);
        const DenseResult got =
            simulate_ring<T>(g, c.layout, c.mask, scale, c.tiling, AttentionExtras{cap, {}, {}}, precision);
        expect_result_pattern(got, ref, tol);
      }
}

}  // namespace

// The planted values make something non-finite and leave something finite in every output (else the
// pattern would not tell), and the dense references of reference.cpp (--check's) follow the definition.
TEST(NonFinite, ReferencesFollowTheDefinition) {
  for (const Case& c : nonfinite_cases())
    for (const Plant& p : plants(c.s))
      for (double cap : kCaps) {
        SCOPED_TRACE(std::string(c.name) + ", " + p.name + ", softcap " + std::to_string(cap));
        Global g = random_inputs(c.s, 17);
        plant(g, p);
        const double scale = 1.0 / std::sqrt(double(c.s.D));
        const AttentionExtras extras{cap, {}, {}};
        const DenseResult ref = visible_keys_reference(g, c.mask, scale, cap);
        Index finite = 0, nonfinite = 0;
        for (const auto* t : {&ref.o, &ref.lse, &ref.dq, &ref.dk, &ref.dv})
          for (double x : *t) ++(std::isfinite(x) ? finite : nonfinite);
        EXPECT_GT(nonfinite, 0);
        // a NaN in the key every row sees leaves nothing finite when there is one batch
        const bool everything = p.tensor == 'k' && p.pos == 0 && c.s.B == 1 && !c.mask.has_docs() && !c.mask.window();
        if (!everything) {
          EXPECT_GT(finite, 0);
        }
        const DenseResult gemm = reference_attention(c.s, c.mask, scale, g.q, g.k, g.v, g.dout, true, extras);
        const DenseResult loops = reference_attention_loops(c.s, c.mask, scale, g.q, g.k, g.v, g.dout, true, extras);
        expect_result_pattern(gemm, ref, 1e-12);
        expect_result_pattern(loops, ref, 1e-12);
      }
}

TEST(NonFinite, PropagateAsInTorchFloat64) {
  on_every_target([] { expect_nonfinite_pattern<double>(1e-12); });
}

TEST(NonFinite, PropagateAsInTorchFloat32) {
  on_every_target([] { expect_nonfinite_pattern<float>(2e-5); });
}

TEST(NonFinite, PropagateAsInTorchBf16AndF16Storage) {
  on_every_target([] {
    expect_nonfinite_pattern<bf16>(2e-5);
    expect_nonfinite_pattern<f16>(2e-5);
  });
}

// A row whose query is NaN has O = NaN and LSE = NaN, not the O = 0, LSE = -inf of a row that sees
// no key; a row that sees no key keeps that, whatever the others hold.
TEST(NonFinite, NanRowIsNotAnEmptyRow) {
  on_every_target([] {
    const Shape s{1, 8, 1, 1, 4};
    const Mask causal = Mask::make(s.S, true, 0, {});
    Global g = random_inputs(s, 3);
    g.q[5 * s.D] = std::nan("");
    const Layout halves = Layout::contiguous(s.S, 2);
    const DenseResult got = simulate_ring<double>(g, halves, causal, 0.5, Tiling{});
    for (Index i = 0; i < s.S; ++i) {
      EXPECT_EQ(std::isnan(got.lse[i]), i == 5) << "row " << i;
      EXPECT_EQ(std::isnan(got.o[i * s.D]), i == 5) << "row " << i;
    }
    // rank 0's rows against rank 1's block alone: no visible key, the empty-row contract
    auto q0 = shard_packed<double>(g.q, s, s.H, halves, 0);
    auto k1 = shard_packed<double>(g.k, s, s.HKV, halves, 1), v1 = shard_packed<double>(g.v, s, s.HKV, halves, 1);
    k1[0] = v1[1] = std::nan("");
    const Packing pq{1, 1, 1, 4, s.D};
    std::vector<double> m(4), l(4), acc(4 * s.D), lse(4);
    OnlineState<double> st{m.data(), l.data(), acc.data()};
    init_online_state(pq, st);
    Workspace<double> ws = workspace<double>(Tiling{}, s.D, 4);
    block_forward(QueryShard<double>{pq, halves.positions(0), q0.data()},
                  KVBlock<double>{pq, halves.positions(1), k1.data(), v1.data()}, causal, 0.5, st, ws);
    finalize_forward(pq, st, lse.data());
    for (Index i = 0; i < 4; ++i) EXPECT_EQ(lse[i], -std::numeric_limits<double>::infinity());
    for (double x : acc) EXPECT_EQ(x, 0.0);
  });
}

// ---- Precision::bf16 ------------------------------------------------------------------------------
//
// P rounded to bf16 before P V and P^T dO, dS rounded before dS K and dS^T Q (bf16 storage, f32
// accumulation), on every target, against the float64 definition (visible_keys_reference).

namespace {

// What the rounding may cost each output element, to first order: rounding to nearest bf16 (8
// significant bits, unit roundoff u = 2^-8) changes a value by at most u of it (half a step of 2^-7
// at the bottom of a binade; a typical term moves by about 2^-9), so with p = P / l (l from the
// unrounded P)
//   |dO_i|  <= u sum_j p_ij |V_j|                    |ddV_j| <= u sum_i p_ij |dO_i|
// and dS = scale p F (dP - delta) (F the cap's derivative, 1 without one) moves by its own rounding
// and by delta = dO . O, which takes O's change (|d delta_i| <= sum_d |dO_id| |dO_id|):
//   |ddQ_i| <= scale sum_j (u |dS'_ij| + p_ij F_ij |d delta_i|) |K_j|,  dK likewise with Q_i,
// |dS'| = |p F (dP - delta)|. Per element, in the layout of the outputs (LSE takes no rounding).
DenseResult bf16_rounding_bounds(const Global& g, const Mask& mask, double scale, double softcap) {
  const Shape& s = g.s;
  const Index B = s.B, S = s.S, H = s.H, HKV = s.HKV, D = s.D, G = s.G();
  constexpr double u = 1.0 / 256;  // 2^-8
  DenseResult r;
  r.o.assign(g.q.size(), 0.0);
  r.dq.assign(g.q.size(), 0.0);
  r.dk.assign(g.k.size(), 0.0);
  r.dv.assign(g.k.size(), 0.0);
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < S; ++i) {
        const Index qo = ((b * S + i) * H + h) * D;
        auto kvo = [&](Index j) { return ((b * S + j) * HKV + h / G) * D; };
        std::vector<Index> keys;
        for (Index j = 0; j < S; ++j)
          if (mask.visible(i, j)) keys.push_back(j);
        if (keys.empty()) continue;
        std::vector<double> p(keys.size()), f(keys.size(), 1.0), dp(keys.size(), 0.0);
        double mx = -INFINITY, sum = 0;
        for (std::size_t n = 0; n < keys.size(); ++n) {
          double dot = 0;
          for (Index d = 0; d < D; ++d) dot += g.q[qo + d] * g.k[kvo(keys[n]) + d];
          p[n] = dot * scale;
          if (softcap > 0) {
            const double t = std::tanh(p[n] / softcap);
            p[n] = softcap * t;
            f[n] = 1 - t * t;
          }
          mx = std::max(mx, p[n]);
        }
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (double& x : p) x /= sum;
        std::vector<double> o(D, 0.0), bo(D, 0.0);
        for (std::size_t n = 0; n < keys.size(); ++n)
          for (Index d = 0; d < D; ++d) {
            o[d] += p[n] * g.v[kvo(keys[n]) + d];
            bo[d] += u * p[n] * std::abs(g.v[kvo(keys[n]) + d]);
          }
        double delta = 0, ddelta = 0;
        for (Index d = 0; d < D; ++d) {
          delta += g.dout[qo + d] * o[d];
          ddelta += std::abs(g.dout[qo + d]) * bo[d];
          r.o[qo + d] = bo[d];
        }
        for (std::size_t n = 0; n < keys.size(); ++n) {
          for (Index d = 0; d < D; ++d) dp[n] += g.dout[qo + d] * g.v[kvo(keys[n]) + d];
          const double ds = std::abs(p[n] * f[n] * (dp[n] - delta));
          const double moved = scale * (u * ds + p[n] * f[n] * ddelta);
          for (Index d = 0; d < D; ++d) {
            r.dq[qo + d] += moved * std::abs(g.k[kvo(keys[n]) + d]);
            r.dk[kvo(keys[n]) + d] += moved * std::abs(g.q[qo + d]);
            r.dv[kvo(keys[n]) + d] += u * p[n] * std::abs(g.dout[qo + d]);
          }
        }
      }
  return r;
}

// |got - ref| <= bound + tol max |ref| for every element; returns the largest share of the bound
// the rounding used (got - ref beyond the f32 part, over the bound), to show it is not vacuous.
double expect_within(const char* name, const std::vector<double>& got, const std::vector<double>& ref,
                     const std::vector<double>& bound, double tol) {
  double peak = 0, used = 0;
  for (double x : ref) peak = std::max(peak, std::abs(x));
  Index bad = 0;
  for (std::size_t n = 0; n < ref.size(); ++n) {
    const double err = std::abs(got[n] - ref[n]), allowed = bound[n] + tol * peak;
    if (!(err <= allowed) && bad++ < 3) ADD_FAILURE() << name << "[" << n << "]: |" << got[n] << " - " << ref[n]
                                                       << "| > " << bound[n] << " + " << tol * peak;
    if (bound[n] > 0) used = std::max(used, (err - tol * peak) / bound[n]);
  }
  EXPECT_EQ(bad, 0) << name;
  return used;
}

}  // namespace

// The float part of the error is float32's (the 2e-5 of max |ref| of the remainder tests above); the
// rounding's part is held to its first-order bound, element by element (bf16_rounding_bounds), with
// 10% for its second-order terms. Causal and full masks, partial tiles, GQA, odd head dims, with and
// without a soft cap. Rounding must also show: the result differs from the reference by 20x more
// than Precision::f32's is allowed to (else the rounding was skipped). The portable path (the f32 tile rounded,
// then the FMA products) on every target; where the machine has AMX or bf16 dot products (vdpbf16ps,
// BFDOT), those as well, on the best target (the products are the same code on every target).
TEST(BlockAttention, Bf16PrecisionMatchesDenseReferenceWithinTheRoundingBound) {
  std::vector<Case> all = cases();
  for (const Case& c : packed_cases()) all.push_back(c);
  const bool amx_was = amx::enabled(), dot_was = bf16dot::enabled();
  for (const std::string engine : {"", "AMX", "DOT"}) {
    if ((engine == "AMX" && !amx::available()) || (engine == "DOT" && !bf16dot::available())) continue;
    amx::set_enabled(engine == "AMX");
    bf16dot::set_enabled(engine == "DOT");
    SCOPED_TRACE(engine.empty() ? "FMA products" : engine);
    auto targets = [&](auto&& fn) {
      if (engine.empty())
        on_every_target(fn);
      else
        fn();
    };
    targets([&] {
      double used = 0, moved = 0;
      for (const Case& c : all)
        for (double cap : {0.0, 0.7}) {
          SCOPED_TRACE(std::string(c.name) + ", softcap " + std::to_string(cap));
          Global g = random_inputs(c.s, 11);
          for (auto* t : {&g.q, &g.k, &g.v, &g.dout})  // the values the kernels see
            for (double& x : *t) x = value_cast<double>(value_cast<bf16>(x));
          const double scale = 1.0 / std::sqrt(double(c.s.D));
          const AttentionExtras x{cap, {}, {}};
          const DenseResult ref = visible_keys_reference(g, c.mask, scale, cap);
          DenseResult bound = bf16_rounding_bounds(g, c.mask, scale, cap);
          for (auto* t : {&bound.o, &bound.dq, &bound.dk, &bound.dv})
            for (double& e : *t) e *= 1.1;
          const DenseResult got = simulate_ring<bf16>(g, c.layout, c.mask, scale, c.tiling, x, Precision::bf16);
          constexpr double kTol = 2e-5;
          used = std::max(used, expect_within("o", got.o, ref.o, bound.o, kTol));
          EXPECT_LE(rel(got.lse, ref.lse), kTol);
          used = std::max(used, expect_within("dq", got.dq, ref.dq, bound.dq, kTol));
          used = std::max(used, expect_within("dk", got.dk, ref.dk, bound.dk, kTol));
          used = std::max(used, expect_within("dv", got.dv, ref.dv, bound.dv, kTol));
          // f32 precision is within the float tolerance of the reference (the remainder tests above);
          // bf16 moves O and the gradients by the rounding, some 2^-9 of a term, far beyond it
          for (const auto& [a, b] : {std::pair{&got.o, &ref.o}, {&got.dq, &ref.dq}, {&got.dk, &ref.dk}, {&got.dv, &ref.dv}})
            moved = std::max(moved, rel(*a, *b));
          EXPECT_GT(std::max({rel(got.o, ref.o), rel(got.dv, ref.dv), rel(got.dq, ref.dq)}), 20 * kTol);
        }
      std::printf("bf16 precision on %s: at most %.2f of the rounding bound used; up to %.2g from the reference\n",
                  simd::kernels(DType::bf16).c_str(), used, moved);
    });
  }
  amx::set_enabled(amx_was);
  bf16dot::set_enabled(dot_was);
}

// Non-finite operands with Precision::bf16: the same pattern as the definition's (the rounding keeps
// NaN and inf, and 0 stays 0); the finite values within the rounding's reach of it, a few 2^-8 of
// the largest output (their bound is the test above's).
TEST(NonFinite, PropagateAsInTorchBf16Precision) {
  on_every_target([] { expect_nonfinite_pattern<bf16>(2e-2, Precision::bf16); });
}
