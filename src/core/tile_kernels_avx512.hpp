#pragma once
// The f32 tile products of the forward and backward written for AVX-512, with the K and V tiles
// transposed once for all the query tiles that meet them. Eigen's GEMM packs both operands again
// for every tile pair, zero-fills the output before each product and leaves the row max to a
// separate pass; these do neither: row operands are broadcast straight from the shard, B
// operands are read in place, the running-sum rescale is folded into loading the output rows,
// the score kernel keeps each row's max in registers and the dP kernel forms dS as it stores.
//
// Shapes, for one piece (n query rows of a tile, tk keys):
//   Q, dO [n, D] (row stride D)   KT, VT [D, tk] (row stride ldkt)   S, P, dS [n, tk] (stride lds)
//   K, V  [tk, D] (row stride D)  O, dQ [n, D], dK, dV [tk, D] (row stride D)
// Every output element is one FMA chain in a fixed order (over d for S and dP, over the shared
// dimension for the rest), so the result does not depend on how rows are blocked.
#if defined(__AVX512F__)
#include <immintrin.h>

#include <algorithm>
#include <limits>

#include "ringattn/core/shape.hpp"

namespace ringattn::core::avx512 {

// Lanes [0, n) of a 16-lane vector (all of them for n >= 16, none for n <= 0).
inline __mmask16 lanes(Index n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Calls fn.template operator()<M>() for M = rows, 1 <= rows <= Max (a row block's size as a
// compile-time constant, so its accumulators stay in registers); nothing for rows outside.
template <int Max, class Fn>
inline void with_rows(Index rows, Fn&& fn) {
  if constexpr (Max > 0) {
    if (rows == Max) fn.template operator()<Max>();
    else with_rows<Max - 1>(rows, fn);
  }
}

// The largest lane (GCC 12 warns falsely inside _mm512_reduce_max_ps).
inline float max_lane(__m512 x) {
  alignas(64) float v[16];
  _mm512_store_ps(v, x);
  return *std::max_element(v, v + 16);
}

// KT[d, j] = K[j, d] for j < tk.
inline void transpose_keys(const float* K, Index tk, Index D, float* KT, Index ldkt) {
  for (Index j = 0; j < tk; ++j)
    for (Index d = 0; d < D; ++d) KT[d * ldkt + j] = K[j * D + d];
}

// MR rows of C = A BT, 32 columns at a time, C[i, j] = sum_d A[i, d] BT[d, j], stored as
//   forward (kGrad = false): S = alpha C, and rmax[i] = max_j S[i, j];
//   backward (kGrad = true): dS = alpha P o (C - delta[i]), C = dP = dO V^T.
template <int MR, bool kGrad>
inline void scores_rows(const float* A, Index D, const float* BT, Index ldkt, Index tk, float alpha, float* S,
                        Index lds, float* rmax, const float* P, const float* delta) {
  const __m512 va = _mm512_set1_ps(alpha);
  __m512 vmax[MR];
  for (int i = 0; i < MR; ++i) vmax[i] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (Index j = 0; j < tk; j += 32) {
    const __mmask16 k0 = lanes(tk - j), k1 = lanes(tk - j - 16);
    __m512 a0[MR], a1[MR];
    for (int i = 0; i < MR; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
    const float* bt = BT + j;
    for (Index d = 0; d < D; ++d, bt += ldkt) {
      const __m512 b0 = _mm512_maskz_loadu_ps(k0, bt), b1 = _mm512_maskz_loadu_ps(k1, bt + 16);
      for (int i = 0; i < MR; ++i) {
        const __m512 x = _mm512_set1_ps(A[i * D + d]);
        a0[i] = _mm512_fmadd_ps(x, b0, a0[i]);
        a1[i] = _mm512_fmadd_ps(x, b1, a1[i]);
      }
    }
    for (int i = 0; i < MR; ++i) {
      float* s = S + i * lds + j;
      if constexpr (kGrad) {
        const __m512 di = _mm512_set1_ps(delta[i]);
        const float* p = P + i * lds + j;
        const __m512 p0 = _mm512_mul_ps(va, _mm512_maskz_loadu_ps(k0, p));
        const __m512 p1 = _mm512_mul_ps(va, _mm512_maskz_loadu_ps(k1, p + 16));
        _mm512_mask_storeu_ps(s, k0, _mm512_mul_ps(p0, _mm512_sub_ps(a0[i], di)));
        _mm512_mask_storeu_ps(s + 16, k1, _mm512_mul_ps(p1, _mm512_sub_ps(a1[i], di)));
      } else {
        const __m512 s0 = _mm512_mul_ps(va, a0[i]), s1 = _mm512_mul_ps(va, a1[i]);
        _mm512_mask_storeu_ps(s, k0, s0);
        _mm512_mask_storeu_ps(s + 16, k1, s1);
        vmax[i] = _mm512_mask_max_ps(vmax[i], k0, vmax[i], s0);
        vmax[i] = _mm512_mask_max_ps(vmax[i], k1, vmax[i], s1);
      }
    }
  }
  if constexpr (!kGrad)
    for (int i = 0; i < MR; ++i) rmax[i] = max_lane(vmax[i]);
}

inline constexpr int kScoreRows = 8;  // 16 accumulators + 8 running maxima + 2 B rows in 32 registers

template <bool kGrad>
inline void scores_any(const float* A, Index n, Index D, const float* BT, Index ldkt, Index tk, float alpha, float* S,
                       Index lds, float* rmax, const float* P, const float* delta) {
  // rows [i, i + MR): rmax only without kGrad, P and delta only with it
  auto block = [&]<int MR>(Index i) {
    scores_rows<MR, kGrad>(A + i * D, D, BT, ldkt, tk, alpha, S + i * lds, lds, kGrad ? nullptr : rmax + i,
                           kGrad ? P + i * lds : nullptr, kGrad ? delta + i : nullptr);
  };
  Index i = 0;
  for (; i + kScoreRows <= n; i += kScoreRows) block.template operator()<kScoreRows>(i);
  with_rows<kScoreRows - 1>(n - i, [&]<int MR>() { block.template operator()<MR>(i); });
}

// S = alpha Q K^T over n rows; rmax[i] = row i's max.
inline void scores(const float* Q, Index n, Index D, const float* KT, Index ldkt, Index tk, float alpha, float* S,
                   Index lds, float* rmax) {
  scores_any<false>(Q, n, D, KT, ldkt, tk, alpha, S, lds, rmax, nullptr, nullptr);
}

// dS = alpha P o (dO V^T - delta) over n rows.
inline void grad_scores(const float* dO, Index n, Index D, const float* VT, Index ldkt, Index tk, float alpha,
                        const float* P, const float* delta, float* dS, Index lds) {
  scores_any<true>(dO, n, D, VT, ldkt, tk, alpha, dS, lds, nullptr, P, delta);
}

// MR rows and 16*NV columns of O = diag(c) O + A B over `depth`, A(i, k) = A[i lda + k] or,
// kTrans, A[k lda + i]; B rows of stride D. c may be null (no rescale).
template <int MR, int NV, bool kTrans>
inline void accumulate_rows(const float* A, Index lda, const float* B, Index D, Index depth, const float* c,
                            float* O) {
  __m512 acc[MR][NV];
  for (int i = 0; i < MR; ++i) {
    const __m512 ci = _mm512_set1_ps(c ? c[i] : 1.f);
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_mul_ps(ci, _mm512_loadu_ps(O + i * D + 16 * v));
  }
  for (Index k = 0; k < depth; ++k) {
    __m512 b[NV];
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(B + k * D + 16 * v);
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(kTrans ? A[k * lda + i] : A[i * lda + k]);
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(a, b[v], acc[i][v]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(O + i * D + 16 * v, acc[i][v]);
}

inline constexpr int kAccRows = 6;  // 6 x 4 accumulators + 4 B vectors in 32 registers

template <int NV, bool kTrans>
inline void accumulate_cols(const float* A, Index rows, Index lda, const float* B, Index D, Index depth,
                            const float* c, float* O) {
  // output rows [i, i + MR)
  auto block = [&]<int MR>(Index i) {
    accumulate_rows<MR, NV, kTrans>(kTrans ? A + i : A + i * lda, lda, B, D, depth, c ? c + i : nullptr, O + i * D);
  };
  Index i = 0;
  for (; i + kAccRows <= rows; i += kAccRows) block.template operator()<kAccRows>(i);
  with_rows<kAccRows - 1>(rows - i, [&]<int MR>() { block.template operator()<MR>(i); });
}

// O = diag(c) O + A B (kTrans: A^T B) over `rows` output rows; D a multiple of 16, done 64
// columns at a time.
template <bool kTrans>
inline void accumulate_any(const float* A, Index rows, Index lda, const float* B, Index D, Index depth,
                           const float* c, float* O) {
  for (Index d0 = 0; d0 < D; d0 += 64) {
    const float* b = B + d0;
    float* o = O + d0;
    switch (std::min<Index>(64, D - d0) / 16) {
      case 4: accumulate_cols<4, kTrans>(A, rows, lda, b, D, depth, c, o); break;
      case 3: accumulate_cols<3, kTrans>(A, rows, lda, b, D, depth, c, o); break;
      case 2: accumulate_cols<2, kTrans>(A, rows, lda, b, D, depth, c, o); break;
      case 1: accumulate_cols<1, kTrans>(A, rows, lda, b, D, depth, c, o); break;
      default: break;
    }
  }
}

// O [n, D] = diag(c) O + P V, P [n, tk] of row stride lds, V [tk, D]; c may be null.
inline void accumulate(const float* P, Index n, Index lds, const float* V, Index D, Index tk, const float* c,
                       float* O) {
  accumulate_any<false>(P, n, lds, V, D, tk, c, O);
}

// O [tk, D] += P^T X, P [n, tk] of row stride lds, X [n, D].
inline void accumulate_transposed(const float* P, Index n, Index lds, const float* X, Index D, Index tk, float* O) {
  accumulate_any<true>(P, tk, lds, X, D, n, nullptr, O);
}

}  // namespace ringattn::core::avx512
#endif
