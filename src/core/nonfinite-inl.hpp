// The block kernels' exact paths for non-finite operands, for one SIMD target: rows whose softmax
// is NaN although their max does not say so, and partial pieces summed over their visible pairs
// only, so that a NaN or Inf reaches exactly the outputs that depend on it through a visible pair.
// Included by block_kernels.cpp once per SIMD target (Highway's foreach_target), hence the
// toggled guard instead of #pragma once.
#if defined(RINGATTN_CORE_NONFINITE_INL_HPP_) == defined(HWY_TARGET_TOGGLE)
#ifdef RINGATTN_CORE_NONFINITE_INL_HPP_
#undef RINGATTN_CORE_NONFINITE_INL_HPP_
#else
#define RINGATTN_CORE_NONFINITE_INL_HPP_
#endif

#include "hwy/highway.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/kernel_math-inl.hpp"  // round_bf16
#include "ringattn/core/block_attention.hpp"

HWY_BEFORE_NAMESPACE();
namespace ringattn::core::HWY_NAMESPACE {

// ---- the exact paths for non-finite operands -----------------------------------------------------

// A row of a piece whose max is -inf although it holds a score other than -inf holds a NaN that the
// vector max passed over: its max becomes NaN, so its softmax is NaN. (A row whose visible scores
// are all -inf, as a query or key holding an infinity can make them, keeps max -inf like a row that
// sees nothing here; finalize_forward makes its softmax NaN when the caller knows it saw a key.)
template <class A>
void nan_rows(const A* Sc, Index lds, Index n, Index tk, A* rmax) {
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  for (Index i = 0; i < n; ++i) {
    if (rmax[i] != kNegInf) continue;
    for (Index j = 0; j < tk; ++j)
      if (Sc[i * lds + j] != kNegInf) {
        rmax[i] = std::numeric_limits<A>::quiet_NaN();
        break;
      }
  }
}

// Pass 3 of a partial piece with non-finite operands: O = c O + P V over the visible pairs only, so
// that an invisible key's non-finite V (times its P = 0) reaches no row that does not see it.
template <class A, class Sees>
void visible_accumulate(const A* P, Index n, Index ldp, Index tk, const A* V, Index ldv, Index D, const A* c, A* O,
                        Index ldo, Sees&& sees) {
  for (Index i = 0; i < n; ++i) {
    A* o = O + i * ldo;
    for (Index d = 0; d < D; ++d) o[d] *= c[i];
    for (Index j = 0; j < tk; ++j) {
      if (!sees(i, j)) continue;
      const A pij = P[i * ldp + j];
      const A* vj = V + j * ldv;
      for (Index d = 0; d < D; ++d) o[d] = std::fma(pij, vj[d], o[d]);
    }
  }
}

// Passes 2-4 of the backward of a partial piece with non-finite operands or state, over the visible
// pairs only: dV += P^T dO, dS = scale P o (dO V^T - delta), dQ += dS K, dK += dS^T Q. The visible
// probabilities of a row whose forward went non-finite (l not finite) are NaN, as its softmax is.
// P and dS are n x tk tiles of row stride ld; VT is V^T (row stride ld), the others rows of stride
// ldd (dQ, dK, dV: D). With soft-capping (capped), dS holds the cap's derivative 1 - tanh^2 on entry
// and each dS takes it as factor: 0 for an infinite score, so that its key (or query) gets
// 0 * inf = NaN in dK (dQ) from this pair, as torch's autograd gives. With bf16 (Precision::bf16),
// dS is formed from the f32 P and the products take P and dS rounded to bf16 (round_bf16).
template <class A, class Sees>
void visible_backward(A* P, A* dS, Index n, Index tk, Index ld, const A* dO, const A* Q, const A* K, const A* VT,
                      Index ldd, Index D, const A* l, const A* delta, A scale, bool capped, bool bf16, A* dq, A* dk,
                      A* dv, Sees&& sees) {
  for (Index i = 0; i < n; ++i) {
    const bool nan_row = !std::isfinite(l[i]);
    for (Index j = 0; j < tk; ++j) {
      A& p = P[i * ld + j];
      if (!sees(i, j)) {
        p = dS[i * ld + j] = A(0);
        continue;
      }
      if (nan_row) p = std::numeric_limits<A>::quiet_NaN();
      A dp = 0;
      for (Index d = 0; d < D; ++d) dp = std::fma(dO[i * ldd + d], VT[d * ld + j], dp);
      const A f = capped ? dS[i * ld + j] : A(1);
      dS[i * ld + j] = scale * p * (dp - delta[i]) * f;
    }
  }
  for (Index i = 0; i < n; ++i)
    for (Index j = 0; j < tk; ++j) {
      if (!sees(i, j)) continue;
      const A s = bf16 ? round_bf16(dS[i * ld + j]) : dS[i * ld + j];
      const A p = bf16 ? round_bf16(P[i * ld + j]) : P[i * ld + j];
      for (Index d = 0; d < D; ++d) {
        dq[i * D + d] = std::fma(s, K[j * ldd + d], dq[i * D + d]);
        dk[j * D + d] = std::fma(s, Q[i * ldd + d], dk[j * D + d]);
        dv[j * D + d] = std::fma(p, dO[i * ldd + d], dv[j * D + d]);
      }
    }
}

}  // namespace ringattn::core::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RINGATTN_CORE_NONFINITE_INL_HPP_
