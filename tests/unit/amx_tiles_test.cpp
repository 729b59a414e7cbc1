// The AMX tile products of bf16 operands (src/core/amx_tiles.hpp) against a float64 reference, and
// the bf16 kernels with AMX against the same kernels without it. Skipped where the CPU, the OS or
// the build has no AMX-BF16; on such a machine they must run.
#include "core/amx_tiles.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/half.hpp"

using namespace ringattn::core;

namespace {

#define REQUIRE_AMX()                                                                     \
  if (!amx::available()) GTEST_SKIP() << "no AMX-BF16 here (CPU, OS grant or build)"

// n x D random bf16 values, about N(0, 1), as bits.
std::vector<std::uint16_t> random_bf16(Index n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<std::uint16_t> x(n);
  for (auto& b : x) b = to_bf16(nd(rng)).bits;
  return x;
}

double value(std::uint16_t b) { return double(to_float(bf16{b})); }

struct Shape3 {
  Index n, tk, D, i0, k0;  // rows and keys of the product, head dim, row and key offset into the packed operands
};

// Every epilogue of amx::scores on random tiles: the scores are alpha times the float64 dot
// product to f32 rounding of the sum (the products are exact); max and store give the same bits,
// the row max is the max of the stored row, and nothing is written past tk.
TEST(AmxTiles, ScoresMatchFloat64OnRandomBf16Tiles) {
  REQUIRE_AMX();
  std::mt19937 rng(7);
  amx::TileScope scope;
  for (const Shape3 c : {Shape3{1, 1, 5, 0, 0}, Shape3{16, 16, 32, 0, 0}, Shape3{37, 45, 37, 3, 5},
                         Shape3{128, 256, 64, 0, 0}, Shape3{33, 17, 128, 16, 31}, Shape3{7, 100, 80, 1, 2},
                         Shape3{50, 64, 1, 0, 0}, Shape3{64, 33, 96, 32, 0}}) {
    SCOPED_TRACE(testing::Message() << "n=" << c.n << " tk=" << c.tk << " D=" << c.D);
    const Index rows = c.i0 + c.n, keys = c.k0 + c.tk, Dp = amx::padded_depth(c.D), ldk = amx::packed_keys(keys);
    const std::vector<std::uint16_t> Q = random_bf16(rows * c.D, rng), K = random_bf16(keys * c.D, rng);
    std::vector<std::uint16_t> A((rows + amx::kTileRows) * Dp, 0xFFFF), B(Dp * ldk, 0xFFFF);  // NaN bits: must be overwritten
    amx::pack_rows(Q.data(), rows, c.D, A.data());
    amx::pack_pairs(K.data(), keys, c.D, ldk, B.data());
    const float alpha = 0.3f;
    const Index lds = c.tk + 16;
    const float kSentinel = 12345.f;
    std::vector<float> Smax(c.n * lds, kSentinel), Sstore(c.n * lds, kSentinel), rmax(c.n, 0.f);
    amx::scores(amx::Epilogue::max, A.data() + c.i0 * Dp, c.n, B.data() + 2 * c.k0, ldk, c.tk, Dp, Smax.data(), lds,
                alpha, nullptr, nullptr, rmax.data());
    amx::scores(amx::Epilogue::store, A.data() + c.i0 * Dp, c.n, B.data() + 2 * c.k0, ldk, c.tk, Dp, Sstore.data(),
                lds, alpha, nullptr, nullptr, nullptr);
    // dS = alpha P o (C - delta) for a P and delta of its own
    std::vector<float> P(c.n * lds), delta(c.n), G(c.n * lds, kSentinel);
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    for (auto& p : P) p = ud(rng);
    for (auto& d : delta) d = ud(rng) - 0.5f;
    amx::scores(amx::Epilogue::grad, A.data() + c.i0 * Dp, c.n, B.data() + 2 * c.k0, ldk, c.tk, Dp, G.data(), lds,
                alpha, P.data(), delta.data(), nullptr);
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
        const double s = Smax[i * lds + j];
        // f32 sum of exact products: |error| <= D eps sum |products| (a loose bound of any order)
        worst = std::max(worst, std::abs(s - alpha * dot) / (alpha * (mag + 1e-30)));
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
    EXPECT_LE(worst, 2e-6 * std::max<double>(1.0, double(c.D) / 8));
    EXPECT_LE(worst_grad, 4e-6 * std::max<double>(1.0, double(c.D) / 8));
    EXPECT_GT(worst, 0.0) << "an exact match on every score would mean the reference is the code";
  }
}

TEST(AmxTiles, EnvironmentSwitch) {
  EXPECT_TRUE(amx::requested(nullptr));
  EXPECT_TRUE(amx::requested("1"));
  EXPECT_TRUE(amx::requested(""));
  EXPECT_FALSE(amx::requested("0"));
  const bool was = amx::enabled();
  amx::set_enabled(false);
  EXPECT_FALSE(amx::enabled());
  EXPECT_FALSE(amx_bf16_active());
  amx::set_enabled(true);
  EXPECT_EQ(amx::enabled(), amx::available());
  amx::set_enabled(was);
  std::printf("AMX-BF16 available: %s\n", amx::available() ? "yes" : "no");
}

// One head group's forward and backward of bf16 operands with AMX and without (the f32 FMA
// kernels): the same results up to the order of the score sums and where the scale is applied.
struct Results {
  std::vector<float> o, lse, dq, dk, dv;
};

Results run_block(bool use_amx, Index Lq, Index Lk, Index G, Index D, const Mask& mask, float softcap, const Tiling& t,
              std::mt19937::result_type seed) {
  amx::set_enabled(use_amx);
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
  Workspace<float> ws(resolve_tiling(t, D, std::max(Lq, Lk), G), D);
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
    if (std::isinf(a[i]) && a[i] == b[i]) continue;
    err = std::max(err, std::abs(double(a[i]) - double(b[i])));
    mag = std::max(mag, std::abs(double(b[i])));
  }
  return err / std::max(mag, 1e-30);
}

TEST(AmxTiles, Bf16KernelsAgreeWithAndWithoutAmx) {
  REQUIRE_AMX();
  const bool was = amx::enabled();
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
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Results a = run_block(true, c.Lq, c.Lk, c.G, c.D, c.mask, c.softcap, c.t, 3);
    const Results f = run_block(false, c.Lq, c.Lk, c.G, c.D, c.mask, c.softcap, c.t, 3);
    EXPECT_LE(max_rel(a.o, f.o), 1e-5);
    EXPECT_LE(max_rel(a.lse, f.lse), 1e-5);
    EXPECT_LE(max_rel(a.dq, f.dq), 2e-5);
    EXPECT_LE(max_rel(a.dk, f.dk), 2e-5);
    EXPECT_LE(max_rel(a.dv, f.dv), 2e-5);
    EXPECT_NE(a.o, f.o) << "the two paths gave the same bits: one of them did not run";
  }
  amx::set_enabled(was);
}

}  // namespace
