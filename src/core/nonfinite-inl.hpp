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

// The rows of a piece whose softmax is NaN although the row max does not say so get max NaN: a row
// whose query holds a non-finite value and which sees a key here (no score of it is finite; PyTorch's
// softmax of such a row is NaN even when every score is -inf), and a row whose max is -inf although
// it holds a score other than -inf (a NaN that the vector max passed over). sees(i, j): row i sees
// key j of the piece. The first rule does not hold with soft-capping (capped): c tanh(s / c) takes
// an infinite score to +-c, so such a row's softmax is finite unless a score is NaN, and a NaN
// score reaches the row's sum through its own P = 2^(NaN - m) anyway. Nor for a row whose head has
// a finite sink (sunk(i)): its softmax holds the sink, which takes the whole weight when every
// score is -inf, and a +inf or NaN score still makes the row NaN through its max.
template <class A, class Sees, class Sunk>
void nan_rows(const A* Sc, Index lds, Index n, Index tk, const A* qs, Index D, A* rmax, Sees&& sees, bool capped,
              Sunk&& sunk) {
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  for (Index i = 0; i < n; ++i) {
    bool nan = false;
    if (rmax[i] == kNegInf)
      for (Index j = 0; j < tk && !nan; ++j) nan = Sc[i * lds + j] != kNegInf;
    if (!nan && !capped && !std::isnan(rmax[i]) && !sunk(i))
      for (Index d = 0; d < D; ++d)
        if (!std::isfinite(qs[i * D + d])) {
          for (Index j = 0; j < tk && !nan; ++j) nan = sees(i, j);
          break;
        }
    if (nan) rmax[i] = std::numeric_limits<A>::quiet_NaN();
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
