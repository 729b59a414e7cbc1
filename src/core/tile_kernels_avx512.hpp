#pragma once
// The f32 forward's two tile products written for AVX-512, with the K tile packed once as K^T.
// Eigen's GEMM packs both operands again for every tile pair, zero-fills the output before each
// product and keeps the score tile's row max for a separate pass; these do neither: Q rows are
// broadcast straight from the shard, V rows are read in place, the running-sum rescale is folded
// into loading the output rows, and the score kernel keeps each row's max in registers.
//
// Shapes, for one piece (n query rows of a tile, tk keys):
//   Q [n, D] (row stride D)   KT [D, tk] (row stride ldkt)   S, P [n, tk] (row stride lds)
//   V [tk, D] (row stride D)  O  [n, D]  (row stride D)
// Every output element is one FMA chain in a fixed order (over d for S, over j for O), so the
// result does not depend on how rows are blocked.
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

// pass 1 for MR rows: S[i, j] = alpha sum_d Q[i, d] KT[d, j], 32 keys at a time; rmax[i] = max_j S[i, j].
template <int MR>
inline void scores_rows(const float* Q, Index D, const float* KT, Index ldkt, Index tk, float alpha, float* S,
                        Index lds, float* rmax) {
  const __m512 va = _mm512_set1_ps(alpha);
  __m512 vmax[MR];
  for (int i = 0; i < MR; ++i) vmax[i] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (Index j = 0; j < tk; j += 32) {
    const __mmask16 k0 = lanes(tk - j), k1 = lanes(tk - j - 16);
    __m512 a0[MR], a1[MR];
    for (int i = 0; i < MR; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
    const float* kt = KT + j;
    for (Index d = 0; d < D; ++d, kt += ldkt) {
      const __m512 b0 = _mm512_maskz_loadu_ps(k0, kt), b1 = _mm512_maskz_loadu_ps(k1, kt + 16);
      for (int i = 0; i < MR; ++i) {
        const __m512 q = _mm512_set1_ps(Q[i * D + d]);
        a0[i] = _mm512_fmadd_ps(q, b0, a0[i]);
        a1[i] = _mm512_fmadd_ps(q, b1, a1[i]);
      }
    }
    for (int i = 0; i < MR; ++i) {
      const __m512 s0 = _mm512_mul_ps(va, a0[i]), s1 = _mm512_mul_ps(va, a1[i]);
      _mm512_mask_storeu_ps(S + i * lds + j, k0, s0);
      _mm512_mask_storeu_ps(S + i * lds + j + 16, k1, s1);
      vmax[i] = _mm512_mask_max_ps(vmax[i], k0, vmax[i], s0);
      vmax[i] = _mm512_mask_max_ps(vmax[i], k1, vmax[i], s1);
    }
  }
  for (int i = 0; i < MR; ++i) rmax[i] = max_lane(vmax[i]);
}

inline constexpr int kScoreRows = 8;  // 16 accumulators + 8 running maxima + 2 K^T rows in 32 registers

// S = alpha Q K^T over n rows; rmax[i] = row i's max.
inline void scores(const float* Q, Index n, Index D, const float* KT, Index ldkt, Index tk, float alpha, float* S,
                   Index lds, float* rmax) {
  Index i = 0;
  for (; i + kScoreRows <= n; i += kScoreRows)
    scores_rows<kScoreRows>(Q + i * D, D, KT, ldkt, tk, alpha, S + i * lds, lds, rmax + i);
  const float* q = Q + i * D;
  float* s = S + i * lds;
  switch (n - i) {  // the last rows
    case 7: scores_rows<7>(q, D, KT, ldkt, tk, alpha, s, lds, rmax + i); break;
    case 6: scores_rows<6>(q, D, KT, ldkt, tk, alpha, s, lds, rmax + i); break;
    case 5: scores_rows<5>(q, D, KT, ldkt, tk, alpha, s, lds, rmax + i); break;
    case 4: scores_rows<4>(q, D, KT, ldkt, tk, alpha, s, lds, rmax + i); break;
    case 3: scores_rows<3>(q, D, KT, ldkt, tk, alpha, s, lds, rmax + i); break;
    case 2: scores_rows<2>(q, D, KT, ldkt, tk, alpha, s, lds, rmax + i); break;
    case 1: scores_rows<1>(q, D, KT, ldkt, tk, alpha, s, lds, rmax + i); break;
    default: break;
  }
}

// pass 3 for MR rows and 16*NV columns: O[i, :] = c[i] O[i, :] + sum_j P[i, j] V[j, :].
template <int MR, int NV>
inline void accumulate_rows(const float* P, Index lds, const float* V, Index D, Index tk, const float* c, float* O) {
  __m512 acc[MR][NV];
  for (int i = 0; i < MR; ++i) {
    const __m512 ci = _mm512_set1_ps(c[i]);
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_mul_ps(ci, _mm512_loadu_ps(O + i * D + 16 * v));
  }
  for (Index j = 0; j < tk; ++j) {
    __m512 b[NV];
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(V + j * D + 16 * v);
    for (int i = 0; i < MR; ++i) {
      const __m512 p = _mm512_set1_ps(P[i * lds + j]);
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(p, b[v], acc[i][v]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(O + i * D + 16 * v, acc[i][v]);
}

inline constexpr int kAccRows = 6;  // 6 x 4 accumulators + 4 V vectors in 32 registers

template <int NV>
inline void accumulate_cols(const float* P, Index n, Index lds, const float* V, Index D, Index tk, const float* c,
                            float* O) {
  Index i = 0;
  for (; i + kAccRows <= n; i += kAccRows)
    accumulate_rows<kAccRows, NV>(P + i * lds, lds, V, D, tk, c + i, O + i * D);
  const float* p = P + i * lds;
  float* o = O + i * D;
  switch (n - i) {
    case 5: accumulate_rows<5, NV>(p, lds, V, D, tk, c + i, o); break;
    case 4: accumulate_rows<4, NV>(p, lds, V, D, tk, c + i, o); break;
    case 3: accumulate_rows<3, NV>(p, lds, V, D, tk, c + i, o); break;
    case 2: accumulate_rows<2, NV>(p, lds, V, D, tk, c + i, o); break;
    case 1: accumulate_rows<1, NV>(p, lds, V, D, tk, c + i, o); break;
    default: break;
  }
}

// O = diag(c) O + P V over n rows; D a multiple of 16, done 64 columns at a time.
inline void accumulate(const float* P, Index n, Index lds, const float* V, Index D, Index tk, const float* c,
                       float* O) {
  for (Index d0 = 0; d0 < D; d0 += 64) {
    const float* v = V + d0;
    float* o = O + d0;
    switch (std::min<Index>(64, D - d0) / 16) {
      case 4: accumulate_cols<4>(P, n, lds, v, D, tk, c, o); break;
      case 3: accumulate_cols<3>(P, n, lds, v, D, tk, c, o); break;
      case 2: accumulate_cols<2>(P, n, lds, v, D, tk, c, o); break;
      case 1: accumulate_cols<1>(P, n, lds, v, D, tk, c, o); break;
      default: break;
    }
  }
}

}  // namespace ringattn::core::avx512
#endif
