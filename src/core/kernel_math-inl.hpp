// The arithmetic of the block kernels for one SIMD target: 2^x in f32 and f64 without
// denormals, the softmax of a tile, and the copies that widen stored operands to the
// accumulation type.
// Included by block_kernels.cpp once per SIMD target (Highway's foreach_target), hence the
// toggled guard instead of #pragma once.
#if defined(RINGATTN_CORE_KERNEL_MATH_INL_HPP_) == defined(HWY_TARGET_TOGGLE)
#ifdef RINGATTN_CORE_KERNEL_MATH_INL_HPP_
#undef RINGATTN_CORE_KERNEL_MATH_INL_HPP_
#else
#define RINGATTN_CORE_KERNEL_MATH_INL_HPP_
#endif

#include "hwy/highway.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>

#include "ringattn/core/block_attention.hpp"

// The x86 targets by their registers, whatever a Highway version names them (those after 1.0.3 add
// SSE2, AVX3_ZEN4 and AVX3_SPR): AVX-512, 32 registers of 16 floats, or AVX2 down to SSE2, 16
// registers. Highway numbers its targets best first; a future 256-bit AVX10 target would be neither.
#define RINGATTN_AVX512 (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && HWY_MAX_BYTES == 64)
#define RINGATTN_X86_16_REGISTERS (HWY_ARCH_X86 && HWY_TARGET >= HWY_AVX2 && HWY_TARGET < HWY_EMU128)

HWY_BEFORE_NAMESPACE();
namespace ringattn::core::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class A>
using Tag = hn::ScalableTag<A>;

// ---- exp -----------------------------------------------------------------------------------------

// The constants of 2^x per type: the rounding shift 1.5 2^m (m mantissa bits), whose low bits then
// hold n + bias; the least x whose result is kept; the polynomial for 2^f, highest degree first.
template <class T>
struct Exp2Consts;
template <>
struct Exp2Consts<float> {  // degree 5 (minimax in ulps), at most 1.8 ulp (2.1 without a fused multiply-add)
  static constexpr float kMagic = 12582912.0f + 127.0f, kMin = -125.0f;
  static constexpr int kMantissa = 23;
  static constexpr float kPoly[] = {1.3225707225501537e-3f, 9.671762585639954e-3f, 5.550891533493996e-2f,
                                    2.4022236466407776e-1f, 6.93146824836731e-1f, 1.0f};
};
template <>
struct Exp2Consts<double> {  // (ln 2)^k / k!: the degree-13 Taylor polynomial of e^(f ln 2), at most 1 ulp (1.2)
  static constexpr double kMagic = 6755399441055744.0 + 1023.0, kMin = -1021.0;
  static constexpr int kMantissa = 52;
  static constexpr double kPoly[] = {1.3691488853904128e-12, 2.5678435993488206e-11, 4.4455382718708116e-10,
                                     7.054911620801123e-09,  1.01780860092397e-07,   1.321548679014431e-06,
                                     1.5252733804059841e-05, 1.540353039338161e-04,  1.3333558146428443e-03,
                                     9.618129107628477e-03,  5.550410866482158e-02,  2.4022650695910072e-01,
                                     6.931471805599453e-01,  1.0};
};

// 2^x for x <= 0 in f32 or f64: 2^x = 2^n 2^f, n = round(x) by adding 1.5 2^m (whose low mantissa
// bits then hold n + bias, the exponent of 2^n), f = x - n in [-1/2, 1/2] exactly, 2^f by the type's
// polynomial (|f ln 2| <= 0.35). Below the least kept x (2^-125 in f32, 2^-1021 in f64) the result
// is 0, never a denormal (which would slow every product that reads it); -inf gives 0 exactly.
template <class D>
HWY_INLINE hn::Vec<D> Exp2(D d, hn::Vec<D> x) {
  using V = hn::Vec<D>;
  using T = hn::TFromD<D>;
  using C = Exp2Consts<T>;
  auto poly = [](V f) HWY_ATTR {
    V p = hn::Set(D(), C::kPoly[0]);
    for (const auto c : std::span(C::kPoly).subspan(1)) p = hn::MulAdd(p, f, hn::Set(D(), c));
    return p;
  };
#if RINGATTN_AVX512
  // AVX-512 on whole vectors: f = x - round(x) by vreduce and n = x - f (one operation fewer than
  // the rounding shift below), p 2^n by vscalef, zeroed below kMin by its mask (not-less-than, so a
  // NaN stays NaN). n and f are the rounding shift's except where x + 1/2 is an integer: vreduce
  // takes the even n there, the shift (its bias is odd) the odd one, f = +-1/2 either way, and the
  // results differ by an ulp of the polynomial's.
  if constexpr (hn::MaxLanes(D()) * sizeof(T) == 64) {
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;  // no fraction bits kept
    if constexpr (std::is_same_v<T, float>) {
      const V f{_mm512_reduce_ps(x.raw, kNearest)};
      const V n = hn::Sub(x, f);
      const __mmask16 keep = _mm512_cmp_ps_mask(x.raw, _mm512_set1_ps(C::kMin), _CMP_NLT_UQ);
      return V{_mm512_maskz_scalef_ps(keep, poly(f).raw, n.raw)};
    } else {
      const V f{_mm512_reduce_pd(x.raw, kNearest)};
      const V n = hn::Sub(x, f);
      const __mmask8 keep = _mm512_cmp_pd_mask(x.raw, _mm512_set1_pd(C::kMin), _CMP_NLT_UQ);
      return V{_mm512_maskz_scalef_pd(keep, poly(f).raw, n.raw)};
    }
  }
#endif
  const V magic = hn::Set(d, C::kMagic);
  const V t = hn::Add(x, magic);
  const V n = hn::Sub(t, magic);
  const V f = hn::Sub(x, n);
  const V p = poly(f);
  const hn::RebindToSigned<D> di;
  const V scale = hn::BitCast(d, hn::ShiftLeft<C::kMantissa>(hn::BitCast(di, t)));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, C::kMin)), hn::Mul(p, scale));
}


// ---- operands ------------------------------------------------------------------------------------

// An operand in the accumulation type (bf16 and f16 widen exactly to float).
template <class A, class S>
HWY_INLINE A widen(S x) {
  return value_cast<A>(x);
}

// dst[i, :] = alpha * src[i, :] for n rows of D (row stride D both).
template <class A, class S>
void scaled_rows(const S* src, Index n, Index D, A alpha, A* dst) {
  for (Index e = 0; e < n * D; ++e) dst[e] = alpha * widen<A>(src[e]);
}

// dst[i, :] = src[i, :] as A for n rows of D (row strides D and ldd).
template <class A, class S>
void copy_rows(const S* src, Index n, Index D, A* dst, Index ldd) {
  for (Index i = 0; i < n; ++i)
    for (Index d = 0; d < D; ++d) dst[i * ldd + d] = widen<A>(src[i * D + d]);
}

#if RINGATTN_AVX512
// The 16 x 16 block r[i][j] transposed in registers (r[j] then holds what was column j): the same
// steps as the rounding packers' in amx_tiles.cpp, which shares no code with the kernels.
HWY_INLINE void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: a0 b0 a1 b1 and a2 b2 a3 b3
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // per lane: column k of rows i .. i + 3 in r[i + k]
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int k = 0; k < 4; ++k) {  // lane L of r[4 g + k] is column 4 L + k of rows 4 g .. 4 g + 3
    const __m512 ab_lo = _mm512_shuffle_f32x4(r[k], r[4 + k], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 ab_hi = _mm512_shuffle_f32x4(r[k], r[4 + k], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 cd_lo = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 cd_hi = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], _MM_SHUFFLE(3, 2, 3, 2));
    t[k] = _mm512_shuffle_f32x4(ab_lo, cd_lo, _MM_SHUFFLE(2, 0, 2, 0));
    t[4 + k] = _mm512_shuffle_f32x4(ab_lo, cd_lo, _MM_SHUFFLE(3, 1, 3, 1));
    t[8 + k] = _mm512_shuffle_f32x4(ab_hi, cd_hi, _MM_SHUFFLE(2, 0, 2, 0));
    t[12 + k] = _mm512_shuffle_f32x4(ab_hi, cd_hi, _MM_SHUFFLE(3, 1, 3, 1));
  }
  for (int j = 0; j < 16; ++j) r[j] = t[j];
}
#endif

// KT[d, j] = K[j, d] for j < tk (KT row stride ldkt). When K already holds A, whole vectors of keys
// are transposed in registers (f32 on AVX-512; on AVX2 when D is a multiple of 8) or gathered down
// a column of K, and stored as one vector of a row of KT: each store writes one contiguous run
// instead of a lane per row (kernel_bench --pieces times it with V's copy as the tile start). The
// keys past the last whole vector, and 16-bit K, go element by element.
#if HWY_TARGET == HWY_AVX2
// The 8 x 8 block r[i][j] transposed in registers (r[j] then holds what was column j).
HWY_INLINE void transpose8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {  // per 128-bit lane: a0 b0 a1 b1 and a2 b2 a3 b3
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // per lane: column k of rows i .. i + 3 in r[i + k]
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int k = 0; k < 4; ++k) {  // columns k and 4 + k: the low and high lanes of rows 0-3 and 4-7
    t[k] = _mm256_permute2f128_ps(r[k], r[4 + k], 0x20);
    t[4 + k] = _mm256_permute2f128_ps(r[k], r[4 + k], 0x31);
  }
  for (int j = 0; j < 8; ++j) r[j] = t[j];
}
#endif

template <class A, class S>
void transpose_rows(const S* K, Index tk, Index D, A* KT, Index ldkt) {
  Index j0 = 0;
#if HWY_TARGET == HWY_AVX2
  // f32 on AVX2: the same with 8 x 8 blocks when D is a multiple of 8 (other D: the gathers below)
  if constexpr (std::is_same_v<A, float> && std::is_same_v<S, float>) {
    const Index whole = tk - tk % 8, dw = D - D % 8;
    if (dw == D) {
      for (Index j = 0; j < whole; j += 8) {
        const char* next = reinterpret_cast<const char*>(K + (j + 8) * D);
        const Index ahead = (j + 16 <= tk ? 8 : tk - j - 8) * D * Index(sizeof(float));
        for (Index b = 0; b < ahead; b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
        for (Index c0 = 0; c0 < D; c0 += 8) {
          __m256 r[8];
          for (int t = 0; t < 8; ++t) r[t] = _mm256_loadu_ps(K + (j + t) * D + c0);
          transpose8(r);
          for (int c = 0; c < 8; ++c) _mm256_storeu_ps(KT + (c0 + c) * ldkt + j, r[c]);
        }
      }
      j0 = whole;
    }
  }
#endif
#if RINGATTN_AVX512
  // f32 on AVX-512: 16 keys' rows read whole (16 values of each at a time), transposed in
  // registers, with the next 16 rows asked for ahead: K comes from memory once per chunk, and
  // a gather down a column waited on 16 lines for every vector
  if constexpr (std::is_same_v<A, float> && std::is_same_v<S, float>) {
    const Index whole = tk - tk % 16;
    for (Index j = 0; j < whole; j += 16) {
      const char* next = reinterpret_cast<const char*>(K + (j + 16) * D);
      const Index ahead = (j + 32 <= tk ? 16 : tk - j - 16) * D * Index(sizeof(float));
      for (Index b = 0; b < ahead; b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
      for (Index c0 = 0; c0 < D; c0 += 16) {
        const Index cols = std::min<Index>(16, D - c0);
        const __mmask16 keep = static_cast<__mmask16>((1u << cols) - 1u);
        __m512 r[16];
        for (int t = 0; t < 16; ++t) r[t] = _mm512_maskz_loadu_ps(keep, K + (j + t) * D + c0);
        transpose16(r);
        for (Index c = 0; c < cols; ++c) _mm512_storeu_ps(KT + (c0 + c) * ldkt + j, r[c]);
      }
    }
    j0 = whole;
  }
#endif
  if constexpr (std::is_same_v<A, S>) {  // other targets and f64: whole vectors of keys gathered
    const Tag<A> d;
    const hn::RebindToSigned<decltype(d)> di;
    using I = hn::TFromD<decltype(di)>;
    const Index N = static_cast<Index>(hn::Lanes(d));
    const auto rows = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<I>(D)));  // lane j: K's row j
    const Index whole = tk - tk % N;
    for (Index j = j0; j < whole; j += N) {
      const A* k = K + j * D;
      for (Index c = 0; c < D; ++c) hn::StoreU(hn::GatherIndex(d, k + c, rows), d, KT + c * ldkt + j);
    }
    j0 = std::max(j0, whole);
  }
  for (Index j = j0; j < tk; ++j) {
    const S* k = K + j * D;
    A* kt = KT + j;
    for (Index c = 0; c < D; ++c) kt[c * ldkt] = widen<A>(k[c]);
  }
}

// ---- non-finite operands -------------------------------------------------------------------------

// Whether any of x[0, n) is NaN or infinite: vector loads OR-ed into one mask, no branch per vector
// (bf16 and f16: an all-ones exponent). The kernels ask once per head group and block, to know
// whether the rare exact handling of non-finite values may be needed (see block_kernels.cpp).
template <class T>
bool any_nonfinite(const T* x, Index n) {
  if constexpr (is_half_v<T>) {
    const hn::ScalableTag<std::uint16_t> d;
    const std::uint16_t e = std::is_same_v<T, bf16> ? 0x7F80 : 0x7C00;
    const std::uint16_t* u = reinterpret_cast<const std::uint16_t*>(x);
    const Index N = static_cast<Index>(hn::Lanes(d));
    const auto ve = hn::Set(d, e);
    auto bad = hn::Zero(d);
    Index i = 0;
    for (; i + N <= n; i += N) bad = hn::Or(bad, hn::VecFromMask(d, hn::Eq(hn::And(hn::LoadU(d, u + i), ve), ve)));
    bool any = !hn::AllFalse(d, hn::Ne(bad, hn::Zero(d)));
    for (; i < n; ++i) any |= (u[i] & e) == e;
    return any;
  } else {
    const Tag<T> d;
    const Index N = static_cast<Index>(hn::Lanes(d));
    auto bad = hn::FirstN(d, 0);
    Index i = 0;
    for (; i + N <= n; i += N) bad = hn::Or(bad, hn::Not(hn::IsFinite(hn::LoadU(d, x + i))));
    bool any = !hn::AllFalse(d, bad);
    for (; i < n; ++i) any |= !std::isfinite(x[i]);
    return any;
  }
}

// The largest |x[i]| of x[0, n): +inf when one is infinite, NaN when one is NaN. With the sign
// cleared, the bits of IEEE values order as the values do (NaN above inf), so one unsigned maximum
// of the bits serves every storage type.
template <class T>
double max_magnitude(const T* x, Index n) {
  using U = std::conditional_t<sizeof(T) == 2, std::uint16_t,
                               std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;
  const hn::ScalableTag<U> d;
  const U* u = reinterpret_cast<const U*>(x);
  const Index N = static_cast<Index>(hn::Lanes(d));
  constexpr U kMagnitude = std::numeric_limits<U>::max() >> 1;
  const auto magnitude = hn::Set(d, kMagnitude);
  auto m = hn::Zero(d);
  Index i = 0;
  for (; i + N <= n; i += N) m = hn::Max(m, hn::And(hn::LoadU(d, u + i), magnitude));
  U bits = n >= N ? hn::GetLane(hn::MaxOfLanes(d, m)) : U{0};
  for (; i < n; ++i) bits = std::max<U>(bits, u[i] & kMagnitude);
  T v;
  if constexpr (is_half_v<T>) {
    v.bits = bits;
    return static_cast<double>(widen<float>(v));
  } else {
    std::memcpy(&v, &bits, sizeof v);
    return static_cast<double>(v);
  }
}

// Whether scores alpha q.k of q and k with largest magnitudes mq and mk (depth D) may leave the range
// of A: a product that overflows makes a score of +-inf, or NaN where overflowed products of both
// signs meet, and such scores take the exact paths as non-finite operands do. Non-finite mq or mk
// count too. |alpha q.k| <= D |alpha| mq mk, a bound on every partial sum as well.
template <class A>
bool scores_may_overflow(double mq, double mk, Index D, A alpha) {
  const double aq = std::abs(double(alpha)) * mq, limit = 0.5 * double(std::numeric_limits<A>::max());
  return !(aq <= limit && double(D) * aq * mk <= limit);
}

// ---- sweep 2: the softmax of a tile ---------------------------------------------------------------

// Row i of the n x tk tile S (row stride lds) becomes 2^(S - mref[i]), times w[i] when kScale;
// sum[i] = the row's sum (before w) when sum is not null. A row with mref[i] = -inf sees no key:
// it becomes 0 and its sum 0. With kNonFinite (the caller found such a row), a row with mref[i] NaN
// or +inf has a NaN or +inf score (a non-finite operand): its softmax is NaN, so its visible entries
// become NaN and its sum NaN; every entry is visible when all_visible (a full piece), else the
// invisible ones are those masked to -inf, and they become 0, so that the NaN reaches no key the
// row does not see. One vector per step into one running sum: the polynomial's constants
// stay in registers on every target (16 on AVX2) and nothing spills; the sum's chain is one add per
// step, shorter than an exponential's throughput. The lanes past tk are left as they are.
template <bool kScale, class A, bool kNonFinite = false>
void exp_tile(A* S, Index n, Index tk, Index lds, const A* mref, const A* w, A* sum, bool all_visible = true) {
  const Tag<A> d;
  using V = hn::Vec<decltype(d)>;
  const Index N = static_cast<Index>(hn::Lanes(d));
  const Index whole = tk / N * N;
  const auto tail = hn::FirstN(d, static_cast<size_t>(tk - whole));
  constexpr A kInf = std::numeric_limits<A>::infinity();
  for (Index i = 0; i < n; ++i) {
    A* x = S + i * lds;
    if (mref[i] == -kInf) {
      std::fill_n(x, tk, A(0));
      if (sum) sum[i] = A(0);
      continue;
    }
    if (kNonFinite && !(mref[i] < kInf)) {  // NaN or +inf
      constexpr A kNaN = std::numeric_limits<A>::quiet_NaN();
      for (Index j = 0; j < tk; ++j) x[j] = all_visible || x[j] != -kInf ? kNaN : A(0);
      if (sum) sum[i] = kNaN;
      continue;
    }
    const V vm = hn::Set(d, mref[i]);
    [[maybe_unused]] const V vw = hn::Set(d, kScale ? w[i] : A(1));
    V acc = hn::Zero(d);
    for (Index j = 0; j < whole; j += N) {
      const V e = Exp2(d, hn::Sub(hn::LoadU(d, x + j), vm));
      acc = hn::Add(acc, e);
      hn::StoreU(kScale ? hn::Mul(e, vw) : e, d, x + j);
    }
    if (whole < tk) {
      const V e = hn::IfThenElseZero(tail, Exp2(d, hn::Sub(hn::LoadU(d, x + whole), vm)));
      acc = hn::Add(acc, e);
      hn::BlendedStore(kScale ? hn::Mul(e, vw) : e, tail, d, x + whole);
    }
    if (sum) sum[i] = hn::GetLane(hn::SumOfLanes(d, acc));
  }
}

// rmax[i] = the largest of row i's tk values (row stride lds), for rows without NaN: the masked
// scores of finite operands whose products cannot overflow (scores_may_overflow), finite or -inf.
// Vector maxima drop a NaN (x86's max returns its second operand when either is NaN), as the full
// pieces' do; rows that may hold one take the exact path, whose nan_rows settles them.
template <class A>
void row_max(const A* S, Index n, Index tk, Index lds, A* rmax) {
  const Tag<A> d;
  const Index N = static_cast<Index>(hn::Lanes(d));
  const auto ninf = hn::Set(d, -std::numeric_limits<A>::infinity());
  for (Index i = 0; i < n; ++i) {
    const A* x = S + i * lds;
    auto m = ninf;
    Index j = 0;
    for (; j + N <= tk; j += N) m = hn::Max(m, hn::LoadU(d, x + j));
    if (j < tk) {
      const auto tail = hn::FirstN(d, static_cast<size_t>(tk - j));
      m = hn::Max(m, hn::IfThenElse(tail, hn::MaskedLoad(tail, d, x + j), ninf));
    }
    rmax[i] = hn::GetLane(hn::MaxOfLanes(d, m));
  }
}

// Whether any of the n row maxima is NaN or +inf (exp_tile's kNonFinite rows).
template <class A>
bool any_nonfinite_max(const A* mref, Index n) {
  bool any = false;
  for (Index i = 0; i < n; ++i) any |= !(mref[i] < std::numeric_limits<A>::infinity());
  return any;
}

// x[i] = 2^x[i] for i < n.
template <class A>
void pow_rows(A* x, Index n) {
  const Tag<A> d;
  const Index N = static_cast<Index>(hn::Lanes(d));
  for (Index i = 0; i < n; i += N) {
    const auto mask = hn::FirstN(d, static_cast<size_t>(std::min<Index>(N, n - i)));
    hn::BlendedStore(Exp2(d, hn::MaskedLoad(mask, d, x + i)), mask, d, x + i);
  }
}

// ---- Precision::bf16 ------------------------------------------------------------------------------

// dst = src rounded to the nearest bf16 value (ties to even), kept as f32, for n rows of tk (row
// strides ld; dst may be src): the integer form of the conversion, u + 0x7fff + (bit 16 of u) with
// the low 16 bits cleared, so a finite value past the largest bf16 carries into the exponent and
// becomes inf as a conversion would, inf stays inf, and NaN (whose carry could reach the sign or
// leave a payload of zeros, an inf) is kept as it is.
// (A = double: bf16 precision is float's alone; never called.)
template <class A>
void round_bf16_tile(const A* src, A* dst, Index n, Index tk, Index ld) {
  if constexpr (std::is_same_v<A, float>) {
    const Tag<A> d;
    const hn::RebindToUnsigned<decltype(d)> du;
    const Index N = static_cast<Index>(hn::Lanes(d));
    const auto bias = hn::Set(du, 0x7fffu), one = hn::Set(du, 1u), high = hn::Set(du, 0xffff0000u);
    auto round = [&](auto x) HWY_ATTR {
      const auto u = hn::BitCast(du, x);
      const auto r = hn::And(hn::Add(u, hn::Add(bias, hn::And(hn::ShiftRight<16>(u), one))), high);
      return hn::IfThenElse(hn::IsNaN(x), x, hn::BitCast(d, r));
    };
    for (Index i = 0; i < n; ++i) {
      const A* s = src + i * ld;
      A* t = dst + i * ld;
      Index j = 0;
      for (; j + N <= tk; j += N) hn::StoreU(round(hn::LoadU(d, s + j)), d, t + j);
      if (j < tk) {
        const auto mask = hn::FirstN(d, static_cast<size_t>(tk - j));
        hn::BlendedStore(round(hn::MaskedLoad(mask, d, s + j)), mask, d, t + j);
      }
    }
  }
}

// One value rounded as round_bf16_tile does (the scalar exact paths).
template <class A>
HWY_INLINE A round_bf16(A x) {
  if constexpr (std::is_same_v<A, float>) {
    return std::isnan(x) ? x : to_float(to_bf16(x));
  } else {
    return x;
  }
}

// ---- soft-capping ---------------------------------------------------------------------------------

// Scores of the n x tk tile S (row stride lds) soft-capped in place, S = c tanh(S / c), with c the
// cap in the kernels' units (softcap times log2 e: in natural units s -> softcap tanh(s / softcap)).
// With F (the same strides), F = 1 - tanh^2 = ds_capped / ds, the factor the backward's dS takes.
// For |x| = |s / c| >= 1/8: tanh |x| = (1 - u) / (1 + u) and 1 - tanh^2 = 4 u / (1 + u)^2 with
// u = e^(-2|x|) = 2^(-2 log2(e) |x|), one Exp2 of a non-positive argument (as the softmax's) and one
// division per score; 1 - u >= 0.22 there, so tanh keeps its relative error within a few ulps.
// Below 1/8, where 1 - u would cancel (a cap far above the scores: |x| ~ 1e-6 lost all but a few
// bits of tanh in f32), tanh x = x - x^3 q(x^2) by its Taylor series to x^17, whose next term is
// below 2^-60 of x there. Called before the mask, so no entry is -inf; only with a cap (tested once
// per piece). With rmax, rmax[i] = the largest capped score of row i (a piece with no mask to apply).
template <class A>
void cap_tile(A* S, Index n, Index tk, Index lds, A c, A* F, A* rmax = nullptr) {
  const Tag<A> d;
  using V = hn::Vec<decltype(d)>;
  const Index N = static_cast<Index>(hn::Lanes(d));
  const V vc = hn::Set(d, c), k = hn::Set(d, A(-2 * kLog2e) / c), inv = hn::Set(d, A(1) / c);
  const V one = hn::Set(d, A(1)), four = hn::Set(d, A(4)), small = hn::Set(d, A(0.125));
  const V ninf = hn::Set(d, -std::numeric_limits<A>::infinity());
  // tanh x = x - x^3 q(x^2), q(z) = 1/3 - 2/15 z + 17/315 z^2 - ...: its coefficients from the x^17
  // term's down to the x^3 term's (the Bernoulli numbers' 2^2n (2^2n - 1) B_2n / (2n)!, signs flipped)
  static constexpr A kQ[] = {A(-5.90027440945586e-4), A(1.4558343870513183e-3), A(-3.592128036572481e-3),
                             A(8.863235529902197e-3), A(-2.1869488536155203e-2), A(5.396825396825397e-2),
                             A(-0.13333333333333333), A(0.3333333333333333)};
  for (Index i = 0; i < n; ++i) {
    V m = ninf;
    for (Index j = 0; j < tk; j += N) {
      const auto mask = hn::FirstN(d, static_cast<size_t>(std::min<Index>(N, tk - j)));
      const V x = hn::MaskedLoad(mask, d, S + i * lds + j);
      const V u = Exp2(d, hn::Mul(hn::Abs(x), k));
      const V r = hn::Div(one, hn::Add(one, u));
      V t = hn::CopySign(hn::Mul(hn::Sub(one, u), r), x);  // tanh(x / c)
      V f = hn::Mul(hn::Mul(four, u), hn::Mul(r, r));      // 1 - tanh^2
      const V xs = hn::Mul(x, inv), x2 = hn::Mul(xs, xs);
      const auto near0 = hn::Lt(hn::Abs(xs), small);
      if (!hn::AllFalse(d, hn::And(near0, mask))) {
        V q = hn::Set(d, kQ[0]);
        for (const A cq : std::span(kQ).subspan(1)) q = hn::MulAdd(q, x2, hn::Set(d, cq));
        const V ts = hn::NegMulAdd(hn::Mul(xs, x2), q, xs);
        t = hn::IfThenElse(near0, ts, t);
        f = hn::IfThenElse(near0, hn::NegMulAdd(ts, ts, one), f);
      }
      const V y = hn::Mul(vc, t);
      hn::BlendedStore(y, mask, d, S + i * lds + j);
      if (F) hn::BlendedStore(f, mask, d, F + i * lds + j);
      m = hn::Max(m, hn::IfThenElse(mask, y, ninf));
    }
    if (rmax) rmax[i] = hn::GetLane(hn::MaxOfLanes(d, m));
  }
}

// P = P o F over the n x tk tile (row stride lds): the backward's P times the cap's derivative, so
// that the gradient epilogue forms dS = scale P F o (dP - delta).
template <class A>
void mul_tile(A* P, const A* F, Index n, Index tk, Index lds) {
  for (Index i = 0; i < n; ++i)
    for (Index j = 0; j < tk; ++j) P[i * lds + j] *= F[i * lds + j];
}

}  // namespace ringattn::core::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RINGATTN_CORE_KERNEL_MATH_INL_HPP_
