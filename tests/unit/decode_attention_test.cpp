// The decode kernel against the dense float64 reference, without MPI: the last T rows of causal
// attention over S positions, the keys split over blocks as the sharded cache splits them, on
// every SIMD target this CPU runs.
#include "ringattn/core/decode_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ringattn/core/reference.hpp"
#include "ringattn/core/simd.hpp"
#include "test_targets.hpp"

using namespace ringattn::core;

namespace {

using ringattn::test::on_every_target;

struct Case {
  Index B = 1, S = 200, H = 4, HKV = 2, D = 37, T = 1, window = 0;
  int blocks = 3;  // keys dealt round-robin in runs of 50 positions over this many blocks
};

// Global tensors rounded through the storage type S, as double.
template <class S>
std::vector<double> random_tensor(std::mt19937_64& gen, Index n) {
  std::normal_distribution<double> nd;
  std::vector<double> x(n);
  for (double& e : x) e = value_cast<double>(value_cast<S>(nd(gen)));
  return x;
}

// Packed [B, HKV, L, G, D] of positions `pos` of a global [B, S, heads, D] tensor, as S.
template <class S>
std::vector<S> packed(const std::vector<double>& g, Index B, Index Sall, Index heads, Index HKV, Index D,
                      const std::vector<Index>& pos) {
  const Index L = Index(pos.size()), G = heads / HKV;
  std::vector<S> file(B * L * heads * D), out(file.size());
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < L; ++i)
      for (Index e = 0; e < heads * D; ++e)
        file[(b * L + i) * heads * D + e] = value_cast<S>(g[(b * Sall + pos[i]) * heads * D + e]);
  pack_heads(Packing{B, HKV, G, L, D}, file.data(), out.data());
  return out;
}

// The decode rows (o [B, T, H, D] and lse [B, H, T]) from decode_forward over the blocks, and their
// max relative errors against the reference's last T rows.
template <class S>
std::pair<double, double> decode_error(const Case& c, std::uint64_t seed = 1) {
  using A = accum_t<S>;
  std::mt19937_64 gen(seed);
  const Index B = c.B, Sall = c.S, H = c.H, HKV = c.HKV, D = c.D, T = c.T, G = H / HKV;
  const auto q = random_tensor<S>(gen, B * Sall * H * D), k = random_tensor<S>(gen, B * Sall * HKV * D),
             v = random_tensor<S>(gen, B * Sall * HKV * D);
  const Shape s{B, Sall, H, HKV, D};
  const Mask mask = Mask::make(Sall, true, c.window, {});
  const double scale = 1.0 / std::sqrt(double(D));
  const DenseResult ref = reference_attention(s, mask, scale, q, k, v, std::vector<double>(q.size(), 0.0), false);

  std::vector<Index> qpos(T);
  for (Index t = 0; t < T; ++t) qpos[t] = Sall - T + t;
  const Packing pq{B, HKV, G, T, D};
  const auto qp = packed<S>(q, B, Sall, H, HKV, D, qpos);
  std::vector<A> m(pq.row_elems()), l(pq.row_elems()), acc(pq.q_elems()), lse(pq.row_elems());
  const OnlineState<A> st{m.data(), l.data(), acc.data()};
  init_online_state(pq, st);
  DecodeWorkspace<A> ws(T * G, D);
  for (int blk = 0; blk < c.blocks; ++blk) {
    std::vector<Index> kpos;
    for (Index p = 0; p < Sall; ++p)
      if ((p / 50) % c.blocks == blk) kpos.push_back(p);
    if (kpos.empty()) continue;
    const Packing pk{B, HKV, 1, Index(kpos.size()), D};
    const auto kp = packed<S>(k, B, Sall, HKV, HKV, D, kpos), vp = packed<S>(v, B, Sall, HKV, HKV, D, kpos);
    decode_forward(QueryShard<S>{pq, qpos, qp.data()}, KVBlock<S>{pk, kpos, kp.data(), vp.data()}, mask,
                   static_cast<A>(scale), st, ws);
  }
  finalize_forward(pq, st, lse.data());
  std::vector<A> o_file(pq.q_elems());
  unpack_heads(pq, acc.data(), o_file.data());
  std::vector<double> o(o_file.begin(), o_file.end()), o_ref(o.size()), lse_got(B * H * T), lse_ref(B * H * T);
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < T; ++t)
      for (Index e = 0; e < H * D; ++e) o_ref[(b * T + t) * H * D + e] = ref.o[(b * Sall + Sall - T + t) * H * D + e];
  for (Index b = 0; b < B; ++b)
    for (Index g = 0; g < HKV; ++g)
      for (Index t = 0; t < T; ++t)
        for (Index j = 0; j < G; ++j) {
          const Index h = g * G + j;
          lse_got[(b * H + h) * T + t] = lse[pq.row_group(b, g) + t * G + j];
          lse_ref[(b * H + h) * T + t] = ref.lse[(b * H + h) * Sall + Sall - T + t];
        }
  return {max_rel_error(o, o_ref), max_rel_error(lse_got, lse_ref, 1.0)};
}

template <class S>
void expect_cases(double tol) {
  // GQA (G = 2 and 4), T = 1 and T = 4 (causal among the new tokens), a window, odd D and D = 128,
  // and B = 2; the keys of three blocks in runs, so chunks are whole, partial and empty.
  const Case cases[] = {
      {1, 200, 4, 2, 37, 1, 0, 3},  {1, 200, 4, 2, 37, 4, 0, 3},   {2, 150, 8, 2, 128, 4, 0, 2},
      {1, 300, 4, 1, 16, 4, 70, 3}, {1, 130, 2, 2, 128, 1, 40, 1}, {1, 97, 6, 3, 5, 3, 0, 4},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " S=" << c.S << " H=" << c.H << " HKV=" << c.HKV
                                      << " D=" << c.D << " T=" << c.T << " W=" << c.window);
    const auto [eo, el] = decode_error<S>(c);
    EXPECT_LE(eo, tol);
    EXPECT_LE(el, tol);
  }
}

}  // namespace

// f64 to rounding; f32 (and 16-bit storage, computed in f32) to the f32 accumulation over a few
// hundred keys; the inputs are the same rounded values the reference sees.
TEST(DecodeAttention, MatchesDenseReferenceFloat64) {
  on_every_target([] { expect_cases<double>(1e-12); });
}
TEST(DecodeAttention, MatchesDenseReferenceFloat32) {
  on_every_target([] { expect_cases<float>(2e-5); });
}
TEST(DecodeAttention, MatchesDenseReferenceBf16AndF16Storage) {
  on_every_target([] {
    expect_cases<bf16>(2e-5);
    expect_cases<f16>(2e-5);
  });
}

// The test can fail: a wrong scale moves the decode rows far past the tolerance.
TEST(DecodeAttention, AWrongAnswerIsCaught) {
  using A = double;
  const Index D = 8, Lk = 40;
  std::mt19937_64 gen(3);
  std::normal_distribution<double> nd;
  std::vector<double> q(D), k(Lk * D), v(Lk * D);
  for (auto* t : {&q, &k, &v})
    for (double& e : *t) e = nd(gen);
  std::vector<Index> kpos(Lk), qpos{Lk - 1};
  for (Index j = 0; j < Lk; ++j) kpos[j] = j;
  auto run = [&](double scale) {
    const Packing pq{1, 1, 1, 1, D}, pk{1, 1, 1, Lk, D};
    std::vector<A> m(1), l(1), acc(D), lse(1);
    const OnlineState<A> st{m.data(), l.data(), acc.data()};
    init_online_state(pq, st);
    DecodeWorkspace<A> ws(1, D);
    decode_forward(QueryShard<double>{pq, qpos, q.data()}, KVBlock<double>{pk, kpos, k.data(), v.data()},
                   Mask::make(Lk, true, 0, {}), scale, st, ws);
    finalize_forward(pq, st, lse.data());
    return std::vector<double>(acc.begin(), acc.end());
  };
  const Shape s{1, Lk, 1, 1, D};
  std::vector<double> qall(Lk * D, 0.0);
  std::copy(q.begin(), q.end(), qall.begin() + (Lk - 1) * D);
  const DenseResult ref = reference_attention(s, Mask::make(Lk, true, 0, {}), 1.0 / std::sqrt(double(D)), qall, k,
                                              v, std::vector<double>(qall.size(), 0.0), false);
  const std::vector<double> last(ref.o.end() - D, ref.o.end());
  EXPECT_LE(max_rel_error(run(1.0 / std::sqrt(double(D))), last), 1e-12);
  EXPECT_GT(max_rel_error(run(2.0 / std::sqrt(double(D))), last), 1e-3);
}

// A block no query sees (all its keys in the future, or all before the window) leaves the state
// as it was: m = -inf, l = 0, a = 0; a rank holding such a block contributes nothing to the merge.
TEST(DecodeAttention, EmptyVisibleRangeLeavesTheStateUntouched) {
  on_every_target([] {
    using A = float;
    const Index D = 16, T = 4, G = 2, Lk = 100;
    std::vector<float> q(T * G * D, 1.0f), k(Lk * D, 0.5f), v(Lk * D, 2.0f);
    std::vector<Index> qpos{500, 501, 502, 503}, future(Lk), before(Lk);
    for (Index j = 0; j < Lk; ++j) {
      future[j] = 600 + j;
      before[j] = j;  // 0..99, all out of a window of 300 for queries at 500..503
    }
    const Packing pq{1, 1, G, T, D}, pk{1, 1, 1, Lk, D};
    std::vector<A> m(T * G), l(T * G), acc(T * G * D);
    const OnlineState<A> st{m.data(), l.data(), acc.data()};
    init_online_state(pq, st);
    DecodeWorkspace<A> ws(T * G, D);
    const QueryShard<float> qs{pq, qpos, q.data()};
    Work w = decode_forward(qs, KVBlock<float>{pk, future, k.data(), v.data()}, Mask::make(1, true, 0, {}), 1.0f,
                            st, ws);
    w += decode_forward(qs, KVBlock<float>{pk, before, k.data(), v.data()}, Mask::make(1, true, 300, {}), 1.0f, st,
                        ws);
    EXPECT_EQ(w.tile_pairs, 0);
    EXPECT_EQ(w.flops, 0.0);
    for (Index i = 0; i < T * G; ++i) {
      EXPECT_EQ(m[i], -std::numeric_limits<A>::infinity());
      EXPECT_EQ(l[i], 0.0f);
    }
    for (A x : acc) EXPECT_EQ(x, 0.0f);
  });
}

// A NaN in the V row of a key only the last of T = 2 queries sees reaches that query only (the
// first query's probability for it is 0, and 0 * NaN must not be summed), as in torch.
TEST(DecodeAttention, NonFiniteValueReachesOnlyTheRowsThatSeeIt) {
  on_every_target([] {
    using A = float;
    const Index D = 16, T = 2, Lk = 70;
    std::vector<float> q(T * D, 0.1f), k(Lk * D, 0.3f), v(Lk * D, 1.0f);
    std::vector<Index> qpos{68, 69}, kpos(Lk);
    for (Index j = 0; j < Lk; ++j) kpos[j] = j;
    v[69 * D + 3] = std::numeric_limits<float>::quiet_NaN();
    const Packing pq{1, 1, 1, T, D}, pk{1, 1, 1, Lk, D};
    std::vector<A> m(T), l(T), acc(T * D), lse(T);
    const OnlineState<A> st{m.data(), l.data(), acc.data()};
    init_online_state(pq, st);
    DecodeWorkspace<A> ws(T, D);
    decode_forward(QueryShard<float>{pq, qpos, q.data()}, KVBlock<float>{pk, kpos, k.data(), v.data()},
                   Mask::make(1, true, 0, {}), 0.25f, st, ws);
    finalize_forward(pq, st, lse.data());
    for (Index e = 0; e < D; ++e) EXPECT_FLOAT_EQ(acc[e], 1.0f) << "row 0 sees no NaN";
    EXPECT_TRUE(std::isnan(acc[D + 3]));
    EXPECT_FLOAT_EQ(acc[D + 2], 1.0f);
  });
}
