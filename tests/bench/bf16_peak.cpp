// The peaks of one x86 core's f32 and bf16 arithmetic, register to register: the f32 FMA
// (vfmadd231ps, zmm and ymm), the AVX512_BF16 dot product (vdpbf16ps, zmm: 32 bf16 products summed
// pairwise into 16 f32 lanes) and AMX (tdpbf16ps: a 16x32 by 32x16 bf16 tile product into 16x16
// f32), each with independent accumulators and no memory traffic, the best window of about 1 ms
// over half a second (a window another process interrupted only counts less). Flops count a multiply and an add per product. A standalone tool (not built by CMake):
//
//   g++ -O2 -std=c++20 tests/bench/bf16_peak.cpp -o build/bf16_peak && build/bf16_peak
//
// Each instruction set is compiled with its own target attribute and run only when the CPU
// reports it (and, for AMX, when Linux grants the tile data state: arch_prctl ARCH_REQ_XCOMP_PERM).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

using Clock = std::chrono::steady_clock;
volatile float g_sink;

// GFLOP/s of the best window of `iters` steps of body (flops_per_iter each) over half a second.
template <class Body>
double best_rate(double flops_per_iter, long iters, Body body) {
  double best = 0;
  const auto end = Clock::now() + std::chrono::milliseconds(500);
  while (Clock::now() < end) {
    const auto t0 = Clock::now();
    body(iters);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, flops_per_iter * double(iters) / dt);
  }
  return best * 1e-9;
}

#define CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
// vdpbf16ps needs more: on AMD Zen 5, 12 chains reach 93% of what 16 or 24 do (its latency is
// more than six times its issue interval there)
#define DP_CHAINS(X) CHAINS(X) X(12) X(13) X(14) X(15)

__attribute__((target("avx512f"))) void fma_zmm(long n) {
#define DECL(i) __m512 c##i = _mm512_set1_ps(float(i));
  CHAINS(DECL)
#undef DECL
  const __m512 a = _mm512_set1_ps(0.999999f), x = _mm512_set1_ps(1e-6f);
  for (long k = 0; k < n; ++k) {
#define STEP(i) c##i = _mm512_fmadd_ps(c##i, a, x);
    CHAINS(STEP)
#undef STEP
    __asm__ volatile("" ::: "memory");
  }
  __m512 s = _mm512_setzero_ps();
#define SUM(i) s = _mm512_add_ps(s, c##i);
  CHAINS(SUM)
#undef SUM
  float out[16];
  _mm512_storeu_ps(out, s);
  g_sink = out[0];
}

__attribute__((target("avx2,fma"))) void fma_ymm(long n) {
#define DECL(i) __m256 c##i = _mm256_set1_ps(float(i));
  CHAINS(DECL)
#undef DECL
  const __m256 a = _mm256_set1_ps(0.999999f), x = _mm256_set1_ps(1e-6f);
  for (long k = 0; k < n; ++k) {
#define STEP(i) c##i = _mm256_fmadd_ps(c##i, a, x);
    CHAINS(STEP)
#undef STEP
    __asm__ volatile("" ::: "memory");
  }
  __m256 s = _mm256_setzero_ps();
#define SUM(i) s = _mm256_add_ps(s, c##i);
  CHAINS(SUM)
#undef SUM
  float out[8];
  _mm256_storeu_ps(out, s);
  g_sink = out[0];
}

__attribute__((target("avx512f,avx512bf16"))) void dpbf16_zmm(long n) {
#define DECL(i) __m512 c##i = _mm512_set1_ps(float(i));
  DP_CHAINS(DECL)
#undef DECL
  // bf16 pairs of small values, so the sums stay finite
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3C00), b = (__m512bh)_mm512_set1_epi16(0x3A80);
  for (long k = 0; k < n; ++k) {
#define STEP(i) c##i = _mm512_dpbf16_ps(c##i, a, b);
    DP_CHAINS(STEP)
#undef STEP
    __asm__ volatile("" ::: "memory");
  }
  __m512 s = _mm512_setzero_ps();
#define SUM(i) s = _mm512_add_ps(s, c##i);
  DP_CHAINS(SUM)
#undef SUM
  float out[16];
  _mm512_storeu_ps(out, s);
  g_sink = out[0];
}

struct TileConfig {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

__attribute__((target("amx-tile,amx-bf16"))) void amx_bf16(long n) {
  // Six 16x16 f32 accumulators (tmm0-5), one A tile 16x32 bf16 (tmm6), one B tile 32x16 bf16 as 16
  // rows of 16 pairs (tmm7): six independent tile products per step, no loads in the loop.
  static std::uint16_t src[16 * 32];
  static float dst[16 * 16];
  for (auto& x : src) x = 0x3A80;  // 2^-10 (bf16)
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  _tile_loadd(6, src, 64);
  _tile_loadd(7, src, 64);
  for (long k = 0; k < n; ++k) {
    _tile_dpbf16ps(0, 6, 7);
    _tile_dpbf16ps(1, 6, 7);
    _tile_dpbf16ps(2, 6, 7);
    _tile_dpbf16ps(3, 6, 7);
    _tile_dpbf16ps(4, 6, 7);
    _tile_dpbf16ps(5, 6, 7);
  }
  _tile_stored(0, dst, 64);
  _tile_release();
  g_sink = dst[0];
}

bool amx_permitted() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

int main() {
  __builtin_cpu_init();
  std::printf("%-44s %10s %10s\n", "instruction", "GFLOP/s", "vs f32 zmm");
  double f32 = 0;
  auto row = [&](const char* name, double g) {
    std::printf("%-44s %10.1f %9.0f%%\n", name, g, f32 > 0 ? 100.0 * g / f32 : 100.0);
  };
  if (__builtin_cpu_supports("avx512f")) {
    f32 = best_rate(12.0 * 16 * 2, 1 << 16, fma_zmm);
    row("f32 FMA zmm (vfmadd231ps, 12 chains)", f32);
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    row("f32 FMA ymm (vfmadd231ps, 12 chains)", best_rate(12.0 * 8 * 2, 1 << 16, fma_ymm));
  if (__builtin_cpu_supports("avx512bf16"))
    row("bf16 dot zmm (vdpbf16ps, 16 chains)", best_rate(16.0 * 32 * 2, 1 << 15, dpbf16_zmm));
  else
    std::printf("%-44s %10s\n", "bf16 dot zmm (vdpbf16ps)", "no AVX512_BF16");
  if (__builtin_cpu_supports("amx-bf16")) {
    if (amx_permitted())
      row("bf16 AMX (tdpbf16ps, 6 tiles of 16x16 f32)", best_rate(6.0 * 16 * 16 * 32 * 2, 1 << 9, amx_bf16));
    else
      std::printf("%-44s %10s\n", "bf16 AMX (tdpbf16ps)", "not permitted");
  } else {
    std::printf("%-44s %10s\n", "bf16 AMX (tdpbf16ps)", "no AMX_BF16");
  }
  return 0;
}
