// The block kernels, written once against Highway and compiled for every SIMD target the build
// has (SSE4, AVX2, AVX-512 (AVX3, AVX3_DL), NEON, SVE, EMU128); block_attention.cpp calls the
// best one the CPU runs, or the one RINGATTN_SIMD names.
//
// For one head group (b, g), with R query rows per chunk, TQ per tile, TK keys per tile:
//   forward:  per chunk, Q' = alpha Q as A once (alpha = scale, times log2 e in f32);
//             per K/V tile, K transposed and V copied as A once;
//             per piece: pass 1 S = Q' K^T, the row max kept as it is stored;
//                        pass 2 m' = max(m, rowmax), P = 2^(S - m'), l' = c l + sum P, c = 2^(m - m');
//                        pass 3 O = c O + P V, the rescale applied as O is loaded to take the sum.
//   backward: per chunk, Q' and Q, dO as A; per K/V tile, K and V transposed, K copied as A;
//             per piece: P = 2^(S - m) / l from the forward's own m and l (S recomputed bit for bit),
//                        dV += P^T dO, dS = scale P o (dO V^T - delta) formed as it is stored,
//                        dQ += dS K, dK += dS^T Q.
// Every product element is one FMA chain in a fixed order (over d for S and dP, over the shared
// dimension for the others, then one FMA into the output), so results do not depend on how rows are
// blocked, and the backward's S is the forward's exactly. The copies give every operand a row
// stride of an odd number of cache lines (Workspace::ld, ldd), so a panel read down its rows uses
// all sets of L1 instead of a few. Vectors are named variables, never arrays: the same lines serve
// 4, 8, 16 lanes or SVE's scalable length.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/block_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/tile_walk.hpp"
#include "ringattn/core/block_attention.hpp"

HWY_BEFORE_NAMESPACE();
namespace ringattn::core::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Register blocking per target: the accumulators of a score block (rows x vectors) and of an
// accumulate block, and the default tiles.
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3
constexpr int kScoreRows = 6, kScoreVecs = 2, kAccRows = 6, kAccVecs = 2;  // 16 registers: 12 accumulators
constexpr Index kTileQ = 96, kTileK = 256;
#elif HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
constexpr int kScoreRows = 4, kScoreVecs = 2, kAccRows = 4, kAccVecs = 2;
constexpr Index kTileQ = 64, kTileK = 128;
#else  // 32 registers: AVX3, AVX3_DL, NEON, SVE
constexpr int kScoreRows = 8, kScoreVecs = 3, kAccRows = 6, kAccVecs = 4;
constexpr Index kTileQ = 128, kTileK = 256;
#endif

template <class A>
using Tag = hn::ScalableTag<A>;

// Bytes of the B operand a product keeps in L1 while the rows stream past (half of a 32 KiB L1).
constexpr Index kPanelBytes = 16384;

// ---- exp -----------------------------------------------------------------------------------------

// 2^x for x <= 0 in f32: 2^x = 2^n 2^f, n = round(x) by adding 1.5 2^23 (whose low mantissa bits
// then hold n + 127, the exponent of 2^n), f in [-1/2, 1/2], 2^f by a degree-6 polynomial (about
// 1 ulp). Below 2^-125 the result is 0, never a denormal (which would slow every product that
// reads it); -inf gives 0 exactly.
template <class D>
HWY_INLINE hn::Vec<D> Exp2(D d, hn::Vec<D> x) {
  using V = hn::Vec<D>;
  const hn::RebindToSigned<D> di;
  const V magic = hn::Set(d, 12582912.0f + 127.0f);
  const V t = hn::Add(x, magic);
  const V f = hn::Sub(x, hn::Sub(t, magic));
  V p = hn::MulAdd(hn::Set(d, 1.535336188319500e-4f), f, hn::Set(d, 1.339887440266574e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 9.618437357674640e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.550332471162809e-2f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.402264791363012e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.931472028550421e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
  const V scale = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, t)));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -125.0f)), hn::Mul(p, scale));
}

// e^x for x <= 0 in f64: n = round(x log2 e) by adding 1.5 2^52 (the low bits then hold n + 1023),
// r = x - n ln 2 in two steps (Cody and Waite), e^r by its degree-12 Taylor polynomial (|r| <= 0.35:
// about 1 ulp), times 2^n. Below e^-708 the result is 0 (never a denormal); -inf gives 0 exactly.
template <class D>
HWY_INLINE hn::Vec<D> Exp(D d, hn::Vec<D> x) {
  using V = hn::Vec<D>;
  const hn::RebindToSigned<D> di;
  const V magic = hn::Set(d, 6755399441055744.0 + 1023.0);
  const V t = hn::MulAdd(x, hn::Set(d, 1.4426950408889634), magic);
  const V n = hn::Sub(t, magic);
  V r = hn::MulAdd(n, hn::Set(d, -6.93147180369123816490e-01), x);
  r = hn::MulAdd(n, hn::Set(d, -1.90821492927058770002e-10), r);
  V p = hn::MulAdd(hn::Set(d, 1.0 / 479001600.0), r, hn::Set(d, 1.0 / 39916800.0));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0 / 3628800.0));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0 / 362880.0));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0 / 40320.0));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0 / 5040.0));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0 / 720.0));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0 / 120.0));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0 / 24.0));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0 / 6.0));
  p = hn::MulAdd(p, r, hn::Set(d, 0.5));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0));
  const V scale = hn::BitCast(d, hn::ShiftLeft<52>(hn::BitCast(di, t)));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -708.0)), hn::Mul(p, scale));
}

// The softmax base: f32 works in base 2 (log2 e folded into the scale, one Exp2 per score); f64 in
// the natural base.
template <class A>
struct Base;
template <>
struct Base<float> {
  static constexpr double kLog = 1.4426950408889634;  // scores times log2(e)
  template <class D>
  static HWY_INLINE hn::Vec<D> Pow(D d, hn::Vec<D> x) {
    return Exp2(d, x);
  }
};
template <>
struct Base<double> {
  static constexpr double kLog = 1.0;
  template <class D>
  static HWY_INLINE hn::Vec<D> Pow(D d, hn::Vec<D> x) {
    return Exp(d, x);
  }
};

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

// KT[d, j] = K[j, d] for j < tk (KT row stride ldkt).
template <class A, class S>
void transpose_rows(const S* K, Index tk, Index D, A* KT, Index ldkt) {
  for (Index j = 0; j < tk; ++j)
    for (Index d = 0; d < D; ++d) KT[d * ldkt + j] = widen<A>(K[j * D + d]);
}

// ---- pass 1: score products ----------------------------------------------------------------------

enum class Epilogue { max, store, grad };

// kScoreVecs vectors of columns [j, j + NV N) for MR rows of C = A BT over `depth`:
//   max:   S = C, and vmax[i] = max(vmax[i], C) over the lanes below `valid`;
//   store: S = C;
//   grad:  S = alpha P o (C - delta[i])  (P at the same place as S, row stride lds).
#define RINGATTN_ACC_ROW(i)  \
  V c##i##0 = hn::Zero(d);   \
  V c##i##1 = hn::Zero(d);   \
  V c##i##2 = hn::Zero(d);   \
  V c##i##3 = hn::Zero(d);
#define RINGATTN_FMA_ROW(i)                                                \
  if constexpr (MR > i) {                                                  \
    const V a = hn::Set(d, A[i * lda + k]);                                \
    c##i##0 = hn::MulAdd(a, b0, c##i##0);                                  \
    if constexpr (NV > 1) c##i##1 = hn::MulAdd(a, b1, c##i##1);            \
    if constexpr (NV > 2) c##i##2 = hn::MulAdd(a, b2, c##i##2);            \
    if constexpr (NV > 3) c##i##3 = hn::MulAdd(a, b3, c##i##3);            \
  }
#define RINGATTN_SCORE_OUT(i)                                                  \
  if constexpr (MR > i) {                                                      \
    score_out<E, NV>(d, S + i * lds, P ? P + i * lds : nullptr,                \
                     E == Epilogue::grad ? delta[i] : T(0), alpha, valid,      \
                     vmax ? vmax + i * N : nullptr, c##i##0, c##i##1, c##i##2, c##i##3); \
  }

template <Epilogue E, int NV, class D, class V = hn::Vec<D>, class T = hn::TFromD<D>>
HWY_INLINE void score_out(D d, T* s, const T* p, T delta, T alpha, Index valid, T* vmax, V c0, V c1, V c2, V c3) {
  const Index N = static_cast<Index>(hn::Lanes(d));
  auto one = [&](Index v, V c) HWY_ATTR {
    T* out = s + v * N;
    if constexpr (E == Epilogue::grad) {
      const V pv = hn::LoadU(d, p + v * N);
      hn::StoreU(hn::Mul(hn::Mul(hn::Set(d, alpha), pv), hn::Sub(c, hn::Set(d, delta))), d, out);
    } else {
      hn::StoreU(c, d, out);
    }
  };
  one(0, c0);
  if constexpr (NV > 1) one(1, c1);
  if constexpr (NV > 2) one(2, c2);
  if constexpr (NV > 3) one(3, c3);
  if constexpr (E == Epilogue::max) {
    // The row's running maxima take the block's columns below `valid` in one update.
    V m = c0;
    if (valid >= NV * N) {
      if constexpr (NV > 1) m = hn::Max(m, c1);
      if constexpr (NV > 2) m = hn::Max(m, c2);
      if constexpr (NV > 3) m = hn::Max(m, c3);
    } else {
      const V ninf = hn::Set(d, -std::numeric_limits<T>::infinity());
      auto lanes = [&](Index v, V c) HWY_ATTR {
        const Index left = std::clamp<Index>(valid - v * N, 0, N);
        return hn::IfThenElse(hn::FirstN(d, static_cast<size_t>(left)), c, ninf);
      };
      m = lanes(0, c0);
      if constexpr (NV > 1) m = hn::Max(m, lanes(1, c1));
      if constexpr (NV > 2) m = hn::Max(m, lanes(2, c2));
      if constexpr (NV > 3) m = hn::Max(m, lanes(3, c3));
    }
    hn::StoreU(hn::Max(hn::LoadU(d, vmax), m), d, vmax);
  }
}

template <Epilogue E, int MR, int NV, class D, class T = hn::TFromD<D>>
HWY_NOINLINE void score_block(D d, const T* HWY_RESTRICT A, Index lda, Index depth, const T* HWY_RESTRICT BT,
                              Index ldb, T* HWY_RESTRICT S, Index lds, const T* P, const T* delta, T alpha,
                              Index valid, T* vmax) {
  using V = hn::Vec<D>;
  const Index N = static_cast<Index>(hn::Lanes(d));
  RINGATTN_ACC_ROW(0) RINGATTN_ACC_ROW(1) RINGATTN_ACC_ROW(2) RINGATTN_ACC_ROW(3)
  RINGATTN_ACC_ROW(4) RINGATTN_ACC_ROW(5) RINGATTN_ACC_ROW(6) RINGATTN_ACC_ROW(7)
  for (Index k = 0; k < depth; ++k) {
    const T* b = BT + k * ldb;
    const V b0 = hn::LoadU(d, b);
    V b1 = b0, b2 = b0, b3 = b0;
    if constexpr (NV > 1) b1 = hn::LoadU(d, b + N);
    if constexpr (NV > 2) b2 = hn::LoadU(d, b + 2 * N);
    if constexpr (NV > 3) b3 = hn::LoadU(d, b + 3 * N);
    RINGATTN_FMA_ROW(0) RINGATTN_FMA_ROW(1) RINGATTN_FMA_ROW(2) RINGATTN_FMA_ROW(3)
    RINGATTN_FMA_ROW(4) RINGATTN_FMA_ROW(5) RINGATTN_FMA_ROW(6) RINGATTN_FMA_ROW(7)
  }
  RINGATTN_SCORE_OUT(0) RINGATTN_SCORE_OUT(1) RINGATTN_SCORE_OUT(2) RINGATTN_SCORE_OUT(3)
  RINGATTN_SCORE_OUT(4) RINGATTN_SCORE_OUT(5) RINGATTN_SCORE_OUT(6) RINGATTN_SCORE_OUT(7)
}

// Calls fn.template operator()<M>() with M = rows as a compile-time constant, 1 <= rows <= Max.
template <int Max, class Fn>
HWY_INLINE void with_rows(Index rows, Fn&& fn) {
  if constexpr (Max > 0) {
    if (rows == Max) fn.template operator()<Max>();
    else with_rows<Max - 1>(rows, fn);
  }
}

// C = A BT over n rows and tk columns (A [n, depth] row stride lda; BT [depth, ldb]; S [n, lds],
// lds >= tk rounded up to whole column blocks); rmax[i] = row i's max over the tk columns (max
// epilogue only).
template <Epilogue E, class A>
void scores(const A* Am, Index n, Index lda, Index depth, const A* BT, Index ldb, Index tk, A* S, Index lds,
            const A* P, const A* delta, A alpha, A* rmax, A* vmax) {
  const Tag<A> d;
  const Index N = static_cast<Index>(hn::Lanes(d)), W = kScoreVecs * N;
  // Groups of column blocks whose K^T panel (depth x group) fits half of L1 are the outer loop, row
  // blocks the inner one, each row block meeting every column block of the group in turn: both the
  // panel and the row block's operands stay in L1.
  const Index group = std::max<Index>(1, kPanelBytes / (depth * W * Index(sizeof(A)))) * W;
  if constexpr (E == Epilogue::max)
    for (Index e = 0; e < n * N; ++e) vmax[e] = -std::numeric_limits<A>::infinity();
  for (Index j0 = 0; j0 < tk; j0 += group)
    for (Index i0 = 0; i0 < n; i0 += kScoreRows) {
      const Index mr = std::min<Index>(kScoreRows, n - i0);
      for (Index j = j0; j < std::min(tk, j0 + group); j += W)
        with_rows<kScoreRows>(mr, [&]<int MR>() HWY_ATTR {
          score_block<E, MR, kScoreVecs>(d, Am + i0 * lda, lda, depth, BT + j, ldb, S + i0 * lds + j, lds,
                                         P ? P + i0 * lds + j : nullptr, delta ? delta + i0 : nullptr, alpha, tk - j,
                                         vmax ? vmax + i0 * N : nullptr);
        });
    }
  if constexpr (E == Epilogue::max)
    for (Index i = 0; i < n; ++i) rmax[i] = hn::GetLane(hn::MaxOfLanes(d, hn::LoadU(d, vmax + i * N)));
}

// ---- pass 3 (and the backward's products): accumulate ----------------------------------------------

// MR rows and NV vectors of columns of O = c O + A B over `depth` (B rows of stride ldb): the
// products are summed from zero in registers, then O is loaded, scaled and added in one FMA, so the
// loads of O never stall the chains. A(i, k) is
// A[i lda + k], or A[k lda + i] when kTrans. c may be null (no rescale).
#define RINGATTN_ACC_FMA(i)                                                   \
  if constexpr (MR > i) {                                                     \
    const V a = hn::Set(d, kTrans ? Am[k * lda + i] : Am[i * lda + k]);       \
    c##i##0 = hn::MulAdd(a, b0, c##i##0);                                     \
    if constexpr (NV > 1) c##i##1 = hn::MulAdd(a, b1, c##i##1);               \
    if constexpr (NV > 2) c##i##2 = hn::MulAdd(a, b2, c##i##2);               \
    if constexpr (NV > 3) c##i##3 = hn::MulAdd(a, b3, c##i##3);               \
  }
#define RINGATTN_STORE_ROW(i)                                                                     \
  if constexpr (MR > i) {                                                                         \
    T* o = O + i * ldo;                                                                           \
    const V ci = hn::Set(d, c ? c[i] : T(1));                                                     \
    hn::StoreU(hn::MulAdd(ci, hn::LoadU(d, o), c##i##0), d, o);                                   \
    if constexpr (NV > 1) hn::StoreU(hn::MulAdd(ci, hn::LoadU(d, o + N), c##i##1), d, o + N);     \
    if constexpr (NV > 2) hn::StoreU(hn::MulAdd(ci, hn::LoadU(d, o + 2 * N), c##i##2), d, o + 2 * N); \
    if constexpr (NV > 3) hn::StoreU(hn::MulAdd(ci, hn::LoadU(d, o + 3 * N), c##i##3), d, o + 3 * N); \
  }

template <bool kTrans, int MR, int NV, class D, class T = hn::TFromD<D>>
HWY_NOINLINE void acc_block(D d, const T* HWY_RESTRICT Am, Index lda, Index depth, const T* HWY_RESTRICT B,
                            Index ldb, const T* c, T* HWY_RESTRICT O, Index ldo) {
  using V = hn::Vec<D>;
  const Index N = static_cast<Index>(hn::Lanes(d));
  RINGATTN_ACC_ROW(0) RINGATTN_ACC_ROW(1) RINGATTN_ACC_ROW(2) RINGATTN_ACC_ROW(3)
  RINGATTN_ACC_ROW(4) RINGATTN_ACC_ROW(5) RINGATTN_ACC_ROW(6) RINGATTN_ACC_ROW(7)
  for (Index k = 0; k < depth; ++k) {
    const T* b = B + k * ldb;
    const V b0 = hn::LoadU(d, b);
    V b1 = b0, b2 = b0, b3 = b0;
    if constexpr (NV > 1) b1 = hn::LoadU(d, b + N);
    if constexpr (NV > 2) b2 = hn::LoadU(d, b + 2 * N);
    if constexpr (NV > 3) b3 = hn::LoadU(d, b + 3 * N);
    RINGATTN_ACC_FMA(0) RINGATTN_ACC_FMA(1) RINGATTN_ACC_FMA(2) RINGATTN_ACC_FMA(3)
    RINGATTN_ACC_FMA(4) RINGATTN_ACC_FMA(5) RINGATTN_ACC_FMA(6) RINGATTN_ACC_FMA(7)
  }
  RINGATTN_STORE_ROW(0) RINGATTN_STORE_ROW(1) RINGATTN_STORE_ROW(2) RINGATTN_STORE_ROW(3)
  RINGATTN_STORE_ROW(4) RINGATTN_STORE_ROW(5) RINGATTN_STORE_ROW(6) RINGATTN_STORE_ROW(7)
}

// O [rows, Dc] = diag(c) O + A B (kTrans: A^T B), over `depth`; B [depth, Dc] row stride ldb, O row
// stride ldo. Whole vectors of columns in blocks of kAccVecs, then the columns past the last whole
// vector one at a time (a D that is not a multiple of the lanes).
template <bool kTrans, class A>
void accumulate(const A* Am, Index rows, Index lda, Index depth, const A* B, Index ldb, Index Dc, const A* c, A* O,
                Index ldo) {
  const Tag<A> d;
  const Index N = static_cast<Index>(hn::Lanes(d));
  const Index vecs = Dc / N;
  // Groups of column blocks whose B panel (depth x group) fits half of L1 outer, row blocks inner,
  // each row block meeting every column block of the group: A's rows and the panel stay in L1.
  const Index group = std::max<Index>(1, kPanelBytes / (depth * kAccVecs * N * Index(sizeof(A)))) * kAccVecs;
  for (Index g0 = 0; g0 < vecs; g0 += group)
    for (Index i0 = 0; i0 < rows; i0 += kAccRows) {
      const Index mr = std::min<Index>(kAccRows, rows - i0);
      const A* a = kTrans ? Am + i0 : Am + i0 * lda;
      for (Index v0 = g0; v0 < std::min(vecs, g0 + group); v0 += kAccVecs) {
        const Index nv = std::min<Index>(kAccVecs, vecs - v0);
        with_rows<kAccVecs>(nv, [&]<int NV>() HWY_ATTR {
          with_rows<kAccRows>(mr, [&]<int MR>() HWY_ATTR {
            acc_block<kTrans, MR, NV>(d, a, lda, depth, B + v0 * N, ldb, c ? c + i0 : nullptr, O + i0 * ldo + v0 * N,
                                      ldo);
          });
        });
      }
    }
  for (Index col = vecs * N; col < Dc; ++col)
    for (Index i = 0; i < rows; ++i) {
      A acc = 0;
      for (Index k = 0; k < depth; ++k)
        acc = std::fma(kTrans ? Am[k * lda + i] : Am[i * lda + k], B[k * ldb + col], acc);
      O[i * ldo + col] = std::fma(c ? c[i] : A(1), O[i * ldo + col], acc);
    }
}

// ---- pass 2: the softmax of a tile ---------------------------------------------------------------

// Row i of the n x tk tile S (row stride lds) becomes base^(S - mref[i]), times w[i] when kScale;
// sum[i] = the row's sum (before w) when sum is not null. A row with mref[i] = -inf sees no key:
// it becomes 0 and its sum 0. One vector per step into one running sum: the polynomial's constants
// stay in registers on every target (16 on AVX2) and nothing spills; the sum's chain is one add per
// step, shorter than an exponential's throughput. The lanes past tk are left as they are.
template <bool kScale, class A>
void exp_tile(A* S, Index n, Index tk, Index lds, const A* mref, const A* w, A* sum) {
  const Tag<A> d;
  using V = hn::Vec<decltype(d)>;
  const Index N = static_cast<Index>(hn::Lanes(d));
  const Index whole = tk / N * N;
  const auto tail = hn::FirstN(d, static_cast<size_t>(tk - whole));
  for (Index i = 0; i < n; ++i) {
    A* x = S + i * lds;
    if (mref[i] == -std::numeric_limits<A>::infinity()) {
      std::fill_n(x, tk, A(0));
      if (sum) sum[i] = A(0);
      continue;
    }
    const V vm = hn::Set(d, mref[i]);
    [[maybe_unused]] const V vw = hn::Set(d, kScale ? w[i] : A(1));
    V acc = hn::Zero(d);
    for (Index j = 0; j < whole; j += N) {
      const V e = Base<A>::Pow(d, hn::Sub(hn::LoadU(d, x + j), vm));
      acc = hn::Add(acc, e);
      hn::StoreU(kScale ? hn::Mul(e, vw) : e, d, x + j);
    }
    if (whole < tk) {
      const V e = hn::IfThenElseZero(tail, Base<A>::Pow(d, hn::Sub(hn::LoadU(d, x + whole), vm)));
      acc = hn::Add(acc, e);
      hn::BlendedStore(kScale ? hn::Mul(e, vw) : e, tail, d, x + whole);
    }
    if (sum) sum[i] = hn::GetLane(hn::SumOfLanes(d, acc));
  }
}

// x[i] = base^x[i] for i < n.
template <class A>
void pow_rows(A* x, Index n) {
  const Tag<A> d;
  const Index N = static_cast<Index>(hn::Lanes(d));
  for (Index i = 0; i < n; i += N) {
    const auto mask = hn::FirstN(d, static_cast<size_t>(std::min<Index>(N, n - i)));
    hn::BlendedStore(Base<A>::Pow(d, hn::MaskedLoad(mask, d, x + i)), mask, d, x + i);
  }
}

// ---- the two kernels ------------------------------------------------------------------------------

template <class S, class A>
Work forward_impl(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& mask, A scale, OnlineState<A> st,
                  Workspace<A>& ws, Progress progress) {
  const Index G = q.pk.G, D = q.pk.D, rows = q.pk.L * G, Lk = kv.pk.L;
  Work work;
  if (!block_visible(mask, q.pos, kv.pos)) return work;
  const Tiling& t = ws.tiling;
  const A alpha = static_cast<A>(double(scale) * Base<A>::kLog);
  const Index ldk = ws.ld, lds = ws.ld, ldv = ws.ldd;
  for (Index b = 0; b < q.pk.B; ++b)
    for (Index g = 0; g < q.pk.HKV; ++g) {
      const S* qg = q.q + q.pk.q_group(b, g);
      const S* kg = kv.k + kv.pk.kv_group(b, g);
      const S* vg = kv.v + kv.pk.kv_group(b, g);
      A* mg = st.m + q.pk.row_group(b, g);
      A* lg = st.l + q.pk.row_group(b, g);
      A* ag = st.acc + q.pk.q_group(b, g);
      Index q0 = 0, c0 = 0;
      walk::for_each_tile(
          mask, q.pos, G, kv.pos, rows, Lk, t, ws.R,
          [&](Index a, Index e) {  // Q' = alpha Q for the chunk's rows
            q0 = a;
            scaled_rows(qg + a * D, e - a, D, alpha, ws.qs.data());
          },
          [&](Index c, Index tk) {  // the K/V tile: K^T, and V's rows as A
            c0 = c;
            transpose_rows(kg + c * D, tk, D, ws.kt.data(), ldk);
            copy_rows(vg + c * D, tk, D, ws.vw.data(), ldv);
          },
          [&](const walk::Tile& tile, TileClass tile_cls) {
            walk::for_each_piece(mask, q.pos, G, kv.pos, tile, tile_cls, t.strip_rows,
                                 [&](const walk::Tile& p, TileClass cls) {
              const Index n = p.tq, tk = p.tk, k0 = p.c0 - c0;
              A* Sc = ws.s.data();  // the scores, then the probabilities, of the piece
              A* rmax = ws.rowmax.data();
              A* c = ws.rowc.data();
              // pass 1: S = Q' K^T; the row max as it is stored (a partial piece: after masking)
              if (cls == TileClass::partial) {
                scores<Epilogue::store, A>(ws.qs.data() + (p.r0 - q0) * D, n, D, D, ws.kt.data() + k0, ldk, tk, Sc, lds,
                                        nullptr, nullptr, A(0), nullptr, nullptr);
                walk::apply_mask(Sc, lds, mask, q.pos, G, kv.pos, p);
                for (Index i = 0; i < n; ++i) rmax[i] = *std::max_element(Sc + i * lds, Sc + i * lds + tk);
              } else {
                scores<Epilogue::max, A>(ws.qs.data() + (p.r0 - q0) * D, n, D, D, ws.kt.data() + k0, ldk, tk, Sc, lds,
                                      nullptr, nullptr, A(0), rmax, ws.vmax.data());
              }
              // pass 2: m' = max(m, rowmax), P = base^(S - m'), l' = c l + sum P, c = base^(m - m')
              A* m = mg + p.r0;
              A* l = lg + p.r0;
              A* m_new = ws.rowmax.data();  // the row max becomes the new running max
              for (Index i = 0; i < n; ++i) {
                m_new[i] = std::max(m[i], rmax[i]);
                // base^(m - m'): 0 on the first visible block, 1 once the max settles, 1 (state kept)
                // while nothing is visible yet
                c[i] = m_new[i] == -std::numeric_limits<A>::infinity() ? A(0) : m[i] - m_new[i];
              }
              exp_tile<false, A>(Sc, n, tk, lds, m_new, nullptr, ws.rowsum.data());
              std::copy_n(m_new, n, m);
              pow_rows(c, n);
              for (Index i = 0; i < n; ++i) l[i] = c[i] * l[i] + ws.rowsum[i];
              // pass 3: O = c O + P V
              accumulate<false, A>(Sc, n, lds, tk, ws.vw.data() + k0 * ldv, ldv, D, c, ag + p.r0 * D, D);
              work.flops += 4.0 * double(n) * double(tk) * double(D);
            });
            ++work.tile_pairs;
            progress();
          });
    }
  return work;
}

template <class S, class A>
Work backward_impl(const GradQueryShard<S>& gq, const KVBlock<S>& kv, const Mask& mask, A scale, A* dk, A* dv,
                   Workspace<A>& ws, Progress progress) {
  const QueryShard<S>& q = gq.q;
  const Index G = q.pk.G, D = q.pk.D, rows = q.pk.L * G, Lk = kv.pk.L;
  Work work;
  if (!block_visible(mask, q.pos, kv.pos)) return work;
  const Tiling& t = ws.tiling;
  const A alpha = static_cast<A>(double(scale) * Base<A>::kLog);
  const Index ld = ws.ld, ldd = ws.ldd;
  for (Index b = 0; b < q.pk.B; ++b)
    for (Index g = 0; g < q.pk.HKV; ++g) {
      const Index qo = q.pk.q_group(b, g), ro = q.pk.row_group(b, g), ko = kv.pk.kv_group(b, g);
      Index q0 = 0, c0 = 0;
      const A *Qc = ws.qw.data(), *dOc = ws.dow.data(), *K = ws.kw.data();
      walk::for_each_tile(
          mask, q.pos, G, kv.pos, rows, Lk, t, ws.R,
          [&](Index a, Index e) {  // the chunk's rows: Q' = alpha Q; Q and dO as A
            q0 = a;
            scaled_rows(q.q + qo + a * D, e - a, D, alpha, ws.qs.data());
            copy_rows(q.q + qo + a * D, e - a, D, ws.qw.data(), ldd);
            copy_rows(gq.dout + qo + a * D, e - a, D, ws.dow.data(), ldd);
          },
          [&](Index c, Index tk) {  // the K/V tile: K^T and V^T; K's rows as A
            c0 = c;
            transpose_rows(kv.k + ko + c * D, tk, D, ws.kt.data(), ld);
            transpose_rows(kv.v + ko + c * D, tk, D, ws.vt.data(), ld);
            copy_rows(kv.k + ko + c * D, tk, D, ws.kw.data(), ldd);
          },
          [&](const walk::Tile& tile, TileClass tile_cls) {
            walk::for_each_piece(mask, q.pos, G, kv.pos, tile, tile_cls, t.strip_rows,
                                 [&](const walk::Tile& p, TileClass cls) {
              const Index n = p.tq, tk = p.tk, k0 = p.c0 - c0, i0 = p.r0 - q0;
              A* P = ws.s.data();
              A* dS = ws.p.data();
              const A* m = gq.m + ro + p.r0;
              const A* l = gq.l + ro + p.r0;
              // pass 1: P = base^(S - m) / l, with the forward's own m (S recomputed bit for bit, so
              // S - m <= 0 and P <= 1 however large the logits) and l kept apart
              scores<Epilogue::store, A>(ws.qs.data() + i0 * D, n, D, D, ws.kt.data() + k0, ld, tk, P, ld, nullptr,
                                      nullptr, A(0), nullptr, nullptr);
              if (cls == TileClass::partial) walk::apply_mask(P, ld, mask, q.pos, G, kv.pos, p);
              A* inv = ws.rowc.data();
              for (Index i = 0; i < n; ++i) inv[i] = l[i] == A(0) ? A(0) : A(1) / l[i];  // l = 0: m = -inf, no key
              exp_tile<true, A>(P, n, tk, ld, m, inv, nullptr);
              // pass 2: dV += P^T dO
              A* dVp = dv + ko + p.c0 * D;
              accumulate<true, A>(P, tk, ld, n, dOc + i0 * ldd, ldd, D, nullptr, dVp, D);
              // pass 3: dS = scale P o (dO V^T - delta), formed as it is stored
              scores<Epilogue::grad, A>(dOc + i0 * ldd, n, ldd, D, ws.vt.data() + k0, ld, tk, dS, ld, P,
                                     gq.delta + ro + p.r0, scale, nullptr, nullptr);
              // pass 4: dQ += dS K, dK += dS^T Q
              accumulate<false, A>(dS, n, ld, tk, K + k0 * ldd, ldd, D, nullptr, gq.dq + qo + p.r0 * D, D);
              accumulate<true, A>(dS, tk, ld, n, Qc + i0 * ldd, ldd, D, nullptr, dk + ko + p.c0 * D, D);
              work.flops += 10.0 * double(n) * double(tk) * double(D);
            });
            ++work.tile_pairs;
            progress();
          });
    }
  return work;
}

// delta_i = sum_d dO_id O_id, one FMA chain over d in the order of the dP products: for a row
// whose softmax is one-hot (O is its V row exactly), dP - delta is then exactly 0, as in the
// dense reference.
template <class S, class A>
void delta_impl(const Packing& pk, const S* dout, const A* o, A* delta) {
  const hn::CappedTag<A, 1> d1;
  const Index rows = pk.row_elems(), D = pk.D;
  for (Index r = 0; r < rows; ++r) {
    auto acc = hn::Zero(d1);
    for (Index e = 0; e < D; ++e)
      acc = hn::MulAdd(hn::Set(d1, widen<A>(dout[r * D + e])), hn::Set(d1, o[r * D + e]), acc);
    delta[r] = hn::GetLane(acc);
  }
}

// The peak of this core's FMA units for A: independent chains of fused multiply-adds, the best
// rate over repetitions for `seconds`.
template <class A>
double fma_peak_impl(double seconds) {
  const Tag<A> d;
  using V = hn::Vec<decltype(d)>;
  // Distinct starting values the compiler cannot see, and a result it must keep: twelve chains it
  // can neither merge nor drop.
  static volatile A init[12] = {A(1), A(2), A(3), A(4), A(5), A(6), A(7), A(8), A(9), A(10), A(11), A(12)};
  [[maybe_unused]] static volatile A sink;
  const V a = hn::Set(d, A(0.999999)), x = hn::Set(d, A(1e-6));
  double best = 0;
  const auto t_end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  constexpr long kIters = 1 << 20;
  do {
    V c0 = hn::Set(d, init[0]), c1 = hn::Set(d, init[1]), c2 = hn::Set(d, init[2]), c3 = hn::Set(d, init[3]);
    V c4 = hn::Set(d, init[4]), c5 = hn::Set(d, init[5]), c6 = hn::Set(d, init[6]), c7 = hn::Set(d, init[7]);
    V c8 = hn::Set(d, init[8]), c9 = hn::Set(d, init[9]), c10 = hn::Set(d, init[10]), c11 = hn::Set(d, init[11]);
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < kIters; ++i) {
      c0 = hn::MulAdd(c0, a, x);
      c1 = hn::MulAdd(c1, a, x);
      c2 = hn::MulAdd(c2, a, x);
      c3 = hn::MulAdd(c3, a, x);
      c4 = hn::MulAdd(c4, a, x);
      c5 = hn::MulAdd(c5, a, x);
      c6 = hn::MulAdd(c6, a, x);
      c7 = hn::MulAdd(c7, a, x);
      c8 = hn::MulAdd(c8, a, x);
      c9 = hn::MulAdd(c9, a, x);
      c10 = hn::MulAdd(c10, a, x);
      c11 = hn::MulAdd(c11, a, x);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const V s0 = hn::Add(hn::Add(hn::Add(c0, c1), hn::Add(c2, c3)), hn::Add(hn::Add(c4, c5), hn::Add(c6, c7)));
    sink = hn::GetLane(hn::Add(s0, hn::Add(hn::Add(c8, c9), hn::Add(c10, c11))));
    best = std::max(best, 2.0 * double(hn::Lanes(d)) * 12.0 * double(kIters) / dt);
  } while (std::chrono::steady_clock::now() < t_end);
  return best;
}

// ---- what the dispatch calls ------------------------------------------------------------------

// One entry point per storage type and pass; bf16 and f16 compute in float.
#define RINGATTN_ENTRY_POINTS(NAME, S)                                                                        \
  Work Forward##NAME(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& m, accum_t<S> s,               \
                     OnlineState<accum_t<S>> st, Workspace<accum_t<S>>& ws, Progress p) {                     \
    return forward_impl<S, accum_t<S>>(q, kv, m, s, st, ws, p);                                               \
  }                                                                                                           \
  Work Backward##NAME(const GradQueryShard<S>& g, const KVBlock<S>& kv, const Mask& m, accum_t<S> s,          \
                      accum_t<S>* dk, accum_t<S>* dv, Workspace<accum_t<S>>& ws, Progress p) {                \
    return backward_impl<S, accum_t<S>>(g, kv, m, s, dk, dv, ws, p);                                          \
  }                                                                                                           \
  void Delta##NAME(const Packing& pk, const S* dout, const accum_t<S>* o, accum_t<S>* delta) {                \
    delta_impl(pk, dout, o, delta);                                                                           \
  }
RINGATTN_ENTRY_POINTS(F32, float)
RINGATTN_ENTRY_POINTS(F64, double)
RINGATTN_ENTRY_POINTS(BF16, bf16)
RINGATTN_ENTRY_POINTS(F16, f16)
#undef RINGATTN_ENTRY_POINTS
double FmaPeak(bool f64, double seconds) {
  return f64 ? fma_peak_impl<double>(seconds) : fma_peak_impl<float>(seconds);
}
const char* TargetName() { return hwy::TargetName(HWY_TARGET); }
// Columns a score block covers at once (its row stride must round up to them), and the tiles.
Index ColumnBlock(bool f64) {
  return f64 ? kScoreVecs * Index(hn::Lanes(Tag<double>())) : kScoreVecs * Index(hn::Lanes(Tag<float>()));
}
Tiling DefaultTiling() { return Tiling{kTileQ, kTileK, 32, 0}; }

}  // namespace ringattn::core::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ringattn::core {
// Overloads per storage type that call the best target's entry point.
#define RINGATTN_EXPORT(NAME, S)                                                                              \
  HWY_EXPORT(Forward##NAME);                                                                                  \
  HWY_EXPORT(Backward##NAME);                                                                                 \
  HWY_EXPORT(Delta##NAME);                                                                                    \
  Work dispatch_forward(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& mask, accum_t<S> scale,     \
                        OnlineState<accum_t<S>> st, Workspace<accum_t<S>>& ws, Progress progress) {           \
    return HWY_DYNAMIC_DISPATCH(Forward##NAME)(q, kv, mask, scale, st, ws, progress);                        \
  }                                                                                                           \
  Work dispatch_backward(const GradQueryShard<S>& g, const KVBlock<S>& kv, const Mask& mask, accum_t<S> scale, \
                         accum_t<S>* dk, accum_t<S>* dv, Workspace<accum_t<S>>& ws, Progress progress) {      \
    return HWY_DYNAMIC_DISPATCH(Backward##NAME)(g, kv, mask, scale, dk, dv, ws, progress);                   \
  }                                                                                                           \
  void dispatch_delta(const Packing& pk, const S* dout, const accum_t<S>* o, accum_t<S>* delta) {             \
    HWY_DYNAMIC_DISPATCH(Delta##NAME)(pk, dout, o, delta);                                                    \
  }
namespace {
RINGATTN_EXPORT(F32, float)
RINGATTN_EXPORT(F64, double)
RINGATTN_EXPORT(BF16, bf16)
RINGATTN_EXPORT(F16, f16)
}  // namespace
#undef RINGATTN_EXPORT

template <class S>
Work block_forward(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& mask, accum_t<S> scale,
                   OnlineState<accum_t<S>> st, Workspace<accum_t<S>>& ws, Progress progress) {
  return dispatch_forward(q, kv, mask, scale, st, ws, progress);
}

template <class S>
Work block_backward(const GradQueryShard<S>& g, const KVBlock<S>& kv, const Mask& mask, accum_t<S> scale,
                    accum_t<S>* dk, accum_t<S>* dv, Workspace<accum_t<S>>& ws, Progress progress) {
  return dispatch_backward(g, kv, mask, scale, dk, dv, ws, progress);
}

template <class S>
void compute_delta(const Packing& pk, const S* dout, const accum_t<S>* o, accum_t<S>* delta) {
  dispatch_delta(pk, dout, o, delta);
}

#define RINGATTN_INSTANTIATE(S)                                                                                   \
  template Work block_forward<S>(const QueryShard<S>&, const KVBlock<S>&, const Mask&, accum_t<S>,                \
                                 OnlineState<accum_t<S>>, Workspace<accum_t<S>>&, Progress);                      \
  template Work block_backward<S>(const GradQueryShard<S>&, const KVBlock<S>&, const Mask&, accum_t<S>,           \
                                  accum_t<S>*, accum_t<S>*, Workspace<accum_t<S>>&, Progress);                    \
  template void compute_delta<S>(const Packing&, const S*, const accum_t<S>*, accum_t<S>*);
RINGATTN_INSTANTIATE(float)
RINGATTN_INSTANTIATE(double)
RINGATTN_INSTANTIATE(bf16)
RINGATTN_INSTANTIATE(f16)
#undef RINGATTN_INSTANTIATE

HWY_EXPORT(FmaPeak);
HWY_EXPORT(TargetName);
HWY_EXPORT(ColumnBlock);
HWY_EXPORT(DefaultTiling);

namespace simd {

double fma_peak(DType t, double seconds) { return HWY_DYNAMIC_DISPATCH(FmaPeak)(t == DType::f64, seconds); }
std::string current() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }
Index column_block(std::size_t elem_size) { return HWY_DYNAMIC_DISPATCH(ColumnBlock)(elem_size == 8); }
Tiling default_tiling() { return HWY_DYNAMIC_DISPATCH(DefaultTiling)(); }

// Every target this build compiled (HWY_TARGETS), best first.
std::vector<std::int64_t> compiled_targets() {
  std::vector<std::int64_t> out;
  for (std::int64_t bits = HWY_TARGETS; bits != 0; bits &= bits - 1) out.push_back(bits & -bits);
  return out;
}

}  // namespace simd
}  // namespace ringattn::core
#endif
