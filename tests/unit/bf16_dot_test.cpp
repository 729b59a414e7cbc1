// The vdpbf16ps score products of bf16 operands (src/core/bf16_dot.hpp) against a float64
// reference. Skipped where the CPU, the OS or the build has no AVX512_BF16; on such a machine they
// must run.
#include "core/bf16_dot.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/half.hpp"
#include "ringattn/core/simd.hpp"

using namespace ringattn::core;
using Index = std::int64_t;

namespace {

#define REQUIRE_BF16DOT()                                                                     \
  if (!bf16dot::available()) GTEST_SKIP() << "no bf16 dot products here (AVX512_BF16 or Arm BF16: CPU, OS or build)"

std::vector<std::uint16_t> random_bf16(Index n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<std::uint16_t> x(n);
  for (auto& b : x) b = to_bf16(nd(rng)).bits;
  return x;
}

double value(std::uint16_t b) { return double(to_float(bf16{b})); }

struct Case {
  Index n, tk, D, i0, k0;  // rows and keys of the product, head dim, row and key offset into the packed operands
};

// Every epilogue on random tiles, with the packing the AMX path uses: alpha times the float64 dot
// product to f32 rounding of the sum (the products are exact); max and store give the same bits,
// the row max is the max of the stored row, and nothing is written past tk or past n.
TEST(Bf16Dot, ScoresMatchFloat64OnRandomBf16Tiles) {
  REQUIRE_BF16DOT();
  std::mt19937 rng(11);
  for (const Case c : {Case{1, 1, 5, 0, 0}, Case{6, 16, 32, 0, 0}, Case{37, 45, 37, 3, 5}, Case{128, 256, 64, 0, 0},
                       Case{33, 17, 128, 16, 31}, Case{7, 100, 80, 1, 2}, Case{50, 64, 1, 0, 0},
                       Case{64, 33, 96, 32, 0}, Case{13, 65, 64, 0, 15}}) {
    SCOPED_TRACE(testing::Message() << "n=" << c.n << " tk=" << c.tk << " D=" << c.D);
    const Index rows = c.i0 + c.n, keys = c.k0 + c.tk, Dp = amx::padded_depth(c.D), ldk = amx::packed_keys(keys);
    const std::vector<std::uint16_t> Q = random_bf16(rows * c.D, rng), K = random_bf16(keys * c.D, rng);
    std::vector<std::uint16_t> A((rows + amx::kTileRows) * Dp, 0xFFFF), B(Dp * ldk, 0xFFFF);
    amx::pack_rows(Q.data(), rows, c.D, A.data());
    amx::pack_pairs(K.data(), keys, c.D, ldk, B.data());
    const float alpha = 0.3f, kSentinel = 12345.f;
    const Index lds = c.tk + 16, out_rows = c.n + 2;  // two rows past n must stay untouched
    std::vector<float> Smax(out_rows * lds, kSentinel), Sstore(out_rows * lds, kSentinel), rmax(c.n + 2, kSentinel);
    const std::uint16_t* a = A.data() + c.i0 * Dp;
    const std::uint16_t* b = B.data() + 2 * c.k0;
    bf16dot::scores(amx::Epilogue::max, a, c.n, b, ldk, c.tk, Dp, Smax.data(), lds, alpha, nullptr, nullptr,
                    rmax.data());
    bf16dot::scores(amx::Epilogue::store, a, c.n, b, ldk, c.tk, Dp, Sstore.data(), lds, alpha, nullptr, nullptr,
                    nullptr);
    std::vector<float> P(out_rows * lds), delta(c.n), G(out_rows * lds, kSentinel);
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    for (auto& p : P) p = ud(rng);
    for (auto& d : delta) d = ud(rng) - 0.5f;
    bf16dot::scores(amx::Epilogue::grad, a, c.n, b, ldk, c.tk, Dp, G.data(), lds, alpha, P.data(), delta.data(),
                    nullptr);
    double worst = 0, worst_grad = 0;
    for (Index i = 0; i < c.n; ++i) {
      float m = -std::numeric_limits<float>::infinity();
      for (Index j = 0; j < c.tk; ++j) {
        double dot = 0, mag = 0;
        for (Index d = 0; d < c.D; ++d) {
          const double p = value(Q[(c.i0 + i) * c.D + d]) * value(K[(c.k0 + j) * c.D + d]);
          dot += p;
          mag += std::abs(p);
        }
        // f32 sum of exact products: |error| <= D eps sum |products| (a loose bound of any order)
        worst = std::max(worst, std::abs(Smax[i * lds + j] - alpha * dot) / (alpha * (mag + 1e-30)));
        ASSERT_EQ(Smax[i * lds + j], Sstore[i * lds + j]) << i << "," << j;
        m = std::max(m, Smax[i * lds + j]);
        const double want_grad = double(alpha) * P[i * lds + j] * (dot - delta[i]);
        worst_grad = std::max(worst_grad, std::abs(G[i * lds + j] - want_grad) / (alpha * (mag + std::abs(delta[i]))));
      }
      EXPECT_EQ(rmax[i], m) << "row " << i;
      for (Index j = c.tk; j < lds; ++j) {
        ASSERT_EQ(Smax[i * lds + j], kSentinel) << "written past tk: " << i << "," << j;
        ASSERT_EQ(G[i * lds + j], kSentinel) << "written past tk: " << i << "," << j;
      }
    }
    for (Index i = c.n; i < out_rows; ++i)
      for (Index j = 0; j < lds; ++j) ASSERT_EQ(Smax[i * lds + j], kSentinel) << "written past n: " << i << "," << j;
    EXPECT_EQ(rmax[c.n], kSentinel) << "row max written past n";
    EXPECT_LE(worst, 2e-6 * std::max<double>(1.0, double(c.D) / 8));
    EXPECT_LE(worst_grad, 4e-6 * std::max<double>(1.0, double(c.D) / 8));
    EXPECT_GT(worst, 0.0) << "an exact match on every score would mean the reference is the code";
  }
}

// grad_rounded (Precision::bf16's dS, rounded as it is formed) against the two steps it replaces:
// the grad epilogue's f32 dS, then pack_rounded_rows with the same lead; bit for bit, both leads,
// every remainder of a block's rows and columns, and nothing written past the zero rows.
TEST(Bf16Dot, RoundedGradIsTheGradEpiloguePackedByRows) {
  REQUIRE_BF16DOT();
  std::mt19937 rng(17);
  for (const Case c : {Case{1, 1, 5, 0, 0}, Case{6, 16, 32, 0, 0}, Case{37, 45, 37, 3, 5}, Case{128, 256, 64, 0, 0},
                       Case{33, 17, 128, 16, 31}, Case{7, 100, 80, 1, 2}, Case{64, 33, 96, 32, 0}}) {
    for (const Index lead : {0, 1}) {
      SCOPED_TRACE(testing::Message() << "n=" << c.n << " tk=" << c.tk << " D=" << c.D << " lead=" << lead);
      const Index rows = c.i0 + c.n, keys = c.k0 + c.tk, Dp = amx::padded_depth(c.D), ldk = amx::packed_keys(keys);
      const std::vector<std::uint16_t> dO = random_bf16(rows * c.D, rng), V = random_bf16(keys * c.D, rng);
      std::vector<std::uint16_t> A((rows + amx::kTileRows) * Dp), B(Dp * ldk);
      amx::pack_rows(dO.data(), rows, c.D, A.data());
      amx::pack_pairs(V.data(), keys, c.D, ldk, B.data());
      const Index ldp = c.tk + 7;
      std::vector<float> P(c.n * ldp), delta(c.n), G(c.n * ldp);
      std::uniform_real_distribution<float> ud(0.f, 1.f);
      for (auto& p : P) p = ud(rng);
      for (auto& d : delta) d = ud(rng) - 0.5f;
      const std::uint16_t* a = A.data() + c.i0 * Dp;
      const std::uint16_t* b = B.data() + 2 * c.k0;
      bf16dot::scores(amx::Epilogue::grad, a, c.n, b, ldk, c.tk, Dp, G.data(), ldp, 0.3f, P.data(), delta.data(),
                      nullptr);
      const Index Kp = amx::padded_depth(lead + c.tk), size = (c.n + amx::kTileRows) * Kp;
      std::vector<std::uint16_t> want(size), got(size + 64, 0xABCD);
      amx::pack_rounded_rows(G.data(), c.n, c.tk, ldp, lead, want.data());
      std::fill(got.begin(), got.begin() + size, 0x7777);  // what a previous piece left
      bf16dot::grad_rounded(a, c.n, b, ldk, c.tk, Dp, 0.3f, P.data(), ldp, delta.data(), lead, got.data());
      for (Index e = 0; e < size; ++e) ASSERT_EQ(got[e], want[e]) << "row " << e / Kp << ", element " << e % Kp;
      for (Index e = size; e < size + 64; ++e) ASSERT_EQ(got[e], 0xABCD) << "written past the zero rows";
    }
  }
}

// The benchmarks' timing of the products (kernel_bench --pieces --dtypes bf16): both products timed,
// the flops of the default tiles, a peak, and zeros where the instruction is not available.
TEST(Bf16Dot, ProductTimesCoverTheDefaultTiles) {
  const Tiling t = simd::default_tiling();
  for (const Index D : {Index(17), Index(64)}) {
    const simd::Bf16ProductTimes b = simd::bf16_product_times(D, 2);
    if (!bf16dot::available()) {
      EXPECT_EQ(b.peak, 0.0);
      EXPECT_EQ(b.score + b.accumulate + b.product_flops, 0.0);
      EXPECT_EQ(simd::bf16_dot_peak(0.01), 0.0);
      continue;
    }
    EXPECT_GT(b.score, 0.0);
    EXPECT_GT(b.accumulate, 0.0);
    EXPECT_GT(b.peak, 0.0);
    EXPECT_EQ(b.product_flops, 2.0 * double(t.q_rows) * double(t.k_cols) * double(D));
  }
}

// O = c O + A B with B as pairs of consecutive rows of X (the layout of the accumulate products:
// rounded P or dS against V, K, dO or Q): the float64 sum to f32 rounding, c null or per row, and
// nothing written past D or past n.
TEST(Bf16Dot, AccumulateMatchesFloat64) {
  REQUIRE_BF16DOT();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  struct Acc {
    Index n, depth, D;
    bool scaled;
  };
  for (const Acc t : {Acc{1, 1, 16, false}, Acc{6, 32, 64, true}, Acc{37, 45, 37, true}, Acc{128, 256, 64, true},
                      Acc{13, 100, 128, false}, Acc{7, 3, 80, true}}) {
    SCOPED_TRACE(testing::Message() << "n=" << t.n << " depth=" << t.depth << " D=" << t.D);
    const Index Kp = amx::padded_depth(t.depth), ldc = (t.D + 15) / 16 * 16 + 16, pairs = Kp / 2;
    const std::vector<std::uint16_t> Araw = random_bf16(t.n * t.depth, rng), X = random_bf16(t.depth * t.D, rng);
    std::vector<std::uint16_t> A(t.n * Kp, 0), B(pairs * 2 * ldc, 0);
    for (Index i = 0; i < t.n; ++i)
      for (Index k = 0; k < t.depth; ++k) A[i * Kp + k] = Araw[i * t.depth + k];
    for (Index kk = 0; kk < pairs; ++kk)
      for (Index d = 0; d < t.D; ++d)
        for (Index u = 0; u < 2; ++u)
          if (2 * kk + u < t.depth) B[kk * 2 * ldc + 2 * d + u] = X[(2 * kk + u) * t.D + d];
    const Index ldo = t.D + 3, rows = t.n + 1;
    const float kSentinel = 12345.f;
    std::vector<float> O(rows * ldo, kSentinel), c(t.n);
    for (Index i = 0; i < t.n; ++i)
      for (Index d = 0; d < t.D; ++d) O[i * ldo + d] = nd(rng);
    for (auto& x : c) x = 0.5f + 0.25f * nd(rng);
    const std::vector<float> O0 = O;
    bf16dot::accumulate(A.data(), t.n, Kp, B.data(), ldc, t.D, O.data(), ldo, t.scaled ? c.data() : nullptr);
    double worst = 0;
    for (Index i = 0; i < t.n; ++i) {
      for (Index d = 0; d < t.D; ++d) {
        double sum = 0, mag = 0;
        for (Index k = 0; k < t.depth; ++k) {
          const double p = value(Araw[i * t.depth + k]) * value(X[k * t.D + d]);
          sum += p;
          mag += std::abs(p);
        }
        const double ci = t.scaled ? c[i] : 1.0;
        const double want = ci * O0[i * ldo + d] + sum;
        worst = std::max(worst, std::abs(O[i * ldo + d] - want) / (mag + std::abs(ci * O0[i * ldo + d]) + 1e-30));
      }
      for (Index d = t.D; d < ldo; ++d) ASSERT_EQ(O[i * ldo + d], kSentinel) << "written past D: " << i << "," << d;
    }
    for (Index d = 0; d < ldo; ++d) ASSERT_EQ(O[t.n * ldo + d], kSentinel) << "written past n";
    EXPECT_LE(worst, 2e-6 * std::max<double>(1.0, double(t.depth) / 8));
    EXPECT_GT(worst, 0.0) << "an exact match everywhere would mean the reference is the code";
  }
}

// One head group's forward and backward of bf16 operands with the dot products and without them
// (the f32 FMA kernels; AMX off for both): the same results up to the order of the sums. (With
// Precision::bf16 an ulp of a score can flip the rounding of its P: that precision is compared on
// inputs whose scores are exact, with the AMX engine's test.)
struct Results {
  std::vector<float> o, lse, dq, dk, dv;
};

Results run_block(bool dot, Precision precision, Index Lq, Index Lk, Index G, Index D, const Mask& mask, float softcap,
                  const Tiling& t, std::mt19937::result_type seed) {
  amx::set_enabled(false);
  bf16dot::set_enabled(dot);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  const Index rows = Lq * G;
  auto fill = [&](Index n) {
    std::vector<bf16> x(n);
    for (auto& v : x) v = to_bf16(nd(rng));
    return x;
  };
  const std::vector<bf16> q = fill(rows * D), k = fill(Lk * D), v = fill(Lk * D), dout = fill(rows * D);
  std::vector<Index> qpos(Lq), kpos(Lk);
  for (Index i = 0; i < Lq; ++i) qpos[i] = Lk - Lq + i;  // the queries are the last positions
  for (Index j = 0; j < Lk; ++j) kpos[j] = j;
  const Packing pq{1, 1, G, Lq, D}, pk{1, 1, 1, Lk, D};
  Workspace<float> ws(resolve_tiling(t, D, std::max(Lq, Lk), G), D, precision);
  const float scale = 1.0f / std::sqrt(float(D));
  Results r;
  std::vector<float> m(rows), l(rows);
  r.o.assign(rows * D, 0.f);
  r.lse.assign(rows, 0.f);
  OnlineState<float> st{m.data(), l.data(), r.o.data()};
  init_online_state(pq, st);
  const QueryShard<bf16> qs{pq, qpos, q.data()};
  const KVBlock<bf16> kvb{pk, kpos, k.data(), v.data()};
  block_forward(qs, kvb, mask, scale, st, ws, {}, softcap);
  finalize_forward(pq, st, r.lse.data());
  std::vector<float> delta(rows);
  compute_delta(pq, dout.data(), r.o.data(), delta.data());
  r.dq.assign(rows * D, 0.f);
  r.dk.assign(Lk * D, 0.f);
  r.dv.assign(Lk * D, 0.f);
  const GradQueryShard<bf16> g{qs, dout.data(), m.data(), l.data(), delta.data(), r.dq.data()};
  block_backward(g, kvb, mask, scale, r.dk.data(), r.dv.data(), ws, {}, softcap);
  return r;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, mag = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(double(a[i]) - double(b[i])));
    mag = std::max(mag, std::abs(double(b[i])));
  }
  return err / std::max(mag, 1e-30);
}

TEST(Bf16Dot, Bf16KernelsAgreeWithAndWithoutDotProducts) {
  REQUIRE_BF16DOT();
  const bool amx_was = amx::enabled(), dot_was = bf16dot::enabled();
  struct Case {
    const char* name;
    Index Lq, Lk, G, D;
    Mask mask;
    float softcap;
    Tiling t;
  };
  const Index S = 300;
  const std::vector<Case> cases = {
      {"full_d64", 200, S, 1, 64, Mask::none(), 0.f, {}},
      {"causal_d37_gqa", 150, S, 2, 37, Mask::make(S, true, 0, {}), 0.f, {}},
      {"causal_softcap_d5_small_tiles", 90, S, 1, 5, Mask::make(S, true, 0, {}), 2.f, {19, 41, 7}},
      {"window_documents_d128", 120, S, 3, 128, Mask::make(S, true, 40, {100, 150, 50}), 0.f, {33, 70, 5}},
  };
  for (const Precision precision : {Precision::f32}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      const Results a = run_block(true, precision, c.Lq, c.Lk, c.G, c.D, c.mask, c.softcap, c.t, 3);
      const Results f = run_block(false, precision, c.Lq, c.Lk, c.G, c.D, c.mask, c.softcap, c.t, 3);
      EXPECT_LE(max_rel(a.o, f.o), 1e-5);
      EXPECT_LE(max_rel(a.lse, f.lse), 1e-5);
      EXPECT_LE(max_rel(a.dq, f.dq), 2e-5);
      EXPECT_LE(max_rel(a.dk, f.dk), 2e-5);
      EXPECT_LE(max_rel(a.dv, f.dv), 2e-5);
      EXPECT_NE(a.o, f.o) << "the two paths gave the same bits: one of them did not run";
    }
  }
  bf16dot::set_enabled(dot_was);
  amx::set_enabled(amx_was);
}

// Every query equal to a key, all of norm 60 (row i to key (7 i + 3) mod L): each softmax is one-hot,
// O is that key's V row, already bf16, and dS is 0, so dQ and dK are exactly 0 on every engine and
// at either precision. delta must then be dP's own sum, in the dot products' order: an f32 chain
// differs from it by up to 1e-6 of |dO||V|, which dQ and dK would carry.
TEST(Bf16Dot, OneHotRowsHaveExactlyZeroGradient) {
  REQUIRE_BF16DOT();
  const bool amx_was = amx::enabled(), dot_was = bf16dot::enabled();
  enum Engine { dot, tiles, fma };
  for (const Engine engine : {dot, tiles, fma})
    for (const Precision precision : {Precision::f32, Precision::bf16})
      for (const Index D : {16, 17, 40, 64, 128}) {
        if (engine == tiles && !amx::available()) continue;  // AMX tiles only where the CPU has them
        SCOPED_TRACE(testing::Message() << (engine == dot ? "dot products" : engine == tiles ? "AMX" : "f32 FMA")
                                        << " D=" << D << (precision == Precision::bf16 ? " precision bf16" : ""));
        bf16dot::set_enabled(engine == dot);
        amx::set_enabled(engine == tiles);
        const Index L = 40;
        auto key_of = [&](Index i) { return (7 * i + 3) % L; };
        std::mt19937 rng(11);
        std::normal_distribution<float> nd;
        std::vector<bf16> q(L * D), k(L * D), v(L * D), dout(L * D);
        for (Index j = 0; j < L; ++j) {  // keys of norm 60: a key's own score leads the others by >> 150 bits
          std::vector<float> x(D);
          float norm = 0;
          for (float& e : x) {
            e = nd(rng);
            norm += e * e;
          }
          for (Index d = 0; d < D; ++d) k[j * D + d] = to_bf16(60 * x[d] / std::sqrt(norm));
        }
        for (Index e = 0; e < L * D; ++e) {
          v[e] = to_bf16(nd(rng));
          dout[e] = to_bf16(nd(rng));
        }
        for (Index i = 0; i < L; ++i)
          for (Index d = 0; d < D; ++d) q[i * D + d] = k[key_of(i) * D + d];
        std::vector<Index> pos(L);
        for (Index i = 0; i < L; ++i) pos[i] = i;
        const Packing pk{1, 1, 1, L, D};
        Workspace<float> ws(resolve_tiling({}, D, L, 1), D, precision);
        const float scale = 1.0f / std::sqrt(float(D));
        std::vector<float> m(L), l(L), o(L * D), lse(L), delta(L), dq(L * D, 0.f), dk(L * D, 0.f), dv(L * D, 0.f);
        OnlineState<float> st{m.data(), l.data(), o.data()};
        init_online_state(pk, st);
        const QueryShard<bf16> qs{pk, pos, q.data()};
        const KVBlock<bf16> kvb{pk, pos, k.data(), v.data()};
        block_forward(qs, kvb, Mask::none(), scale, st, ws, {}, 0.f);
        finalize_forward(pk, st, lse.data());
        for (Index i = 0; i < L; ++i)
          for (Index d = 0; d < D; ++d)
            ASSERT_EQ(o[i * D + d], to_float(v[key_of(i) * D + d])) << "row " << i << " is not one-hot";
        compute_delta(pk, dout.data(), o.data(), delta.data());
        const GradQueryShard<bf16> g{qs, dout.data(), m.data(), l.data(), delta.data(), dq.data()};
        block_backward(g, kvb, Mask::none(), scale, dk.data(), dv.data(), ws, {}, 0.f);
        auto largest = [](const std::vector<float>& x) {
          float w = 0;
          for (float e : x) w = std::max(w, std::abs(e));
          return w;
        };
        EXPECT_EQ(largest(dq), 0.f);
        EXPECT_EQ(largest(dk), 0.f);
        EXPECT_EQ(dv[key_of(5) * D], to_float(dout[5 * D])) << "dV is the dO of the row that sees the key";
      }
  bf16dot::set_enabled(dot_was);
  amx::set_enabled(amx_was);
}

TEST(Bf16Dot, EnvironmentSwitch) {
  EXPECT_EQ(bf16dot::requested(nullptr), -1);
  EXPECT_EQ(bf16dot::requested(""), -1);
  EXPECT_EQ(bf16dot::requested("1"), 1);
  EXPECT_EQ(bf16dot::requested("0"), 0);
  const bool was = bf16dot::enabled();
  bf16dot::set_enabled(false);
  EXPECT_FALSE(bf16dot::enabled());
  bf16dot::set_enabled(true);
  EXPECT_EQ(bf16dot::enabled(), bf16dot::available());
  bf16dot::set_enabled(was);
  std::printf("bf16 dot products (vdpbf16ps or BFDOT) available: %s\n", bf16dot::available() ? "yes" : "no");
}

}  // namespace
