// The vdpbf16ps score products of bf16_dot.hpp: the one file compiled with AVX512_BF16 flags (on
// x86-64, when the compiler has them), called only once bf16dot::enabled() has checked the CPU and
// OS. Like amx_tiles.cpp it includes nothing but <immintrin.h> and C headers, so that no inline
// function of a shared header is emitted here with AVX-512 code the linker could pick elsewhere.
#include "core/bf16_dot.hpp"

namespace ringattn::core::bf16dot {
namespace {
// What a block does with its sums: the score epilogues of amx::scores, or O = c O + C.
// grad_rounded: grad's values rounded to bf16 and stored as the A of accumulate() (R), not as f32.
enum class Mode { max, store, grad, grad_rounded, add };
struct Out {  // what the mode reads and writes (the mode itself is the blocks' template argument)
  float* S;  // the scores, or O
  Index lds;
  float alpha = 1.0f;
  const float* P = nullptr;
  const float* delta = nullptr;
  float* rmax = nullptr;
  const float* c = nullptr;  // add: the per-row scale of O (null: 1)
  std::uint16_t* R = nullptr;  // grad_rounded: row i's column j at R + i ldr + j (the lead added)
  Index ldr = 0;
};
}  // namespace
}  // namespace ringattn::core::bf16dot

// The sweep over a product, the same for both instruction sets (block, kRows, kVecs, kLanes their
// own): column blocks outer, rows inner, so the block's B columns (depth / 2 pairs x 64 columns x 4
// bytes, 8 KiB at depth 64 on x86) stay in L1 while the rows stream past; only the vectors holding
// columns below the end are computed.
#define RINGATTN_BF16DOT_SWEEP                                                                          \
  namespace {                                                                                           \
  template <Mode M, int NV>                                                                             \
  void rows_block(int mr, const Out& o, const std::uint16_t* A, Index depth, const std::uint16_t* B,    \
                  Index ldb, Index cols, Index i, Index j) {                                            \
    switch (mr) {                                                                                       \
      case 6: if constexpr (kRows >= 6) { block<M, 6, NV>(o, A, depth, B, ldb, cols, i, j); break; }    \
        [[fallthrough]];                                                                                \
      case 5: if constexpr (kRows >= 5) { block<M, 5, NV>(o, A, depth, B, ldb, cols, i, j); break; }    \
        [[fallthrough]];                                                                                \
      case 4: block<M, 4, NV>(o, A, depth, B, ldb, cols, i, j); break;                                  \
      case 3: block<M, 3, NV>(o, A, depth, B, ldb, cols, i, j); break;                                  \
      case 2: block<M, 2, NV>(o, A, depth, B, ldb, cols, i, j); break;                                  \
      default: block<M, 1, NV>(o, A, depth, B, ldb, cols, i, j); break;                                 \
    }                                                                                                   \
  }                                                                                                     \
  template <Mode M>                                                                                     \
  void sweep(const Out& o, const std::uint16_t* A, Index n, Index depth, const std::uint16_t* B,        \
             Index ldb, Index ncols) {                                                                  \
    constexpr Index W = kVecs * kLanes;                                                                 \
    for (Index j = 0; j < ncols; j += W) {                                                              \
      const Index cols = least(W, ncols - j);                                                           \
      const int nv = static_cast<int>((cols + kLanes - 1) / kLanes);                                    \
      for (Index i = 0; i < n; i += kRows) {                                                            \
        const int mr = static_cast<int>(least(kRows, n - i));                                           \
        const std::uint16_t* a = A + i * depth;                                                         \
        const std::uint16_t* b = B + 2 * j;                                                             \
        switch (nv) {                                                                                   \
          case 4: rows_block<M, 4>(mr, o, a, depth, b, ldb, cols, i, j); break;                         \
          case 3: rows_block<M, 3>(mr, o, a, depth, b, ldb, cols, i, j); break;                         \
          case 2: rows_block<M, 2>(mr, o, a, depth, b, ldb, cols, i, j); break;                         \
          default: rows_block<M, 1>(mr, o, a, depth, b, ldb, cols, i, j); break;                        \
        }                                                                                               \
      }                                                                                                 \
    }                                                                                                   \
  }                                                                                                     \
  }                                                                                                     \
  void scores(amx::Epilogue e, const std::uint16_t* A, Index n, const std::uint16_t* B, Index ldk,      \
              Index tk, Index Dp, float* S, Index lds, float alpha, const float* P, const float* delta, \
              float* rmax) {                                                                            \
    if (e == amx::Epilogue::max)                                                                        \
      for (Index i = 0; i < n; ++i) rmax[i] = -__builtin_inff();                                        \
    const Out o{S, lds, alpha, P, delta, rmax, nullptr};                                                \
    if (e == amx::Epilogue::max)                                                                        \
      sweep<Mode::max>(o, A, n, Dp, B, ldk, tk);                                                        \
    else if (e == amx::Epilogue::store)                                                                 \
      sweep<Mode::store>(o, A, n, Dp, B, ldk, tk);                                                      \
    else                                                                                                \
      sweep<Mode::grad>(o, A, n, Dp, B, ldk, tk);                                                       \
  }                                                                                                     \
  void grad_rounded(const std::uint16_t* A, Index n, const std::uint16_t* B, Index ldk, Index tk,       \
                    Index Dp, float alpha, const float* P, Index ldp, const float* delta, Index lead,   \
                    std::uint16_t* dS) {                                                                \
    const Index Kp = amx::padded_depth(lead + tk);                                                      \
    Out o{nullptr, ldp, alpha, P, delta, nullptr, nullptr, dS + lead, Kp};                              \
    sweep<Mode::grad_rounded>(o, A, n, Dp, B, ldk, tk);                                                 \
    for (Index i = 0; i < n; ++i) { /* the lead, and zeros from the last key to Kp */                   \
      std::uint16_t* a = dS + i * Kp;                                                                   \
      a[0] = lead ? 0 : a[0];                                                                           \
      for (Index t = lead + tk; t < Kp; ++t) a[t] = 0;                                                  \
    }                                                                                                   \
    memset(dS + n * Kp, 0, sizeof(std::uint16_t) * amx::kTileRows * Kp);                                \
  }                                                                                                     \
  void accumulate(const std::uint16_t* A, Index n, Index Kp, const std::uint16_t* B, Index ldc,         \
                  Index D, float* O, Index ldo, const float* c) {                                       \
    sweep<Mode::add>(Out{O, ldo, 1.0f, nullptr, nullptr, nullptr, c}, A, n, Kp, B, ldc, D);             \
  }

// The peak of either instruction set (peak_window and kWindowFlops their own): windows of 2^20
// iterations (about 2 ms on the cores above) until `seconds` have passed, the best window's rate.
#define RINGATTN_BF16DOT_PEAK                                                                           \
  double peak(double seconds) {                                                                         \
    if (!available()) return 0;                                                                         \
    [[maybe_unused]] static volatile float sink;                                                        \
    constexpr long kIters = 1 << 20;                                                                    \
    double best = 0, spent = 0;                                                                         \
    do {                                                                                                \
      timespec t0, t1;                                                                                  \
      clock_gettime(CLOCK_MONOTONIC, &t0);                                                              \
      sink = peak_window(kIters);                                                                       \
      clock_gettime(CLOCK_MONOTONIC, &t1);                                                              \
      const double t = double(t1.tv_sec - t0.tv_sec) + 1e-9 * double(t1.tv_nsec - t0.tv_nsec);          \
      spent += t;                                                                                       \
      if (t > 0 && kWindowFlops * kIters / t > best) best = kWindowFlops * kIters / t;                  \
    } while (spent < seconds);                                                                          \
    return best * 1e-9;                                                                                 \
  }

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#include <time.h>
#include <string.h>

// GCC 12's _mm512_undefined_ps (inside _mm512_max_ps and _mm512_reduce_max_ps) initialises a
// variable with itself, which -Wuninitialized reports once the max epilogue has a block of its own.
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace ringattn::core::bf16dot {
namespace {

constexpr Index kLanes = 16;  // f32 lanes of a zmm: columns per vector of results
constexpr int kRows = 6, kVecs = 4;  // 24 accumulators, 4 B vectors and a broadcast of 32 registers

inline Index least(Index a, Index b) { return a < b ? a : b; }

// The epilogue of a block: its sums c for rows i0 .. i0 + MR - 1 and the columns below `cols` from
// column j0 on; it reads Out once, and its masks are the same for every row. kFull (every block but
// a tile's last): all 16 NV columns, loaded and stored whole.
template <Mode M, int MR, int NV, bool kFull>
inline void epilogue(const Out& o, const __m512 (&c)[MR][NV], Index cols, Index i0, Index j0) {
  auto load = [](__mmask16 k, const float* p) { return kFull ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(k, p); };
  auto store = [](float* p, __mmask16 k, __m512 x) {
    if constexpr (kFull)
      _mm512_storeu_ps(p, x);
    else
      _mm512_mask_storeu_ps(p, k, x);
  };
  float* const S = o.S;
  const Index lds = o.lds;
  const __m512 va = _mm512_set1_ps(o.alpha), ninf = _mm512_set1_ps(-__builtin_inff());
  __mmask16 keep[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) keep[v] = static_cast<__mmask16>((1u << least(kLanes, cols - kLanes * v)) - 1u);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    const Index i = i0 + r;
    float* const s = M == Mode::grad_rounded ? nullptr : S + i * lds + j0;
    __m512 vmax = ninf;
    // add: row i's scale of O, read once (the stores to O could alias it)
    [[maybe_unused]] const __m512 ci = _mm512_set1_ps(M == Mode::add && o.c ? o.c[i] : 1.0f);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* const sv = M == Mode::grad_rounded ? nullptr : s + kLanes * v;
      if constexpr (M == Mode::add) {
        store(sv, keep[v], _mm512_fmadd_ps(ci, load(keep[v], sv), c[r][v]));
      } else if constexpr (M == Mode::grad || M == Mode::grad_rounded) {
        const __m512 p = load(keep[v], o.P + i * lds + j0 + kLanes * v);
        const __m512 dp = _mm512_sub_ps(c[r][v], _mm512_set1_ps(o.delta[i]));
        const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(va, p), dp);
        if constexpr (M == Mode::grad) {
          store(sv, keep[v], ds);
        } else {  // whole vectors, zeros past the columns: the last may write one zero into the
                  // next row's lead (or the zero rows after the last), as pack_rounded_rows does
          const __m256bh b = _mm512_cvtneps_pbh(kFull ? ds : _mm512_maskz_mov_ps(keep[v], ds));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.R + i * o.ldr + j0 + kLanes * v), (__m256i)b);
        }
      } else {
        const __m512 x = _mm512_mul_ps(va, c[r][v]);
        store(sv, keep[v], x);
        if constexpr (M == Mode::max) vmax = _mm512_max_ps(vmax, kFull ? x : _mm512_mask_blend_ps(keep[v], ninf, x));
      }
    }
    if constexpr (M == Mode::max) {  // rmax[i] = m when m > rmax[i], without a branch
      const __m128 m = _mm_set_ss(_mm512_reduce_max_ps(vmax));
      _mm_store_ss(o.rmax + i, _mm_max_ss(m, _mm_load_ss(o.rmax + i)));
    }
  }
}

// MR rows [0, MR) of A (row stride `depth`) against NV vectors of 16 columns of B (pairs of depth,
// from column 0 of `B`, row stride 2 ldb) over `depth`, then the epilogue for the columns below
// `cols` (cols > 16 (NV - 1)). Each lane's sum is one chain over the depth in order, odd depth
// before even within a pair (the instruction's order), whatever the block: the same (row, column)
// gives the same bits.
template <Mode M, int MR, int NV>
void block(const Out& o, const std::uint16_t* A, Index depth, const std::uint16_t* B, Index ldb, Index cols,
           Index i0, Index j0) {
  __m512 c[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) c[r][v] = _mm512_setzero_ps();
  for (Index kk = 0; kk < depth / 2; ++kk) {
    __m512i b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_si512(B + kk * 2 * ldb + 2 * kLanes * v);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      int pair;
      memcpy(&pair, A + r * depth + 2 * kk, sizeof pair);
      const __m512i a = _mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], (__m512bh)a, (__m512bh)b[v]);
    }
  }
  if (cols == kLanes * NV)
    epilogue<M, MR, NV, true>(o, c, cols, i0, j0);
  else
    epilogue<M, MR, NV, false>(o, c, cols, i0, j0);
}

// Sixteen chains of the instruction over one window (twelve reach only 93% of the rate on AMD
// Zen 5, whose latency for it is more than six issue intervals); returns their sum so that none is
// dropped.
constexpr int kChains = 16;
float peak_window(long iters) {
  static volatile float init[kChains] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  __m512 c[kChains];
#pragma GCC unroll 16
  for (int k = 0; k < kChains; ++k) c[k] = _mm512_set1_ps(init[k]);
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3a833a83), b = (__m512bh)_mm512_set1_epi32(0x3a833a83);  // ~0.001
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kChains; ++k) c[k] = _mm512_dpbf16_ps(c[k], a, b);
  }
  __m512 sum = c[0];
#pragma GCC unroll 15
  for (int k = 1; k < kChains; ++k) sum = _mm512_add_ps(sum, c[k]);
  return _mm512_reduce_add_ps(sum);
}
constexpr double kWindowFlops = kChains * 16.0 * 2 * 2;  // per iteration: instructions of 16 lanes x 2 products

}  // namespace

bool compiled() { return true; }

RINGATTN_BF16DOT_SWEEP
RINGATTN_BF16DOT_PEAK

}  // namespace ringattn::core::bf16dot

#elif defined(__aarch64__) && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
#include <arm_neon.h>
#include <string.h>
#include <time.h>

namespace ringattn::core::bf16dot {
namespace {

// BFDOT on 64-bit Arm with FEAT_BF16: a 128-bit vector holds 4 f32 lanes (4 columns), each taking
// a pair of bf16 products from the B row and one pair of the A row, chosen by lane index: one load
// of A serves four depth pairs.
constexpr Index kLanes = 4;
constexpr int kRows = 4, kVecs = 4;  // 16 accumulators, 4 A and 4 B vectors of 32 registers

inline Index least(Index a, Index b) { return a < b ? a : b; }

// f32 to the bits of the nearest bf16 (ties to even), NaN kept (quiet), overflow to inf: as the
// rounding packers of this build (amx_tiles.cpp) round.
inline std::uint16_t round_bf16(float x) {
  std::uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <Mode M, int MR, int NV>
void block(const Out& o, const std::uint16_t* A, Index depth, const std::uint16_t* B, Index ldb, Index cols,
           Index i0, Index j0) {
  float32x4_t c[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) c[r][v] = vdupq_n_f32(0.f);
  // four depth pairs at a time (depth is a multiple of 32)
  for (Index kk = 0; kk < depth / 2; kk += 4) {
    bfloat16x8_t a[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) a[r] = vld1q_bf16(reinterpret_cast<const bfloat16_t*>(A + r * depth + 2 * kk));
#define RINGATTN_BFDOT_PAIR(LANE)                                                                          \
    {                                                                                                       \
      bfloat16x8_t b[NV];                                                                                   \
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) b[v] =                                           \
          vld1q_bf16(reinterpret_cast<const bfloat16_t*>(B + (kk + LANE) * 2 * ldb + 2 * kLanes * v));      \
      _Pragma("GCC unroll 8") for (int r = 0; r < MR; ++r)                                                  \
          _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) c[r][v] =                                    \
              vbfdotq_laneq_f32(c[r][v], b[v], a[r], LANE);                                                 \
    }
    RINGATTN_BFDOT_PAIR(0) RINGATTN_BFDOT_PAIR(1) RINGATTN_BFDOT_PAIR(2) RINGATTN_BFDOT_PAIR(3)
#undef RINGATTN_BFDOT_PAIR
  }
  for (int r = 0; r < MR; ++r) {
    const Index i = i0 + r;
    [[maybe_unused]] float m = -__builtin_inff();  // the row max (Mode::max)
    for (int v = 0; v < NV; ++v) {
      const Index j = j0 + kLanes * v, left = least(kLanes, cols - kLanes * v);
      float x[4];
      vst1q_f32(x, c[r][v]);
      float* s = M == Mode::grad_rounded ? nullptr : o.S + i * o.lds + j;
      for (Index t = 0; t < left; ++t) {
        if constexpr (M == Mode::add) {
          s[t] = __builtin_fmaf(o.c ? o.c[i] : 1.0f, s[t], x[t]);
        } else if constexpr (M == Mode::grad) {
          s[t] = o.alpha * o.P[i * o.lds + j + t] * (x[t] - o.delta[i]);
        } else if constexpr (M == Mode::grad_rounded) {
          o.R[i * o.ldr + j + t] = round_bf16(o.alpha * o.P[i * o.lds + j + t] * (x[t] - o.delta[i]));
        } else {
          s[t] = o.alpha * x[t];
          if constexpr (M == Mode::max) m = s[t] > m ? s[t] : m;
        }
      }
    }
    if constexpr (M == Mode::max) o.rmax[i] = m > o.rmax[i] ? m : o.rmax[i];
  }
}

constexpr int kChains = 16;  // as on x86: more than the latency over the issue interval
float peak_window(long iters) {
  static volatile float init[kChains] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  float32x4_t c[kChains];
  for (int k = 0; k < kChains; ++k) c[k] = vdupq_n_f32(init[k]);
  const bfloat16x8_t a = vreinterpretq_bf16_u16(vdupq_n_u16(0x3a83)), b = a;  // ~0.001
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kChains; ++k) c[k] = vbfdotq_f32(c[k], a, b);
  }
  float32x4_t sum = c[0];
  for (int k = 1; k < kChains; ++k) sum = vaddq_f32(sum, c[k]);
  return vaddvq_f32(sum);
}
constexpr double kWindowFlops = kChains * 4.0 * 2 * 2;  // per iteration: instructions of 4 lanes x 2 products

}  // namespace

bool compiled() { return true; }

RINGATTN_BF16DOT_SWEEP
RINGATTN_BF16DOT_PEAK

}  // namespace ringattn::core::bf16dot

#else  // no AVX512_BF16 (x86) or BF16 (Arm) in this build: bf16dot::enabled() is false and nothing here is called

namespace ringattn::core::bf16dot {
bool compiled() { return false; }
double peak(double) { return 0; }
void scores(amx::Epilogue, const std::uint16_t*, Index, const std::uint16_t*, Index, Index, Index, float*, Index, float,
            const float*, const float*, float*) {}
void grad_rounded(const std::uint16_t*, Index, const std::uint16_t*, Index, Index, Index, float, const float*, Index,
                  const float*, Index, std::uint16_t*) {}
void accumulate(const std::uint16_t*, Index, Index, const std::uint16_t*, Index, Index, float*, Index, const float*) {}
}  // namespace ringattn::core::bf16dot

#endif
