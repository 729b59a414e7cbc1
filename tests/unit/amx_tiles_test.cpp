// The AMX tile products of bf16 operands (src/core/amx_tiles.hpp) against a float64 reference, and
// the bf16 kernels with AMX against the same kernels without it. Skipped where the CPU, the OS or
// the build has no AMX-BF16; on such a machine they must run.
#include "core/amx_tiles.hpp"
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

using namespace ringattn::core;

namespace {

#define REQUIRE_AMX()                                                                     \
  if (!amx::available()) GTEST_SKIP() << "no AMX-BF16 here (CPU, OS grant or build)"

// The engine of the bf16 products for the kernel calls that follow: AMX tiles, the dot products
// (bf16_dot.hpp, which take the same packed operands), or neither (the f32 FMA kernels).
enum class Engine { none, amx, dot };
void use(Engine e) {
  amx::set_enabled(e == Engine::amx);
  bf16dot::set_enabled(e == Engine::dot);
}

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
  use(use_amx ? Engine::amx : Engine::none);
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

// The rounding packers of Precision::bf16, bit for bit against the layout amx_tiles.hpp states: row
// i (or column i of the transposed packer) is `lead` zeros, the values rounded as to_bf16 rounds
// (ties to even, NaN kept, overflow to inf; an f32 denormal may become a zero of its sign), zeros
// to Kp; then kTileRows zero rows; nothing written past them. Every remainder of the 16 x 16 blocks,
// both leads, and ties, NaN, overflow and a denormal among the values. They run with AMX or with
// the dot products, so wherever either does.
TEST(AmxTiles, RoundingPackersMatchTheirLayout) {
  if (!amx::available() && !bf16dot::available()) GTEST_SKIP() << "no AMX-BF16 and no bf16 dot products here";
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  struct Pack {
    Index n, depth;
  };
  for (const Pack c : {Pack{1, 1}, Pack{16, 16}, Pack{17, 31}, Pack{5, 32}, Pack{33, 47}, Pack{256, 128},
                       Pack{40, 64}, Pack{3, 100}}) {
    for (const Index lead : {0, 1}) {
      for (const bool trans : {false, true}) {
        SCOPED_TRACE(testing::Message() << "n=" << c.n << " depth=" << c.depth << " lead=" << lead
                                        << (trans ? " transposed" : ""));
        // X [n, depth] (transposed: [depth, n]) with a stride of its own
        const Index xr = trans ? c.depth : c.n, xc = trans ? c.n : c.depth, ldx = xc + 5;
        std::vector<float> X(xr * ldx);
        for (auto& x : X) x = nd(rng);
        const float special[] = {1.00390625f, 1.01171875f, std::numeric_limits<float>::quiet_NaN(), 3.4e38f,
                                 -1.00390625f, -0.0f, -1e-39f};  // ties down and up, NaN, overflow, a tie, -0, denormal
        for (Index s = 0; s < 7 && s < Index(X.size()); ++s) X[(s * 7919) % X.size()] = special[s];
        const Index Kp = amx::padded_depth(lead + c.depth), size = (c.n + amx::kTileRows) * Kp;
        std::vector<std::uint16_t> A(size + 64, 0xABCD);  // sentinels past the end
        if (trans)
          amx::pack_rounded_cols(X.data(), c.depth, c.n, ldx, lead, A.data());
        else
          amx::pack_rounded_rows(X.data(), c.n, c.depth, ldx, lead, A.data());
        for (Index i = 0; i < c.n + amx::kTileRows; ++i)
          for (Index k = 0; k < Kp; ++k) {
            std::uint16_t want = 0;
            float x = 0;
            if (i < c.n && k >= lead && k < lead + c.depth) {
              const Index d = k - lead;
              x = trans ? X[d * ldx + i] : X[i * ldx + d];
              want = to_bf16(x).bits;
            }
            const bool denormal = x != 0 && std::abs(x) < std::numeric_limits<float>::min();
            if (denormal && A[i * Kp + k] == (std::signbit(x) ? 0x8000 : 0)) continue;
            ASSERT_EQ(A[i * Kp + k], want) << "row " << i << ", element " << k;
          }
        for (Index e = size; e < size + 64; ++e) ASSERT_EQ(A[e], 0xABCD) << "written past the zero rows";
        if (!trans) continue;
        // the transpose of a tile already packed by rows (the backward's dS for dK) is the same
        for (const Index xlead : {0, 1}) {
          SCOPED_TRACE(testing::Message() << "from rows packed with lead " << xlead);
          const Index Kx = amx::padded_depth(xlead + c.n);
          std::vector<std::uint16_t> R((c.depth + amx::kTileRows) * Kx), T(size + 64, 0xABCD);
          amx::pack_rounded_rows(X.data(), c.depth, c.n, ldx, xlead, R.data());
          std::fill(T.begin(), T.begin() + size, 0x7777);  // what a previous piece left
          amx::pack_cols_of_rows(R.data(), c.depth, c.n, Kx, xlead, lead, T.data());
          for (Index e = 0; e < size + 64; ++e) ASSERT_EQ(T[e], A[e]) << "row " << e / Kp << ", element " << e % Kp;
        }
      }
    }
  }
}

// The packers of the bf16 keys (pairs of depth: K for S, V for dP) and of the accumulates' B (pairs
// of rows: V, K, dO, Q), bit for bit against the layout amx_tiles.hpp states, with sentinels where
// a previous tile left values and past the end: even and odd D, every remainder of 16 keys, rows
// and pairs. They run with AMX or with the dot products, so wherever either does.
TEST(AmxTiles, PairPackersMatchTheirLayout) {
  if (!amx::available() && !bf16dot::available()) GTEST_SKIP() << "no AMX-BF16 and no bf16 dot products here";
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> bits(0, 0xFFFF);
  for (const Index D : {1, 5, 16, 32, 37, 64, 80, 128, 130})
    for (const Index n : {1, 2, 15, 16, 17, 33, 100, 256}) {
      SCOPED_TRACE(testing::Message() << "D=" << D << " n=" << n);
      std::vector<std::uint16_t> X(n * D);
      for (auto& x : X) x = static_cast<std::uint16_t>(bits(rng));
      // pairs of depth: B[kk][2 j + t] = X[j][2 kk + t], zero past D and from n to ldk
      const Index Dp = amx::padded_depth(D), ldk = amx::packed_keys(n + 3), size = Dp / 2 * 2 * ldk;
      std::vector<std::uint16_t> B(size + 64, 0x7777);
      std::fill(B.begin() + size, B.end(), 0xABCD);
      amx::pack_pairs(X.data(), n, D, ldk, B.data());
      for (Index kk = 0; kk < Dp / 2; ++kk)
        for (Index j = 0; j < ldk; ++j)
          for (Index t = 0; t < 2; ++t) {
            const Index d = 2 * kk + t;
            const std::uint16_t want = j < n && d < D ? X[j * D + d] : 0;
            ASSERT_EQ(B[kk * 2 * ldk + 2 * j + t], want) << "pairs of depth: pair " << kk << ", key " << j;
          }
      for (Index e = size; e < size + 64; ++e) ASSERT_EQ(B[e], 0xABCD) << "pairs of depth: written past the end";
      // pairs of rows: R[kk][2 d + t] = X[2 kk + t][d], zero past D (to ldc) and past n
      const Index ldc = amx::packed_keys(D), rsize = amx::row_pairs(n) * 2 * ldc;
      std::vector<std::uint16_t> R(rsize + 64, 0x7777);
      std::fill(R.begin() + rsize, R.end(), 0xABCD);
      amx::pack_row_pairs(X.data(), n, D, ldc, R.data());
      for (Index kk = 0; kk < amx::row_pairs(n); ++kk)
        for (Index d = 0; d < ldc; ++d)
          for (Index t = 0; t < 2; ++t) {
            const Index r = 2 * kk + t;
            const std::uint16_t want = r < n && d < D ? X[r * D + d] : 0;
            ASSERT_EQ(R[kk * 2 * ldc + 2 * d + t], want) << "pairs of rows: pair " << kk << ", column " << d;
          }
      for (Index e = rsize; e < rsize + 64; ++e) ASSERT_EQ(R[e], 0xABCD) << "pairs of rows: written past the end";
    }
}

// The accumulate products of Precision::bf16 (amx::accumulate) on random tiles, against float64:
// O = c O + round(X) B with X an f32 tile (or its transpose) rounded to bf16 by the packing, B packed
// as pairs of rows, the depth starting at an even or an odd row of B (lead), every remainder of the
// 16 x 16 result tiles. The products are exact, so the error is the f32 sum's.
TEST(AmxTiles, AccumulateMatchesFloat64OnRandomTiles) {
  REQUIRE_AMX();
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  amx::TileScope scope;
  struct Acc {
    Index n, depth, D, b0;  // output rows, depth, columns, first row of B the depth starts at
    bool trans, rescale;
  };
  const std::vector<Acc> all = {{1, 1, 1, 0, false, false},     {16, 32, 16, 0, false, true},
                                {37, 45, 37, 3, false, true},     {128, 256, 64, 0, false, true},
                                {33, 17, 128, 5, true, false},    {7, 100, 80, 1, true, false},
                                {50, 64, 1, 0, true, false},      {64, 33, 96, 32, false, false},
                                {256, 128, 64, 31, true, false}};
  for (const Acc& c : all) {
    SCOPED_TRACE(testing::Message() << "n=" << c.n << " depth=" << c.depth << " D=" << c.D << " b0=" << c.b0
                                    << (c.trans ? " transposed" : ""));
    // X [n, depth] (transposed: [depth, n]) in f32 with a stride of its own; B's source rows [b0 + depth, D]
    const Index xr = c.trans ? c.depth : c.n, xc = c.trans ? c.n : c.depth, ldx = xc + 3;
    std::vector<float> X(xr * ldx);
    for (auto& x : X) x = nd(rng);
    const Index rows = c.b0 + c.depth, ldc = amx::packed_keys(c.D);
    const std::vector<std::uint16_t> Y = random_bf16(rows * c.D, rng);
    std::vector<std::uint16_t> B(amx::row_pairs(rows) * 2 * ldc, 0xFFFF);  // NaN bits: must be overwritten
    amx::pack_row_pairs(Y.data(), rows, c.D, ldc, B.data());
    const Index lead = c.b0 & 1, Kp = amx::padded_depth(lead + c.depth);
    std::vector<std::uint16_t> A((c.n + amx::kTileRows) * Kp, 0xFFFF);
    if (c.trans)
      amx::pack_rounded_cols(X.data(), c.depth, c.n, ldx, lead, A.data());
    else
      amx::pack_rounded_rows(X.data(), c.n, c.depth, ldx, lead, A.data());
    const Index ldo = c.D + 5;
    std::vector<float> O(c.n * ldo), O0, scale(c.n);
    for (auto& o : O) o = nd(rng);
    for (auto& x : scale) x = 0.5f + 0.5f * std::abs(nd(rng));
    O0 = O;
    amx::accumulate(A.data(), c.n, Kp, B.data() + (c.b0 - lead) * ldc, ldc, c.D, O.data(), ldo,
                    c.rescale ? scale.data() : nullptr);
    double worst = 0;
    for (Index i = 0; i < c.n; ++i) {
      for (Index d = 0; d < c.D; ++d) {
        double sum = 0, mag = 0;
        for (Index k = 0; k < c.depth; ++k) {
          const float x = c.trans ? X[k * ldx + i] : X[i * ldx + k];
          const double p = double(to_float(to_bf16(x))) * value(Y[(c.b0 + k) * c.D + d]);
          sum += p;
          mag += std::abs(p);
        }
        const double o0 = O0[i * ldo + d], want = (c.rescale ? scale[i] : 1.0) * o0 + sum;
        // f32 sum of exact products and one FMA: |error| <= depth eps (sum |products| + |c O|)
        worst = std::max(worst, std::abs(O[i * ldo + d] - want) / (mag + std::abs(o0) + 1e-30));
      }
      for (Index d = c.D; d < ldo; ++d)
        ASSERT_EQ(O[i * ldo + d], O0[i * ldo + d]) << "written past D: " << i << "," << d;
    }
    EXPECT_LE(worst, 1e-6 * std::max<double>(1.0, double(c.depth) / 8));
  }
}

// Precision::bf16 with AMX or the dot products (all four accumulate products and the score products
// on them; each engine where the machine has it) against
// the same kernels without it, on inputs whose every product before the rounding is exact in f32 in
// any order: multiples of 1/8 below 3 in magnitude (a dot product of up to 128 is a multiple of 2^-6
// below 2^11, 17 bits), and a scale whose log2 e multiple (the kernels fold log2 e into it) is a
// power of two. The scores, hence P, and dP are then the same bits on both paths, so the bf16
// rounding meets the same values, and the results differ only by the order of the f32 sums of P V,
// P^T dO, dS K and dS^T Q. The backward runs from one forward state (the one without AMX), so that
// delta (and dS) is the same bits too. Random inputs instead would let an ulp of difference in a
// score flip the rounding of its P by 2^-8 now and then, which no tight tolerance covers.
// With such V and dO, though, the sums of P V and P^T dO come out exact in any order as well, and
// the two paths would agree bit for bit whether AMX ran or not: O and dV, which do not depend on dP,
// are compared on a second draw of V and dO as plain random bf16 (rich), whose sums round.
struct Exact {
  std::vector<bf16> q, k, v, dout;
  std::vector<Index> qpos, kpos;
  float scale = 0;
};

Exact exact_operands(Index Lq, Index Lk, Index G, Index D, bool rich_v_dout, std::mt19937::result_type seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  auto fill = [&](Index n, bool rich) {
    std::vector<bf16> x(n);
    for (auto& v : x) v = to_bf16(rich ? nd(rng) : std::clamp(std::round(8.f * nd(rng)), -23.f, 23.f) / 8.f);
    return x;
  };
  Exact e;
  e.q = fill(Lq * G * D, false);
  e.k = fill(Lk * D, false);
  e.v = fill(Lk * D, rich_v_dout);
  e.dout = fill(Lq * G * D, rich_v_dout);
  e.qpos.resize(Lq);
  e.kpos.resize(Lk);
  for (Index i = 0; i < Lq; ++i) e.qpos[i] = Lk - Lq + i;
  for (Index j = 0; j < Lk; ++j) e.kpos[j] = j;
  // alpha = scale log2 e as the kernels round it: the power of two nearest 1 / sqrt(D) log2 e
  constexpr double kLog2e = 1.4426950408889634;
  const float alpha = std::exp2(std::round(std::log2(kLog2e / std::sqrt(double(D)))));
  for (float s = float(alpha / kLog2e), step = 0; step < 8; ++step) {
    if (static_cast<float>(double(s) * kLog2e) == alpha) {
      e.scale = s;
      break;
    }
    s = std::nextafter(s, step < 4 ? 1.f : 0.f);
  }
  return e;
}

TEST(AmxTiles, Bf16PrecisionKernelsAgreeWithAndWithoutAmxOrDotProducts) {
  std::vector<Engine> engines;
  if (amx::available()) engines.push_back(Engine::amx);
  if (bf16dot::available()) engines.push_back(Engine::dot);
  if (engines.empty()) GTEST_SKIP() << "neither AMX-BF16 nor bf16 dot products here";
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
      {"window_documents_d128_odd_strips", 120, S, 3, 128, Mask::make(S, true, 40, {100, 150, 50}), 0.f, {33, 70, 5}},
      {"causal_d80_default_strips", 256, S, 1, 80, Mask::make(S, true, 0, {}), 0.f, {}},
  };
  for (const Engine engine : engines) {
    // whether the engine's bits differed from the FMA kernels' in some case (small sums of such exact
    // operands can come out exact in any order, so one case alone may agree bit for bit)
    bool moved_o = false, moved_dv = false, moved_dq = false, moved_dk = false;
    for (const Case& c : cases)
      for (const bool rich : {false, true}) {
        const char* name = engine == Engine::amx ? "AMX" : "dot products";
        SCOPED_TRACE(std::string(name) + ", " + c.name +
                     (rich ? ", rich V and dO: O and dV" : ", exact V and dO: dQ and dK"));
        const Exact e = exact_operands(c.Lq, c.Lk, c.G, c.D, rich, 5);
        ASSERT_GT(e.scale, 0.f) << "no scale with a power-of-two alpha";
        const Index rows = c.Lq * c.G, D = c.D;
        const Packing pq{1, 1, c.G, c.Lq, D}, pk{1, 1, 1, c.Lk, D};
        Workspace<float> ws(resolve_tiling(c.t, D, std::max(c.Lq, c.Lk), c.G), D, Precision::bf16);
        const QueryShard<bf16> qs{pq, e.qpos, e.q.data()};
        const KVBlock<bf16> kvb{pk, e.kpos, e.k.data(), e.v.data()};
        struct Fwd {
          std::vector<float> m, l, o, lse;
        };
        auto forward = [&](bool use_amx) {
          use(use_amx ? engine : Engine::none);
          Fwd f{std::vector<float>(rows), std::vector<float>(rows), std::vector<float>(rows * D),
                std::vector<float>(rows)};
          OnlineState<float> st{f.m.data(), f.l.data(), f.o.data()};
          init_online_state(pq, st);
          block_forward(qs, kvb, c.mask, e.scale, st, ws, {}, c.softcap);
          finalize_forward(pq, st, f.lse.data());
          return f;
        };
        const Fwd fa = forward(true), ff = forward(false);
        EXPECT_EQ(fa.m, ff.m) << "the scores differ: the inputs are not exact";
        EXPECT_EQ(fa.l, ff.l);
        if (rich) {
          EXPECT_LE(max_rel(fa.o, ff.o), 1e-5);
          moved_o |= fa.o != ff.o;
        }
        std::vector<float> delta(rows);
        compute_delta(pq, e.dout.data(), ff.o.data(), delta.data());
        auto backward = [&](bool use_amx) {
          use(use_amx ? engine : Engine::none);
          Results r;
          r.dq.assign(rows * D, 0.f);
          r.dk.assign(c.Lk * D, 0.f);
          r.dv.assign(c.Lk * D, 0.f);
          const GradQueryShard<bf16> g{qs, e.dout.data(), ff.m.data(), ff.l.data(), delta.data(), r.dq.data()};
          block_backward(g, kvb, c.mask, e.scale, r.dk.data(), r.dv.data(), ws, {}, c.softcap);
          return r;
        };
        const Results ba = backward(true), bf = backward(false);
        if (rich) {
          EXPECT_LE(max_rel(ba.dv, bf.dv), 1e-5);
          moved_dv |= ba.dv != bf.dv;
          std::printf("%s: %s against FMA, o %.2g dv %.2g of max |FMA|\n", c.name, name, max_rel(fa.o, ff.o),
                      max_rel(ba.dv, bf.dv));
        } else {
          EXPECT_LE(max_rel(ba.dq, bf.dq), 1e-5);
          EXPECT_LE(max_rel(ba.dk, bf.dk), 1e-5);
          moved_dq |= ba.dq != bf.dq;
          moved_dk |= ba.dk != bf.dk;
          std::printf("%s: %s against FMA, dq %.2g dk %.2g of max |FMA|\n", c.name, name, max_rel(ba.dq, bf.dq),
                      max_rel(ba.dk, bf.dk));
        }
      }
    EXPECT_TRUE(moved_o && moved_dv && moved_dq && moved_dk)
        << "the two paths gave the same bits in every case: one of them did not run";
  }
  amx::set_enabled(amx_was);
  bf16dot::set_enabled(dot_was);
}

}  // namespace
