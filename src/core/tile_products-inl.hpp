// The register-blocked tile products of the block kernels for one SIMD target: score blocks
// C = A B^T with their epilogues (store, row max, gradient) and accumulate blocks
// O = c O + A B (A or A^T), grouped so the B panel stays in L1.
// Included by block_kernels.cpp once per SIMD target (Highway's foreach_target), hence the
// toggled guard instead of #pragma once.
#if defined(RINGATTN_CORE_TILE_PRODUCTS_INL_HPP_) == defined(HWY_TARGET_TOGGLE)
#ifdef RINGATTN_CORE_TILE_PRODUCTS_INL_HPP_
#undef RINGATTN_CORE_TILE_PRODUCTS_INL_HPP_
#else
#define RINGATTN_CORE_TILE_PRODUCTS_INL_HPP_
#endif

#include "hwy/highway.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/kernel_math-inl.hpp"

HWY_BEFORE_NAMESPACE();
namespace ringattn::core::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Register blocking per target: the accumulators of a score block (rows x vectors) and of an
// accumulate block, and the default tiles.
#if RINGATTN_X86_16_REGISTERS
constexpr int kScoreRows = 6, kScoreVecs = 2, kAccRows = 6, kAccVecs = 2;  // 16 registers: 12 accumulators
constexpr Index kTileQ = 96, kTileK = 256;
#elif HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
constexpr int kScoreRows = 4, kScoreVecs = 2, kAccRows = 4, kAccVecs = 2;
constexpr Index kTileQ = 64, kTileK = 128;
#elif RINGATTN_AVX512  // 32 registers of 16 floats
// 6 x 4 score blocks: 64 columns divide the 256 keys of a tile, and each depth step loads 4 vectors
// and broadcasts 6 for 24 FMAs (8 x 3 left a third of a block at the end of every row)
constexpr int kScoreRows = 6, kScoreVecs = 4, kAccRows = 6, kAccVecs = 4;
constexpr Index kTileQ = 128, kTileK = 256;
#else  // 32 registers: NEON, SVE
constexpr int kScoreRows = 8, kScoreVecs = 3, kAccRows = 6, kAccVecs = 4;
constexpr Index kTileQ = 128, kTileK = 256;
#endif

// Bytes of the B operand a product keeps in L1 while the rows stream past (half of a 32 KiB L1).
constexpr Index kPanelBytes = 16384;

// ---- sweep 1: score products ----------------------------------------------------------------------

enum class Epilogue { max, store, grad };

// NV vectors of columns [j, j + NV N) for MR rows of C = A BT over `depth` (score_block: for each
// of row_blocks blocks of MR rows, `blocks` such blocks of columns side by side):
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
HWY_NOINLINE void score_block(D d, const T* HWY_RESTRICT A0, Index lda, Index depth, const T* HWY_RESTRICT BT0,
                              Index ldb, T* HWY_RESTRICT S0, Index lds, const T* P0, const T* delta0, T alpha,
                              Index valid0, T* vmax0, Index row_blocks, Index blocks) {
  using V = hn::Vec<D>;
  const Index N = static_cast<Index>(hn::Lanes(d)), W = NV * N;
  // All of them in one call: a call per block (and the dispatch on MR and NV before it) took about
  // 4% of an AVX2 forward at D=64 on AMD Zen 4
  for (Index rb = 0; rb < row_blocks; ++rb) {
    for (Index blk = 0; blk < blocks; ++blk) {
      const T* A = A0 + rb * MR * lda;
      const T* BT = BT0 + blk * W;
      T* S = S0 + rb * MR * lds + blk * W;
      const T* P = P0 ? P0 + rb * MR * lds + blk * W : nullptr;
      const T* delta = delta0 ? delta0 + rb * MR : nullptr;
      T* vmax = vmax0 ? vmax0 + rb * MR * N : nullptr;
      const Index valid = valid0 - blk * W;
      RINGATTN_ACC_ROW(0) RINGATTN_ACC_ROW(1) RINGATTN_ACC_ROW(2) RINGATTN_ACC_ROW(3)
      RINGATTN_ACC_ROW(4) RINGATTN_ACC_ROW(5) RINGATTN_ACC_ROW(6) RINGATTN_ACC_ROW(7)
      // The last depth step is peeled: each row's outputs are stored right after its last FMAs, so the
      // stores spread over that step instead of queueing behind it (on Zen 5, 24 zmm stores at the end
      // of a depth-64 block cost 6% of its time; spread, 5%). The sums and their order are unchanged.
      if (depth <= 0) {  // nothing to sum: the block's outputs are zeros
        RINGATTN_SCORE_OUT(0) RINGATTN_SCORE_OUT(1) RINGATTN_SCORE_OUT(2) RINGATTN_SCORE_OUT(3)
        RINGATTN_SCORE_OUT(4) RINGATTN_SCORE_OUT(5) RINGATTN_SCORE_OUT(6) RINGATTN_SCORE_OUT(7)
        continue;
      }
      Index k = 0;
      auto step = [&](V& b0, V& b1, V& b2, V& b3) HWY_ATTR {
        const T* b = BT + k * ldb;
        b0 = hn::LoadU(d, b);
        b1 = b2 = b3 = b0;
        if constexpr (NV > 1) b1 = hn::LoadU(d, b + N);
        if constexpr (NV > 2) b2 = hn::LoadU(d, b + 2 * N);
        if constexpr (NV > 3) b3 = hn::LoadU(d, b + 3 * N);
      };
      for (; k + 1 < depth; ++k) {
        V b0, b1, b2, b3;
        step(b0, b1, b2, b3);
        RINGATTN_FMA_ROW(0) RINGATTN_FMA_ROW(1) RINGATTN_FMA_ROW(2) RINGATTN_FMA_ROW(3)
        RINGATTN_FMA_ROW(4) RINGATTN_FMA_ROW(5) RINGATTN_FMA_ROW(6) RINGATTN_FMA_ROW(7)
      }
      V b0, b1, b2, b3;
      step(b0, b1, b2, b3);  // k = depth - 1
      RINGATTN_FMA_ROW(0) RINGATTN_SCORE_OUT(0) RINGATTN_FMA_ROW(1) RINGATTN_SCORE_OUT(1)
      RINGATTN_FMA_ROW(2) RINGATTN_SCORE_OUT(2) RINGATTN_FMA_ROW(3) RINGATTN_SCORE_OUT(3)
      RINGATTN_FMA_ROW(4) RINGATTN_SCORE_OUT(4) RINGATTN_FMA_ROW(5) RINGATTN_SCORE_OUT(5)
      RINGATTN_FMA_ROW(6) RINGATTN_SCORE_OUT(6) RINGATTN_FMA_ROW(7) RINGATTN_SCORE_OUT(7)
    }
  }
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
  // Whole blocks of kScoreRows rows in one call, then the rows left; in each, the blocks of whole
  // vectors of columns, then a last block of only the vectors that hold columns below tk (tk need
  // not be a multiple of the block's columns: on NEON, 256 keys are 21 1/3 blocks of 3 vectors).
  auto rows = [&](Index i0, Index mr, Index row_blocks, Index j0, Index j1) HWY_ATTR {
    for (Index j = j0; j < j1;) {
      const Index nv = std::min<Index>(kScoreVecs, (tk - j + N - 1) / N);
      Index blocks = 1;
      if (nv == kScoreVecs)
        while (j + blocks * W < j1 && tk - (j + blocks * W) > (kScoreVecs - 1) * N) ++blocks;
      with_rows<kScoreVecs>(nv, [&]<int NV>() HWY_ATTR {
        with_rows<kScoreRows>(mr, [&]<int MR>() HWY_ATTR {
          score_block<E, MR, NV>(d, Am + i0 * lda, lda, depth, BT + j, ldb, S + i0 * lds + j, lds,
                                 P ? P + i0 * lds + j : nullptr, delta ? delta + i0 : nullptr, alpha, tk - j,
                                 vmax ? vmax + i0 * N : nullptr, row_blocks, blocks);
        });
      });
      j += blocks * W;
    }
  };
  const Index whole = n / kScoreRows * kScoreRows;
  for (Index j0 = 0; j0 < tk; j0 += group) {
    const Index j1 = std::min(tk, j0 + group);
    if (whole > 0) rows(0, kScoreRows, whole / kScoreRows, j0, j1);
    if (whole < n) rows(whole, n - whole, 1, j0, j1);
  }
  if constexpr (E == Epilogue::max)
    for (Index i = 0; i < n; ++i) rmax[i] = hn::GetLane(hn::MaxOfLanes(d, hn::LoadU(d, vmax + i * N)));
}

// ---- sweep 3 (and the backward's products): accumulate ----------------------------------------------

// MR rows and NV vectors of columns of O = c O + A B over `depth` (B rows of stride ldb; acc_block:
// row_blocks blocks of MR rows, each against `blocks` such blocks of columns side by side): the
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
HWY_NOINLINE void acc_block(D d, const T* HWY_RESTRICT A0, Index lda, Index depth, const T* HWY_RESTRICT B0,
                            Index ldb, const T* c0, T* HWY_RESTRICT O0, Index ldo, Index row_blocks, Index blocks) {
  using V = hn::Vec<D>;
  const Index N = static_cast<Index>(hn::Lanes(d)), W = NV * N;
  for (Index rb = 0; rb < row_blocks; ++rb) {  // in one call, as score_block's
    for (Index blk = 0; blk < blocks; ++blk) {
      const T* Am = kTrans ? A0 + rb * MR : A0 + rb * MR * lda;
      const T* B = B0 + blk * W;
      const T* c = c0 ? c0 + rb * MR : nullptr;
      T* O = O0 + rb * MR * ldo + blk * W;
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
  }
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
  // whole blocks of kAccRows rows in one call, then the rows left; in each, the whole blocks of
  // kAccVecs vectors, then the vectors left
  auto block_rows = [&](Index i0, Index mr, Index row_blocks, Index g0, Index g1) HWY_ATTR {
    const A* a = kTrans ? Am + i0 : Am + i0 * lda;
    for (Index v0 = g0; v0 < g1;) {
      const Index nv = std::min<Index>(kAccVecs, g1 - v0), blocks = nv == kAccVecs ? (g1 - v0) / kAccVecs : 1;
      with_rows<kAccVecs>(nv, [&]<int NV>() HWY_ATTR {
        with_rows<kAccRows>(mr, [&]<int MR>() HWY_ATTR {
          acc_block<kTrans, MR, NV>(d, a, lda, depth, B + v0 * N, ldb, c ? c + i0 : nullptr, O + i0 * ldo + v0 * N,
                                    ldo, row_blocks, blocks);
        });
      });
      v0 += blocks * nv;
    }
  };
  const Index whole = rows / kAccRows * kAccRows;
  for (Index g0 = 0; g0 < vecs; g0 += group) {
    const Index g1 = std::min(vecs, g0 + group);
    if (whole > 0) block_rows(0, kAccRows, whole / kAccRows, g0, g1);
    if (whole < rows) block_rows(whole, rows - whole, 1, g0, g1);
  }
  for (Index col = vecs * N; col < Dc; ++col)
    for (Index i = 0; i < rows; ++i) {
      A acc = 0;
      for (Index k = 0; k < depth; ++k)
        acc = std::fma(kTrans ? Am[k * lda + i] : Am[i * lda + k], B[k * ldb + col], acc);
      O[i * ldo + col] = std::fma(c ? c[i] : A(1), O[i * ldo + col], acc);
    }
}

}  // namespace ringattn::core::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RINGATTN_CORE_TILE_PRODUCTS_INL_HPP_
