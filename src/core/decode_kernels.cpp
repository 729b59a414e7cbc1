// The decode kernel (decode_attention.hpp), written once against Highway and compiled for every
// SIMD target the build has, as block_kernels.cpp is; the same dispatch (and RINGATTN_SIMD) picks
// the target.
//
// For one head group (b, g) with R = T G query rows, B, HKV groups in all, keys in chunks of
// C = kDecodeChunk:
//   pass 1: S[R, C] = Q' K^T, key by key: two K rows at a time against four query rows, eight FMA
//           chains over D, each summed across lanes once (on x86 the eight sums together);
//   pass 2: the online softmax of the chunk (exp_tile, as the block kernels do);
//   pass 3: a = c a + P V, four rows and two vectors of D at a time, one V row load for four FMAs.
// K and V rows come from memory once each and are reread from L1 only. Vectors are named
// variables, never arrays: the same lines serve 4, 8, 16 lanes or SVE's scalable length.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/decode_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "core/kernel_math-inl.hpp"  // 2^x, the softmax of a tile, operand copies
#include "ringattn/core/decode_attention.hpp"

HWY_BEFORE_NAMESPACE();
namespace ringattn::core::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A vector of stored values as A (bf16 and f16 widen exactly to float).
template <class D, class S>
HWY_INLINE hn::Vec<D> load_as(D d, const S* p) {
  if constexpr (std::is_same_v<S, bf16>) {
    const hn::Rebind<hwy::bfloat16_t, D> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::bfloat16_t*>(p)));
  } else if constexpr (std::is_same_v<S, f16>) {
    const hn::Rebind<hwy::float16_t, D> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
  } else {
    return hn::LoadU(d, p);
  }
}

#undef RINGATTN_DECODE_BLOCK_SUMS
#if HWY_ARCH_X86 && HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR
#define RINGATTN_DECODE_BLOCK_SUMS 1
// Four f32 vectors' lanes summed within each 128-bit block (x86 interleaves within blocks): lane i
// of every block holds that block's part of the sum of the i-th of x, y, z, w.
template <class D, class V>
HWY_INLINE V block_sums4(D d, V x, V y, V z, V w) {
  const hn::Repartition<double, D> dd;
  const auto t0 = hn::BitCast(dd, hn::Add(hn::InterleaveLower(d, x, y), hn::InterleaveUpper(d, x, y)));
  const auto t1 = hn::BitCast(dd, hn::Add(hn::InterleaveLower(d, z, w), hn::InterleaveUpper(d, z, w)));
  return hn::Add(hn::BitCast(d, hn::InterleaveLower(dd, t0, t1)), hn::BitCast(d, hn::InterleaveUpper(dd, t0, t1)));
}
// The 128-bit blocks of v added lane by lane.
template <class D, class V>
HWY_INLINE auto fold_blocks(D d, V v) {
  if constexpr (hn::MaxLanes(d) * sizeof(hn::TFromD<D>) > 16) {
    const hn::Half<D> dh;
    return fold_blocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    return v;
  }
}
#else
#define RINGATTN_DECODE_BLOCK_SUMS 0
#endif

// pass 1 for rows r < NR (query rows qs, stride D) and the keys ka, kb:
//   s[r, 0] = q_r . ka,  s[r, 1] = q_r . kb   (s row stride ld)
template <int NR, class A, class S>
HWY_INLINE void score_pair(const A* qs, Index D, const S* ka, const S* kb, A* s, Index ld) {
  const Tag<A> d;
  using V = hn::Vec<decltype(d)>;
  const Index N = static_cast<Index>(hn::Lanes(d));
  V a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  Index e = 0;
  for (; e + N <= D; e += N) {
    const V x = load_as(d, ka + e), y = load_as(d, kb + e);
    const V q0 = hn::LoadU(d, qs + e);
    a0 = hn::MulAdd(q0, x, a0);
    b0 = hn::MulAdd(q0, y, b0);
    if constexpr (NR > 1) {
      const V q1 = hn::LoadU(d, qs + D + e);
      a1 = hn::MulAdd(q1, x, a1);
      b1 = hn::MulAdd(q1, y, b1);
    }
    if constexpr (NR > 2) {
      const V q2 = hn::LoadU(d, qs + 2 * D + e);
      a2 = hn::MulAdd(q2, x, a2);
      b2 = hn::MulAdd(q2, y, b2);
    }
    if constexpr (NR > 3) {
      const V q3 = hn::LoadU(d, qs + 3 * D + e);
      a3 = hn::MulAdd(q3, x, a3);
      b3 = hn::MulAdd(q3, y, b3);
    }
  }
#if RINGATTN_DECODE_BLOCK_SUMS
  // The eight sums together, stored in pairs (s[r, 0..1]): about 12 shuffles and adds in all
  // against about 8 per sum apiece, which made the kernel 5-13% faster on keys in L2. Without a
  // tail of D only (the tail adds to the sums one by one below).
  if constexpr (std::is_same_v<A, float>) {
    if (e == D) {
      const hn::Full64<float> d2;
      const auto s01 = fold_blocks(d, block_sums4(d, a0, b0, a1, b1));  // [a0, b0, a1, b1]
      hn::StoreU(hn::LowerHalf(d2, s01), d2, s);
      if constexpr (NR > 1) hn::StoreU(hn::UpperHalf(d2, s01), d2, s + ld);
      if constexpr (NR > 2) {
        const auto s23 = fold_blocks(d, block_sums4(d, a2, b2, a3, b3));
        hn::StoreU(hn::LowerHalf(d2, s23), d2, s + 2 * ld);
        if constexpr (NR > 3) hn::StoreU(hn::UpperHalf(d2, s23), d2, s + 3 * ld);
      }
      return;
    }
  }
#endif
  auto sum = [&](V v) { return hn::GetLane(hn::SumOfLanes(d, v)); };
  A sa[4] = {sum(a0), A(0), A(0), A(0)}, sb[4] = {sum(b0), A(0), A(0), A(0)};
  if constexpr (NR > 1) sa[1] = sum(a1), sb[1] = sum(b1);
  if constexpr (NR > 2) sa[2] = sum(a2), sb[2] = sum(b2);
  if constexpr (NR > 3) sa[3] = sum(a3), sb[3] = sum(b3);
  for (; e < D; ++e)  // the tail of D
    for (int r = 0; r < NR; ++r) {
      sa[r] = std::fma(qs[r * D + e], widen<A>(ka[e]), sa[r]);
      sb[r] = std::fma(qs[r * D + e], widen<A>(kb[e]), sb[r]);
    }
  for (int r = 0; r < NR; ++r) {
    s[r * ld] = sa[r];
    s[r * ld + 1] = sb[r];
  }
}

// The cache lines of rows [j, j + n) of a [*, D] operand, asked for ahead of their use.
template <class S>
HWY_INLINE void prefetch_rows(const S* x, Index j, Index n, Index D) {
  if (x == nullptr) return;
  const char* p = reinterpret_cast<const char*>(x + j * D);
  const Index bytes = n * D * Index(sizeof(S));
  for (Index b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
}

// pass 1 for rows r < NR over the nk keys of a chunk (k: row stride D). Each key pair also asks
// for the same rows of pf_a and pf_b (this chunk's V, the next chunk's K; null: none), so that the
// memory streams stay ahead of the arithmetic.
template <int NR, class A, class S>
void score_rows(const A* qs, Index D, const S* k, Index nk, A* s, Index ld, const S* pf_a = nullptr,
                const S* pf_b = nullptr, Index pf_b_rows = 0) {
  Index j = 0;
  for (; j + 2 <= nk; j += 2) {
    prefetch_rows(pf_a, j, 2, D);
    if (j < pf_b_rows) prefetch_rows(pf_b, j, std::min<Index>(2, pf_b_rows - j), D);
    score_pair<NR>(qs, D, k + j * D, k + (j + 1) * D, s + j, ld);
  }
  if (j < nk) {  // an odd key: paired with itself, the second score dropped
    A tmp[8];
    score_pair<NR>(qs, D, k + j * D, k + j * D, tmp, 2);
    for (int r = 0; r < NR; ++r) s[r * ld + j] = tmp[2 * r];
  }
}

// pass 3 for rows r < NR: o_r = c_r o_r + sum_j p[r, j] v_j over the nk keys (p row stride ld,
// v and o row stride D), two vectors of D at a time, then one, then the tail.
template <int NR, class A, class S>
void accumulate_rows(const A* p, Index ld, const S* v, Index nk, Index D, const A* c, A* o) {
  const Tag<A> d;
  using V = hn::Vec<decltype(d)>;
  const Index N = static_cast<Index>(hn::Lanes(d));
  const V z = hn::Zero(d);
  Index e = 0;
  for (; e + 2 * N <= D; e += 2 * N) {
    V o00 = hn::Mul(hn::Set(d, c[0]), hn::LoadU(d, o + e)), o01 = hn::Mul(hn::Set(d, c[0]), hn::LoadU(d, o + e + N));
    V o10 = z, o11 = z, o20 = z, o21 = z, o30 = z, o31 = z;
    if constexpr (NR > 1) {
      o10 = hn::Mul(hn::Set(d, c[1]), hn::LoadU(d, o + D + e));
      o11 = hn::Mul(hn::Set(d, c[1]), hn::LoadU(d, o + D + e + N));
    }
    if constexpr (NR > 2) {
      o20 = hn::Mul(hn::Set(d, c[2]), hn::LoadU(d, o + 2 * D + e));
      o21 = hn::Mul(hn::Set(d, c[2]), hn::LoadU(d, o + 2 * D + e + N));
    }
    if constexpr (NR > 3) {
      o30 = hn::Mul(hn::Set(d, c[3]), hn::LoadU(d, o + 3 * D + e));
      o31 = hn::Mul(hn::Set(d, c[3]), hn::LoadU(d, o + 3 * D + e + N));
    }
    for (Index j = 0; j < nk; ++j) {
      const V x0 = load_as(d, v + j * D + e), x1 = load_as(d, v + j * D + e + N);
      const V p0 = hn::Set(d, p[j]);
      o00 = hn::MulAdd(p0, x0, o00);
      o01 = hn::MulAdd(p0, x1, o01);
      if constexpr (NR > 1) {
        const V p1 = hn::Set(d, p[ld + j]);
        o10 = hn::MulAdd(p1, x0, o10);
        o11 = hn::MulAdd(p1, x1, o11);
      }
      if constexpr (NR > 2) {
        const V p2 = hn::Set(d, p[2 * ld + j]);
        o20 = hn::MulAdd(p2, x0, o20);
        o21 = hn::MulAdd(p2, x1, o21);
      }
      if constexpr (NR > 3) {
        const V p3 = hn::Set(d, p[3 * ld + j]);
        o30 = hn::MulAdd(p3, x0, o30);
        o31 = hn::MulAdd(p3, x1, o31);
      }
    }
    hn::StoreU(o00, d, o + e);
    hn::StoreU(o01, d, o + e + N);
    if constexpr (NR > 1) {
      hn::StoreU(o10, d, o + D + e);
      hn::StoreU(o11, d, o + D + e + N);
    }
    if constexpr (NR > 2) {
      hn::StoreU(o20, d, o + 2 * D + e);
      hn::StoreU(o21, d, o + 2 * D + e + N);
    }
    if constexpr (NR > 3) {
      hn::StoreU(o30, d, o + 3 * D + e);
      hn::StoreU(o31, d, o + 3 * D + e + N);
    }
  }
  for (; e + N <= D; e += N) {
    V o0 = hn::Mul(hn::Set(d, c[0]), hn::LoadU(d, o + e)), o1 = z, o2 = z, o3 = z;
    if constexpr (NR > 1) o1 = hn::Mul(hn::Set(d, c[1]), hn::LoadU(d, o + D + e));
    if constexpr (NR > 2) o2 = hn::Mul(hn::Set(d, c[2]), hn::LoadU(d, o + 2 * D + e));
    if constexpr (NR > 3) o3 = hn::Mul(hn::Set(d, c[3]), hn::LoadU(d, o + 3 * D + e));
    for (Index j = 0; j < nk; ++j) {
      const V x = load_as(d, v + j * D + e);
      o0 = hn::MulAdd(hn::Set(d, p[j]), x, o0);
      if constexpr (NR > 1) o1 = hn::MulAdd(hn::Set(d, p[ld + j]), x, o1);
      if constexpr (NR > 2) o2 = hn::MulAdd(hn::Set(d, p[2 * ld + j]), x, o2);
      if constexpr (NR > 3) o3 = hn::MulAdd(hn::Set(d, p[3 * ld + j]), x, o3);
    }
    hn::StoreU(o0, d, o + e);
    if constexpr (NR > 1) hn::StoreU(o1, d, o + D + e);
    if constexpr (NR > 2) hn::StoreU(o2, d, o + 2 * D + e);
    if constexpr (NR > 3) hn::StoreU(o3, d, o + 3 * D + e);
  }
  for (; e < D; ++e)
    for (int r = 0; r < NR; ++r) {
      A acc = c[r] * o[r * D + e];
      for (Index j = 0; j < nk; ++j) acc = std::fma(p[r * ld + j], widen<A>(v[j * D + e]), acc);
      o[r * D + e] = acc;
    }
}

// The largest of x[0, n), NaN when any is NaN (a plain max would pass over it).
template <class A>
A row_max(const A* x, Index n) {
  const Tag<A> d;
  const Index N = static_cast<Index>(hn::Lanes(d));
  auto m = hn::Set(d, -std::numeric_limits<A>::infinity());
  auto nan = hn::Zero(d);
  Index j = 0;
  for (; j + N <= n; j += N) {
    const auto x0 = hn::LoadU(d, x + j);
    m = hn::Max(m, x0);
    nan = hn::Or(nan, hn::VecFromMask(d, hn::Ne(x0, x0)));
  }
  A r = hn::GetLane(hn::MaxOfLanes(d, m));
  bool any_nan = !hn::AllTrue(d, hn::Eq(nan, hn::Zero(d)));
  for (; j < n; ++j) {
    r = std::max(r, x[j]);
    any_nan |= std::isnan(x[j]);
  }
  return any_nan ? std::numeric_limits<A>::quiet_NaN() : r;
}

// Rows r0 .. r0 + nr of a pass, in blocks of four rows.
template <class F>
void for_row_blocks(Index R, F&& f) {
  for (Index r0 = 0; r0 < R; r0 += 4) {
    switch (std::min<Index>(4, R - r0)) {
      case 4: f(r0, std::integral_constant<int, 4>()); break;
      case 3: f(r0, std::integral_constant<int, 3>()); break;
      case 2: f(r0, std::integral_constant<int, 2>()); break;
      default: f(r0, std::integral_constant<int, 1>()); break;
    }
  }
}

template <class S, class A>
Work decode_impl(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& mask, A scale, OnlineState<A> st,
                 DecodeWorkspace<A>& ws) {
  const Index G = q.pk.G, D = q.pk.D, R = q.pk.L * G, Lk = kv.pk.L, C = kDecodeChunk, ld = ws.ld;
  Work work;
  if (!block_visible(mask, q.pos, kv.pos)) return work;
  if (R > ws.rows || D != ws.D)
    throw std::invalid_argument("decode_forward: the workspace is for fewer query rows or another head dim");
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  const A alpha = static_cast<A>(double(scale) * kLog2e);
  const Index qlo = q.pos.front(), qhi = q.pos.back();
  A* s = ws.s.data();
  for (Index b = 0; b < q.pk.B; ++b)
    for (Index g = 0; g < q.pk.HKV; ++g) {
      const S* qg = q.q + q.pk.q_group(b, g);
      const S* kg = kv.k + kv.pk.kv_group(b, g);
      const S* vg = kv.v + kv.pk.kv_group(b, g);
      A* m = st.m + q.pk.row_group(b, g);
      A* l = st.l + q.pk.row_group(b, g);
      A* a = st.acc + q.pk.q_group(b, g);
      scaled_rows(qg, R, D, alpha, ws.qs.data());
      for (Index c0 = 0; c0 < Lk; c0 += C) {
        const Index nk = std::min(C, Lk - c0);
        const TileClass cls =
            mask.is_full() ? TileClass::full : mask.classify(qlo, qhi, kv.pos[c0], kv.pos[c0 + nk - 1]);
        if (cls == TileClass::empty) continue;
        const bool partial = cls == TileClass::partial;
        auto sees = [&](Index i, Index j) { return !partial || mask.visible(q.pos[i / G], kv.pos[c0 + j]); };
        const S* kc = kg + c0 * D;
        const S* vc = vg + c0 * D;
        // pass 1: S = Q' K^T, the invisible pairs -inf; the row max
        const Index next = std::min(C, std::max<Index>(Lk - c0 - nk, 0));  // keys of the next chunk
        for_row_blocks(R, [&](Index r0, auto nr) {
          if (r0 == 0)
            score_rows<decltype(nr)::value>(ws.qs.data(), D, kc, nk, s, ld, vc, kc + nk * D, next);
          else
            score_rows<decltype(nr)::value>(ws.qs.data() + r0 * D, D, kc, nk, s + r0 * ld, ld);
        });
        if (partial)
          for (Index i = 0; i < R; ++i)
            for (Index j = 0; j < nk; ++j)
              if (!sees(i, j)) s[i * ld + j] = kNegInf;
        A* rmax = ws.rowmax.data();
        for (Index i = 0; i < R; ++i) rmax[i] = row_max(s + i * ld, nk);
        // pass 2: m' = max(m, rowmax), P = 2^(S - m'), l' = c l + sum P, c = 2^(m - m')
        A* c = ws.c.data();
        for (Index i = 0; i < R; ++i) {
          rmax[i] = std::isnan(rmax[i]) ? rmax[i] : std::max(m[i], rmax[i]);  // a NaN max stays
          c[i] = rmax[i] == kNegInf ? A(0) : m[i] - rmax[i];
        }
        if (any_nonfinite_max(rmax, R))
          exp_tile<false, A, true>(s, R, nk, ld, rmax, nullptr, ws.sum.data(), !partial);
        else
          exp_tile<false, A>(s, R, nk, ld, rmax, nullptr, ws.sum.data());
        std::copy_n(rmax, R, m);
        pow_rows(c, R);
        for (Index i = 0; i < R; ++i) l[i] = c[i] * l[i] + ws.sum[i];
        // pass 3: a = c a + P V; a partial chunk with a non-finite V sums its visible pairs only,
        // so that a NaN reaches no row that does not see its key
        if (partial && any_nonfinite(vc, nk * D)) {
          for (Index i = 0; i < R; ++i) {
            A* o = a + i * D;
            for (Index e = 0; e < D; ++e) o[e] *= c[i];
            for (Index j = 0; j < nk; ++j)
              if (sees(i, j))
                for (Index e = 0; e < D; ++e) o[e] = std::fma(s[i * ld + j], widen<A>(vc[j * D + e]), o[e]);
          }
        } else {
          for_row_blocks(R, [&](Index r0, auto nr) {
            accumulate_rows<decltype(nr)::value>(s + r0 * ld, ld, vc, nk, D, c + r0, a + r0 * D);
          });
        }
        work.flops += 4.0 * double(R) * double(nk) * double(D);
        ++work.tile_pairs;
      }
    }
  return work;
}

// One read of x[0, n): four vector sums, so that the adds do not chain; bytes per second.
double read_pass_impl(const float* x, std::size_t n) {
  const Tag<float> d;
  const std::size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0;
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = hn::Add(s0, hn::LoadU(d, x + i));
    s1 = hn::Add(s1, hn::LoadU(d, x + i + N));
    s2 = hn::Add(s2, hn::LoadU(d, x + i + 2 * N));
    s3 = hn::Add(s3, hn::LoadU(d, x + i + 3 * N));
  }
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  [[maybe_unused]] static volatile float sink;
  sink = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  return dt > 0 ? double(i * sizeof(float)) / dt : 0.0;
}

// ---- what the dispatch calls ------------------------------------------------------------------

#define RINGATTN_DECODE_ENTRY(NAME, S)                                                                        \
  Work Decode##NAME(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& m, accum_t<S> s,                \
                    OnlineState<accum_t<S>> st, DecodeWorkspace<accum_t<S>>& ws) {                            \
    return decode_impl<S, accum_t<S>>(q, kv, m, s, st, ws);                                                   \
  }
RINGATTN_DECODE_ENTRY(F32, float)
RINGATTN_DECODE_ENTRY(F64, double)
RINGATTN_DECODE_ENTRY(BF16, bf16)
RINGATTN_DECODE_ENTRY(F16, f16)
#undef RINGATTN_DECODE_ENTRY
double ReadPass(const float* x, std::size_t n) { return read_pass_impl(x, n); }

}  // namespace ringattn::core::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ringattn::core {

namespace {
#define RINGATTN_DECODE_EXPORT(NAME, S)                                                                       \
  HWY_EXPORT(Decode##NAME);                                                                                   \
  Work dispatch_decode(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& mask, accum_t<S> scale,      \
                       OnlineState<accum_t<S>> st, DecodeWorkspace<accum_t<S>>& ws) {                         \
    return HWY_DYNAMIC_DISPATCH(Decode##NAME)(q, kv, mask, scale, st, ws);                                    \
  }
RINGATTN_DECODE_EXPORT(F32, float)
RINGATTN_DECODE_EXPORT(F64, double)
RINGATTN_DECODE_EXPORT(BF16, bf16)
RINGATTN_DECODE_EXPORT(F16, f16)
#undef RINGATTN_DECODE_EXPORT
HWY_EXPORT(ReadPass);
}  // namespace

template <class A>
DecodeWorkspace<A>::DecodeWorkspace(Index r, Index head_dim) : rows(std::max<Index>(r, 1)), D(head_dim) {
  ld = kDecodeChunk;
  constexpr Index kPad = 256;  // the widest vector of any target past a row's end
  qs.assign(rows * D + kPad, A(0));
  s.assign(rows * ld + kPad, A(0));
  for (auto* v : {&rowmax, &c, &sum}) v->assign(rows + kPad, A(0));
}
template struct DecodeWorkspace<float>;
template struct DecodeWorkspace<double>;

template <class S>
Work decode_forward(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& mask, accum_t<S> scale,
                    OnlineState<accum_t<S>> st, DecodeWorkspace<accum_t<S>>& ws) {
  return dispatch_decode(q, kv, mask, scale, st, ws);
}
template Work decode_forward<float>(const QueryShard<float>&, const KVBlock<float>&, const Mask&, float,
                                    OnlineState<float>, DecodeWorkspace<float>&);
template Work decode_forward<double>(const QueryShard<double>&, const KVBlock<double>&, const Mask&, double,
                                     OnlineState<double>, DecodeWorkspace<double>&);
template Work decode_forward<bf16>(const QueryShard<bf16>&, const KVBlock<bf16>&, const Mask&, float,
                                   OnlineState<float>, DecodeWorkspace<float>&);
template Work decode_forward<f16>(const QueryShard<f16>&, const KVBlock<f16>&, const Mask&, float,
                                  OnlineState<float>, DecodeWorkspace<float>&);

double read_pass_bytes_per_s(const float* x, std::size_t n) { return HWY_DYNAMIC_DISPATCH(ReadPass)(x, n); }

}  // namespace ringattn::core
#endif
