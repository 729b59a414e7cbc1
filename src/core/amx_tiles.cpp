// The AMX tile products and the packers of amx_tiles.hpp: the one file compiled with AMX and AVX-512
// flags (on x86-64, when the compiler has them). The products are called only once amx::enabled()
// has checked the CPU and OS, the packers only with AMX or the dot products (bf16_dot.hpp) in use.
// It includes nothing but <immintrin.h> and C headers and defines nothing outside an unnamed
// namespace but amx_tiles.hpp's functions: an inline function of a shared header instantiated here
// would carry AVX-512 code that the linker could choose for every other caller.
#include "core/amx_tiles.hpp"

#include <string.h>

namespace ringattn::core::amx {
namespace {
// pack_pairs one value at a time: the portable packer, and the x86 one's for an odd D (whose last
// pair would take the next key's first value as a 32-bit load).
void pack_pairs_by_value(const std::uint16_t* X, Index tk, Index D, Index ldk, std::uint16_t* B) {
  const Index Dp = padded_depth(D);
  for (Index kk = 0; kk < Dp / 2; ++kk) {
    std::uint16_t* row = B + kk * 2 * ldk;
    const Index d0 = 2 * kk, d1 = 2 * kk + 1;
    for (Index j = 0; j < tk; ++j) {
      row[2 * j] = d0 < D ? X[j * D + d0] : std::uint16_t(0);
      row[2 * j + 1] = d1 < D ? X[j * D + d1] : std::uint16_t(0);
    }
    memset(row + 2 * tk, 0, sizeof(std::uint16_t) * 2 * (ldk - tk));
  }
}
}  // namespace
}  // namespace ringattn::core::amx

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512BF16__)
#include <immintrin.h>
#include <string.h>

namespace ringattn::core::amx {
namespace {

// The palette-1 tile configuration (64 bytes): tmm0-3 the 16 x 16 f32 results of a 2 x 2 block,
// tmm4-5 two 16-row A tiles, tmm6-7 two B tiles of 16 key pairs; every tile 16 rows of 64 bytes.
struct alignas(64) Config {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// C [MR x NC tiles of 16 x 16] = A B^T over Dp: MR row tiles of A (row stride Dp), NC key tiles of
// B (row stride 2 ldk), stored to C (tile t = 2 r + c at C + 256 t). Each result element is one
// chain over the depth in order, whatever the block: the same (row, key) gives the same bits.
template <int MR, int NC>
void product(const std::uint16_t* A, Index Dp, const std::uint16_t* B, Index ldk, float* C) {
  _tile_zero(0);
  if constexpr (NC > 1) _tile_zero(1);
  if constexpr (MR > 1) _tile_zero(2);
  if constexpr (MR > 1 && NC > 1) _tile_zero(3);
  const long sa = long(Dp) * 2, sb = long(ldk) * 4;
  for (Index d0 = 0; d0 < Dp; d0 += kDepthStep) {
    const std::uint16_t* b = B + d0 / 2 * 2 * ldk;
    _tile_loadd(4, A + d0, sa);
    _tile_loadd(6, b, sb);
    if constexpr (NC > 1) _tile_loadd(7, b + 2 * kTileRows, sb);
    if constexpr (MR > 1) _tile_loadd(5, A + kTileRows * Dp + d0, sa);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NC > 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MR > 1) _tile_dpbf16ps(2, 5, 6);
    if constexpr (MR > 1 && NC > 1) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, C, 64);
  if constexpr (NC > 1) _tile_stored(1, C + 256, 64);
  if constexpr (MR > 1) _tile_stored(2, C + 512, 64);
  if constexpr (MR > 1 && NC > 1) _tile_stored(3, C + 768, 64);
}

inline Index least(Index a, Index b) { return a < b ? a : b; }

// The epilogue of one 16 x 16 result tile C: rows [0, rows), keys [0, cols) of S (row stride lds).
// vmax: a vector of running maxima per row (max epilogue).
void epilogue(Epilogue e, const float* C, Index rows, Index cols, float* S, Index lds, float alpha, const float* P,
              const float* delta, float* vmax) {
  const __mmask16 keep = static_cast<__mmask16>((1u << cols) - 1u);
  const __m512 va = _mm512_set1_ps(alpha), ninf = _mm512_set1_ps(-__builtin_inff());
  for (Index i = 0; i < rows; ++i) {
    const __m512 c = _mm512_load_ps(C + 16 * i);
    float* s = S + i * lds;
    if (e == Epilogue::grad) {
      const __m512 p = _mm512_maskz_loadu_ps(keep, P + i * lds);
      _mm512_mask_storeu_ps(s, keep, _mm512_mul_ps(_mm512_mul_ps(va, p), _mm512_sub_ps(c, _mm512_set1_ps(delta[i]))));
      continue;
    }
    const __m512 v = _mm512_mul_ps(va, c);
    _mm512_mask_storeu_ps(s, keep, v);
    if (e == Epilogue::max)
      _mm512_store_ps(vmax + 16 * i, _mm512_max_ps(_mm512_load_ps(vmax + 16 * i), _mm512_mask_blend_ps(keep, ninf, v)));
  }
}

// O = c O + C over one 16 x 16 result tile: rows [0, rows), columns [0, cols) of O (row stride ldo),
// one FMA per element as the FMA kernels' accumulate ends (c null: 1).
void add_epilogue(const float* C, Index rows, Index cols, float* O, Index ldo, const float* c) {
  const __mmask16 keep = static_cast<__mmask16>((1u << cols) - 1u);
  for (Index i = 0; i < rows; ++i) {
    float* o = O + i * ldo;
    const __m512 ci = _mm512_set1_ps(c ? c[i] : 1.0f);
    _mm512_mask_storeu_ps(o, keep, _mm512_fmadd_ps(ci, _mm512_maskz_loadu_ps(keep, o), _mm512_load_ps(C + 16 * i)));
  }
}

// 16 f32 to the bits of the nearest bf16 (vcvtneps2bf16): ties to even, NaN kept (quiet), overflow
// to inf; f32 denormals become zero, as tdpbf16ps and vdpbf16ps take denormal bf16 operands anyway.
inline __m256i round_bf16(__m512 x) { return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)); }

inline __mmask16 first(Index n) { return n >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u); }

}  // namespace

bool compiled() { return true; }

// The packers are here rather than in amx_support.cpp: they are called only with AMX or with the
// dot products (bf16_dot.hpp; on x86 those need AVX-512 too), and AVX-512 moves 16 values per step
// where portable code went one by one and took as long as the products. Builds without the tile
// flags (64-bit Arm) get the portable ones below.

namespace {
// Zeros a[from, to) of a packed row in pairs of bf16, with no call: the rows are short and many.
// An odd count also zeroes a[to], which the callers allow (the next row's lead zero, or the zero
// rows after the last).
inline void zero_tail(std::uint16_t* a, Index from, Index to) {
  for (Index t = from; t < to; t += 32)
    _mm512_mask_storeu_epi32(a + t, first((to - t + 1) / 2), _mm512_setzero_si512());
}

// The 16 x 16 f32 block r[i][j] transposed in registers: r[j] holds what was column j.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: a0 b0 a1 b1 and a2 b2 a3 b3
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {  // per lane: column k of rows i .. i + 3 in r[i + k]
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
#pragma GCC unroll 4
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
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) r[j] = t[j];
}

// The word indices that interleave a register's two halves: 2 j takes word j of the low half, 2 j + 1
// word j of the high half, so that 16 values of a row and 16 of the next become 16 pairs.
inline __m512i pair_interleave() {
  alignas(64) std::uint16_t idx[32];
  for (int j = 0; j < 16; ++j) {
    idx[2 * j] = static_cast<std::uint16_t>(j);
    idx[2 * j + 1] = static_cast<std::uint16_t>(16 + j);
  }
  return _mm512_load_si512(idx);
}

template <bool B>
struct Whole {  // whether a block of 32 rows lies inside the depth (its loads then need no test)
  static constexpr bool value = B;
};

// The transposing packers' common part: A's row j is `lead` zeros, column j of a source of `depth`
// rows as bf16, zeros to Kp = padded_depth(lead + depth); then kTileRows zero rows. 32 rows by 16
// columns at a time: pair(whole, i, j0, keep) gives rows i and i + 1 from column j0 on (the columns
// in keep; zeros for rows past the depth) as 32 bf16, row i's in the low half; they are interleaved
// into 16 pairs (column j's two values as one 32-bit value) and the 16 x 16 pairs transposed as
// 32-bit values, so that each register then holds 32 values of a column. The stores of the last
// block's zeros may run one element into the next row's lead, which is zero too.
template <class Pair>
void pack_columns(Index depth, Index m, Index lead, std::uint16_t* A, Pair&& pair) {
  const Index Kp = padded_depth(lead + depth), end = lead + (depth + 31) / 32 * 32;
  const __m512i interleave = pair_interleave();
  for (Index j0 = 0; j0 < m; j0 += 16) {
    const Index cols = m - j0 < 16 ? m - j0 : 16;
    const __mmask16 keep = first(cols);
    for (Index i0 = 0; i0 < depth; i0 += 32) {
      __m512 r[16];
      auto load = [&](auto whole) {
#pragma GCC unroll 16
        for (int t = 0; t < 16; ++t)
          r[t] = _mm512_castsi512_ps(_mm512_permutexvar_epi16(interleave, pair(whole, i0 + 2 * t, j0, keep)));
      };
      if (i0 + 32 <= depth)
        load(Whole<true>{});
      else
        load(Whole<false>{});
      transpose16(r);
      std::uint16_t* const a = A + j0 * Kp + lead + i0;
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c)
        if (c < cols) _mm512_storeu_ps(a + c * Kp, r[c]);
    }
  }
  for (Index j = 0; j < m; ++j) {
    std::uint16_t* a = A + j * Kp;
    if (lead) a[0] = 0;
    zero_tail(a, end, Kp);
  }
  memset(A + m * Kp, 0, sizeof(std::uint16_t) * kTileRows * Kp);
}

}  // namespace

// Each row: 16 values at a time from `lead` on (the last step's zeros may run one element into the
// next row's lead, which is zero too), zeros to Kp.
void pack_rounded_rows(const float* P, Index n, Index depth, Index ldp, Index lead, std::uint16_t* A) {
  const Index Kp = padded_depth(lead + depth), end = lead + (depth + 15) / 16 * 16;
  for (Index i = 0; i < n; ++i) {
    std::uint16_t* a = A + i * Kp;
    const float* p = P + i * ldp;
    if (lead) a[0] = 0;
    for (Index j = 0; j < depth; j += 16) {
      const __m512 x = _mm512_maskz_loadu_ps(first(depth - j), p + j);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a + lead + j), round_bf16(x));
    }
    zero_tail(a, end, Kp);
  }
  memset(A + n * Kp, 0, sizeof(std::uint16_t) * kTileRows * Kp);
}

// P's columns as rows (see pack_columns; a gather per 16 values took as long as the products on AMD
// Zen 5, and transposing f32 before rounding moved twice the bits).
void pack_rounded_cols(const float* P, Index depth, Index m, Index ldp, Index lead, std::uint16_t* A) {
  pack_columns(depth, m, lead, A, [&](auto whole, Index i, Index j0, __mmask16 keep) {
    auto row = [&](Index r) {
      return whole.value || r < depth ? _mm512_maskz_loadu_ps(keep, P + r * ldp + j0) : _mm512_setzero_ps();
    };
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(row(i + 1), row(i)));  // row i's in the low half
  });
}

// B from keys: pairs of depth are 32-bit values, so B is X's transpose as 32-bit values, 16 x 16
// blocks at a time (an odd D, whose last pair would take the next key's first value, is copied one
// value at a time). Keys past tk load as zeros; zeros from the last block of keys to ldk, and for
// the pairs past D.
void pack_pairs(const std::uint16_t* X, Index tk, Index D, Index ldk, std::uint16_t* B) {
  const Index Dp = padded_depth(D), pairs = (D + 1) / 2, end = (tk + 15) / 16 * 16;
  if (D % 2) {
    pack_pairs_by_value(X, tk, D, ldk, B);
    return;
  }
  for (Index j0 = 0; j0 < tk; j0 += 16) {  // 16 keys' rows read whole, one after the other
    // the next 16 keys' rows asked for now: the keys come from memory, once per chunk of rows
    const Index ahead = (j0 + 32 <= tk ? 16 : tk > j0 + 16 ? tk - j0 - 16 : 0) * D * 2;
    for (Index b = 0; b < ahead; b += 64) _mm_prefetch(reinterpret_cast<const char*>(X + (j0 + 16) * D) + b, _MM_HINT_T0);
    for (Index k0 = 0; k0 < pairs; k0 += 16) {
      const __mmask16 keep = first(pairs - k0);
      __m512 r[16];
#pragma GCC unroll 16
      for (int t = 0; t < 16; ++t)
        r[t] = j0 + t < tk ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(keep, X + (j0 + t) * D + 2 * k0))
                           : _mm512_setzero_ps();
      transpose16(r);
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c)
        if (k0 + c < pairs) _mm512_storeu_ps(B + (k0 + c) * 2 * ldk + 2 * j0, r[c]);
    }
  }
  for (Index kk = 0; kk < pairs; ++kk) zero_tail(B + kk * 2 * ldk, 2 * end, 2 * ldk);
  memset(B + pairs * 2 * ldk, 0, sizeof(std::uint16_t) * 2 * ldk * (Dp / 2 - pairs));
}

// B from rows: row kk interleaves X's rows 2 kk and 2 kk + 1, 16 values of each widened to the
// 32-bit pairs (value of 2 kk, value of 2 kk + 1). A row's last values, fewer than 16, go through a
// small buffer, so that nothing is read past X.
void pack_row_pairs(const std::uint16_t* X, Index n, Index D, Index ldc, std::uint16_t* B) {
  const Index pairs = row_pairs(n), end = (D + 15) / 16 * 16;
  auto load = [&](Index r, Index d0) {
    if (r >= n) return _mm512_setzero_si512();
    if (d0 + 16 <= D) return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(X + r * D + d0)));
    alignas(32) std::uint16_t tail[16] = {};
    memcpy(tail, X + r * D + d0, sizeof(std::uint16_t) * (D - d0));
    return _mm512_cvtepu16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(tail)));
  };
  for (Index kk = 0; kk < pairs; ++kk) {
    std::uint16_t* row = B + kk * 2 * ldc;
    if (2 * kk >= n) {
      memset(row, 0, sizeof(std::uint16_t) * 2 * ldc);
      continue;
    }
    for (Index d0 = 0; d0 < D; d0 += 16)
      _mm512_storeu_si512(row + 2 * d0, _mm512_or_si512(load(2 * kk, d0), _mm512_slli_epi32(load(2 * kk + 1, d0), 16)));
    zero_tail(row, 2 * end, 2 * ldc);
  }
}

// The same for a tile already rounded and packed by rows: its values copied, not rounded again.
void pack_cols_of_rows(const std::uint16_t* X, Index n, Index m, Index Kx, Index xlead, Index lead, std::uint16_t* A) {
  pack_columns(n, m, lead, A, [&](auto whole, Index i, Index j0, __mmask16 keep) {
    auto row = [&](Index r) {
      return whole.value || r < n ? _mm512_maskz_loadu_epi16(keep, X + r * Kx + xlead + j0) : _mm512_setzero_si512();
    };
    return _mm512_inserti64x4(row(i), _mm512_castsi512_si256(row(i + 1)), 1);  // row i's in the low half
  });
}

TileScope::TileScope() {
  Config cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = kTileRows;
  }
  // ldtilecfg with the whole configuration as its operand: GCC's _tile_loadconfig names only its
  // first 8 bytes, and the stores of the rest were optimized away
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

TileScope::~TileScope() { _tile_release(); }

void scores(Epilogue e, const std::uint16_t* A, Index n, const std::uint16_t* B, Index ldk, Index tk, Index Dp,
            float* S, Index lds, float alpha, const float* P, const float* delta, float* rmax) {
  alignas(64) float C[4 * 256];
  alignas(64) float vmax[32 * 16];
  constexpr Index T = kTileRows;
  for (Index i0 = 0; i0 < n; i0 += 2 * T) {
    const int mr = n - i0 > T ? 2 : 1;
    if (e == Epilogue::max)
      for (Index r = 0; r < 2 * T; ++r) _mm512_store_ps(vmax + 16 * r, _mm512_set1_ps(-__builtin_inff()));
    for (Index j0 = 0; j0 < tk; j0 += 2 * T) {
      const int nc = tk - j0 > T ? 2 : 1;
      const std::uint16_t* a = A + i0 * Dp;
      const std::uint16_t* b = B + 2 * j0;
      if (mr == 2 && nc == 2) product<2, 2>(a, Dp, b, ldk, C);
      else if (mr == 2) product<2, 1>(a, Dp, b, ldk, C);
      else if (nc == 2) product<1, 2>(a, Dp, b, ldk, C);
      else product<1, 1>(a, Dp, b, ldk, C);
      for (int r = 0; r < mr; ++r)
        for (int c = 0; c < nc; ++c) {
          const Index i = i0 + r * T, j = j0 + c * T;
          epilogue(e, C + 256 * (2 * r + c), least(T, n - i), least(T, tk - j), S + i * lds + j, lds, alpha,
                   P ? P + i * lds + j : nullptr, delta ? delta + i : nullptr, vmax + 16 * r * T);
        }
    }
    if (e == Epilogue::max)
      for (Index r = 0; r < least(2 * T, n - i0); ++r) rmax[i0 + r] = _mm512_reduce_max_ps(_mm512_load_ps(vmax + 16 * r));
  }
}

void accumulate(const std::uint16_t* A, Index n, Index Kp, const std::uint16_t* B, Index ldc, Index D, float* O,
                Index ldo, const float* c) {
  alignas(64) float C[4 * 256];
  constexpr Index T = kTileRows;
  for (Index i0 = 0; i0 < n; i0 += 2 * T) {
    const int mr = n - i0 > T ? 2 : 1;
    for (Index j0 = 0; j0 < D; j0 += 2 * T) {
      const int nc = D - j0 > T ? 2 : 1;
      const std::uint16_t* a = A + i0 * Kp;
      const std::uint16_t* b = B + 2 * j0;
      if (mr == 2 && nc == 2) product<2, 2>(a, Kp, b, ldc, C);
      else if (mr == 2) product<2, 1>(a, Kp, b, ldc, C);
      else if (nc == 2) product<1, 2>(a, Kp, b, ldc, C);
      else product<1, 1>(a, Kp, b, ldc, C);
      for (int r = 0; r < mr; ++r)
        for (int q = 0; q < nc; ++q) {
          const Index i = i0 + r * T, j = j0 + q * T;
          add_epilogue(C + 256 * (2 * r + q), least(T, n - i), least(T, D - j), O + i * ldo + j, ldo,
                       c ? c + i : nullptr);
        }
    }
  }
}

}  // namespace ringattn::core::amx

#else  // no tile instructions in this build: amx::enabled() is false; the portable packers below
       // serve the dot products (BFDOT on 64-bit Arm)
#include <string.h>

namespace ringattn::core::amx {
namespace {
// f32 to the bits of the nearest bf16 (ties to even), NaN kept (quiet), overflow to inf.
std::uint16_t round_bf16(float x) {
  std::uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
}  // namespace

// The rounding packers for the dot products of builds without the tile flags (BFDOT on Arm).
void pack_rounded_rows(const float* P, Index n, Index depth, Index ldp, Index lead, std::uint16_t* A) {
  const Index Kp = padded_depth(lead + depth);
  for (Index i = 0; i < n; ++i) {
    std::uint16_t* a = A + i * Kp;
    for (Index j = 0; j < lead; ++j) a[j] = 0;
    for (Index j = 0; j < depth; ++j) a[lead + j] = round_bf16(P[i * ldp + j]);
    for (Index j = lead + depth; j < Kp; ++j) a[j] = 0;
  }
  memset(A + n * Kp, 0, sizeof(std::uint16_t) * kTileRows * Kp);
}

void pack_rounded_cols(const float* P, Index depth, Index m, Index ldp, Index lead, std::uint16_t* A) {
  const Index Kp = padded_depth(lead + depth);
  for (Index j = 0; j < m; ++j) {
    std::uint16_t* a = A + j * Kp;
    for (Index i = 0; i < lead; ++i) a[i] = 0;
    for (Index i = 0; i < depth; ++i) a[lead + i] = round_bf16(P[i * ldp + j]);
    for (Index i = lead + depth; i < Kp; ++i) a[i] = 0;
  }
  memset(A + m * Kp, 0, sizeof(std::uint16_t) * kTileRows * Kp);
}

void pack_cols_of_rows(const std::uint16_t* X, Index n, Index m, Index Kx, Index xlead, Index lead, std::uint16_t* A) {
  const Index Kp = padded_depth(lead + n);
  for (Index j = 0; j < m; ++j) {
    std::uint16_t* a = A + j * Kp;
    for (Index i = 0; i < lead; ++i) a[i] = 0;
    for (Index i = 0; i < n; ++i) a[lead + i] = X[i * Kx + xlead + j];
    for (Index i = lead + n; i < Kp; ++i) a[i] = 0;
  }
  memset(A + m * Kp, 0, sizeof(std::uint16_t) * kTileRows * Kp);
}

void pack_pairs(const std::uint16_t* X, Index tk, Index D, Index ldk, std::uint16_t* B) {
  pack_pairs_by_value(X, tk, D, ldk, B);
}

void pack_row_pairs(const std::uint16_t* X, Index n, Index D, Index ldc, std::uint16_t* B) {
  const Index pairs = row_pairs(n);
  for (Index kk = 0; kk < pairs; ++kk) {
    std::uint16_t* row = B + kk * 2 * ldc;
    memset(row, 0, sizeof(std::uint16_t) * 2 * ldc);
    for (Index t = 0; t < 2; ++t) {
      const Index r = 2 * kk + t;
      if (r >= n) break;
      for (Index d = 0; d < D; ++d) row[2 * d + t] = X[r * D + d];
    }
  }
}

bool compiled() { return false; }
TileScope::TileScope() {}
TileScope::~TileScope() {}
void scores(Epilogue, const std::uint16_t*, Index, const std::uint16_t*, Index, Index, Index, float*, Index, float,
            const float*, const float*, float*) {}
void accumulate(const std::uint16_t*, Index, Index, const std::uint16_t*, Index, Index, float*, Index, const float*) {}
}  // namespace ringattn::core::amx

#endif
