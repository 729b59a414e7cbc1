// The vdpbf16ps score products of bf16_dot.hpp: the one file compiled with AVX512_BF16 flags (on
// x86-64, when the compiler has them), called only once bf16dot::enabled() has checked the CPU and
// OS. Like amx_tiles.cpp it includes nothing but <immintrin.h> and C headers, so that no inline
// function of a shared header is emitted here with AVX-512 code the linker could pick elsewhere.
#include "core/bf16_dot.hpp"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#include <string.h>

namespace ringattn::core::bf16dot {
namespace {

constexpr Index kLanes = 16;  // f32 lanes of a zmm: keys per vector of results
constexpr int kRows = 6, kVecs = 4;  // 24 accumulators, 4 key vectors and a broadcast of 32 registers

inline Index least(Index a, Index b) { return a < b ? a : b; }

// MR rows [0, MR) of A (row stride Dp) against NV vectors of 16 keys of B (from key 0 of `B`, row
// stride 2 ldk) over Dp, then the epilogue for the keys below `cols` (cols > 16 (NV - 1)). Each
// lane's sum is one chain over the depth in order, odd depth before even within a pair (the
// instruction's order), whatever the block: the same (row, key) gives the same bits.
template <int MR, int NV>
void block(amx::Epilogue e, const std::uint16_t* A, Index Dp, const std::uint16_t* B, Index ldk, Index cols,
           float* S, Index lds, float alpha, const float* P, const float* delta, float* rmax) {
  __m512 c[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) c[r][v] = _mm512_setzero_ps();
  const Index pairs = Dp / 2, ldb = 2 * ldk;
  for (Index kk = 0; kk < pairs; ++kk) {
    __m512i b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_si512(B + kk * ldb + 2 * kLanes * v);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      int pair;
      memcpy(&pair, A + r * Dp + 2 * kk, sizeof pair);
      const __m512i a = _mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], (__m512bh)a, (__m512bh)b[v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), ninf = _mm512_set1_ps(-__builtin_inff());
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    __m512 vmax = ninf;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const Index left = least(kLanes, cols - kLanes * v);
      const __mmask16 keep = static_cast<__mmask16>((1u << left) - 1u);
      float* s = S + r * lds + kLanes * v;
      if (e == amx::Epilogue::grad) {
        const __m512 p = _mm512_maskz_loadu_ps(keep, P + r * lds + kLanes * v);
        _mm512_mask_storeu_ps(s, keep, _mm512_mul_ps(_mm512_mul_ps(va, p), _mm512_sub_ps(c[r][v], _mm512_set1_ps(delta[r]))));
        continue;
      }
      const __m512 x = _mm512_mul_ps(va, c[r][v]);
      _mm512_mask_storeu_ps(s, keep, x);
      if (e == amx::Epilogue::max) vmax = _mm512_max_ps(vmax, _mm512_mask_blend_ps(keep, ninf, x));
    }
    if (e == amx::Epilogue::max) {
      const float m = _mm512_reduce_max_ps(vmax);
      if (m > rmax[r]) rmax[r] = m;
    }
  }
}

template <int NV>
void rows_block(int mr, amx::Epilogue e, const std::uint16_t* A, Index Dp, const std::uint16_t* B, Index ldk,
                Index cols, float* S, Index lds, float alpha, const float* P, const float* delta, float* rmax) {
  switch (mr) {
    case 6: block<6, NV>(e, A, Dp, B, ldk, cols, S, lds, alpha, P, delta, rmax); break;
    case 5: block<5, NV>(e, A, Dp, B, ldk, cols, S, lds, alpha, P, delta, rmax); break;
    case 4: block<4, NV>(e, A, Dp, B, ldk, cols, S, lds, alpha, P, delta, rmax); break;
    case 3: block<3, NV>(e, A, Dp, B, ldk, cols, S, lds, alpha, P, delta, rmax); break;
    case 2: block<2, NV>(e, A, Dp, B, ldk, cols, S, lds, alpha, P, delta, rmax); break;
    default: block<1, NV>(e, A, Dp, B, ldk, cols, S, lds, alpha, P, delta, rmax); break;
  }
}

}  // namespace

bool compiled() { return true; }

void scores(amx::Epilogue e, const std::uint16_t* A, Index n, const std::uint16_t* B, Index ldk, Index tk, Index Dp,
            float* S, Index lds, float alpha, const float* P, const float* delta, float* rmax) {
  if (e == amx::Epilogue::max)
    for (Index i = 0; i < n; ++i) rmax[i] = -__builtin_inff();
  constexpr Index W = kVecs * kLanes;
  // Key blocks outer, rows inner: the block's keys (Dp / 2 x 64 keys x 4 bytes, 8 KiB at D = 64)
  // stay in L1 while the rows stream past.
  for (Index j = 0; j < tk; j += W) {
    const Index cols = least(W, tk - j);
    const int nv = static_cast<int>((cols + kLanes - 1) / kLanes);  // only vectors holding keys below tk
    for (Index i = 0; i < n; i += kRows) {
      const int mr = static_cast<int>(least(kRows, n - i));
      const std::uint16_t* a = A + i * Dp;
      const std::uint16_t* b = B + 2 * j;
      float* s = S + i * lds + j;
      const float* p = P ? P + i * lds + j : nullptr;
      const float* dl = delta ? delta + i : nullptr;
      float* rm = rmax ? rmax + i : nullptr;
      switch (nv) {
        case 4: rows_block<4>(mr, e, a, Dp, b, ldk, cols, s, lds, alpha, p, dl, rm); break;
        case 3: rows_block<3>(mr, e, a, Dp, b, ldk, cols, s, lds, alpha, p, dl, rm); break;
        case 2: rows_block<2>(mr, e, a, Dp, b, ldk, cols, s, lds, alpha, p, dl, rm); break;
        default: rows_block<1>(mr, e, a, Dp, b, ldk, cols, s, lds, alpha, p, dl, rm); break;
      }
    }
  }
}

}  // namespace ringattn::core::bf16dot

#elif defined(__aarch64__) && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
#include <arm_neon.h>
#include <string.h>

namespace ringattn::core::bf16dot {
namespace {

// BFDOT on 64-bit Arm with FEAT_BF16: a 128-bit vector holds 4 f32 lanes (4 keys), each taking a
// pair of bf16 products from the B row and one pair of the A row, chosen by lane index: one load
// of A serves four depth pairs.
constexpr Index kLanes = 4;
constexpr int kRows = 4, kVecs = 4;  // 16 accumulators, 4 A and 4 B vectors of 32 registers

inline Index least(Index a, Index b) { return a < b ? a : b; }

template <int MR, int NV>
void block(amx::Epilogue e, const std::uint16_t* A, Index Dp, const std::uint16_t* B, Index ldk, Index cols,
           float* S, Index lds, float alpha, const float* P, const float* delta, float* rmax) {
  float32x4_t c[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) c[r][v] = vdupq_n_f32(0.f);
  const Index ldb = 2 * ldk;
  // four depth pairs at a time (Dp is a multiple of 32)
  for (Index kk = 0; kk < Dp / 2; kk += 4) {
    bfloat16x8_t a[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) a[r] = vld1q_bf16(reinterpret_cast<const bfloat16_t*>(A + r * Dp + 2 * kk));
#define RINGATTN_BFDOT_PAIR(LANE)                                                                          \
    {                                                                                                       \
      bfloat16x8_t b[NV];                                                                                   \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) b[v] =                                           \
          vld1q_bf16(reinterpret_cast<const bfloat16_t*>(B + (kk + LANE) * ldb + 2 * kLanes * v));          \
      _Pragma("GCC unroll 8") for (int r = 0; r < MR; ++r)                                                  \
          _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) c[r][v] =                                    \
              vbfdotq_laneq_f32(c[r][v], b[v], a[r], LANE);                                                 \
    }
    RINGATTN_BFDOT_PAIR(0) RINGATTN_BFDOT_PAIR(1) RINGATTN_BFDOT_PAIR(2) RINGATTN_BFDOT_PAIR(3)
#undef RINGATTN_BFDOT_PAIR
  }
  for (int r = 0; r < MR; ++r) {
    float m = -__builtin_inff();
    for (int v = 0; v < NV; ++v) {
      const Index left = least(kLanes, cols - kLanes * v);
      float x[4];
      vst1q_f32(x, c[r][v]);
      float* s = S + r * lds + kLanes * v;
      for (Index t = 0; t < left; ++t) {
        if (e == amx::Epilogue::grad) {
          s[t] = alpha * P[r * lds + kLanes * v + t] * (x[t] - delta[r]);
        } else {
          s[t] = alpha * x[t];
          if (s[t] > m) m = s[t];
        }
      }
    }
    if (e == amx::Epilogue::max && m > rmax[r]) rmax[r] = m;
  }
}

template <int NV>
void rows_block(int mr, amx::Epilogue e, const std::uint16_t* A, Index Dp, const std::uint16_t* B, Index ldk,
                Index cols, float* S, Index lds, float alpha, const float* P, const float* delta, float* rmax) {
  switch (mr) {
    case 4: block<4, NV>(e, A, Dp, B, ldk, cols, S, lds, alpha, P, delta, rmax); break;
    case 3: block<3, NV>(e, A, Dp, B, ldk, cols, S, lds, alpha, P, delta, rmax); break;
    case 2: block<2, NV>(e, A, Dp, B, ldk, cols, S, lds, alpha, P, delta, rmax); break;
    default: block<1, NV>(e, A, Dp, B, ldk, cols, S, lds, alpha, P, delta, rmax); break;
  }
}

}  // namespace

bool compiled() { return true; }

void scores(amx::Epilogue e, const std::uint16_t* A, Index n, const std::uint16_t* B, Index ldk, Index tk, Index Dp,
            float* S, Index lds, float alpha, const float* P, const float* delta, float* rmax) {
  if (e == amx::Epilogue::max)
    for (Index i = 0; i < n; ++i) rmax[i] = -__builtin_inff();
  constexpr Index W = kVecs * kLanes;
  for (Index j = 0; j < tk; j += W) {
    const Index cols = least(W, tk - j);
    const int nv = static_cast<int>((cols + kLanes - 1) / kLanes);
    for (Index i = 0; i < n; i += kRows) {
      const int mr = static_cast<int>(least(kRows, n - i));
      const std::uint16_t* a = A + i * Dp;
      const std::uint16_t* b = B + 2 * j;
      float* s = S + i * lds + j;
      const float* p = P ? P + i * lds + j : nullptr;
      const float* dl = delta ? delta + i : nullptr;
      float* rm = rmax ? rmax + i : nullptr;
      switch (nv) {
        case 4: rows_block<4>(mr, e, a, Dp, b, ldk, cols, s, lds, alpha, p, dl, rm); break;
        case 3: rows_block<3>(mr, e, a, Dp, b, ldk, cols, s, lds, alpha, p, dl, rm); break;
        case 2: rows_block<2>(mr, e, a, Dp, b, ldk, cols, s, lds, alpha, p, dl, rm); break;
        default: rows_block<1>(mr, e, a, Dp, b, ldk, cols, s, lds, alpha, p, dl, rm); break;
      }
    }
  }
}

}  // namespace ringattn::core::bf16dot

#else  // no AVX512_BF16 (x86) or BF16 (Arm) in this build: bf16dot::enabled() is false and nothing here is called

namespace ringattn::core::bf16dot {
bool compiled() { return false; }
void scores(amx::Epilogue, const std::uint16_t*, Index, const std::uint16_t*, Index, Index, Index, float*, Index, float,
            const float*, const float*, float*) {}
}  // namespace ringattn::core::bf16dot

#endif
