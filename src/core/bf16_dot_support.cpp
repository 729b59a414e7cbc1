// What bf16_dot.hpp needs besides the instruction, in portable code: whether the CPU, the OS and
// the build allow it, whether the user wants it, and the timing of its products for benchmarks.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "core/bf16_dot.hpp"
#include "ringattn/core/half.hpp"
#include "ringattn/core/simd.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace ringattn::core::bf16dot {
namespace {

// x86-64: the CPU has AVX-512F, AVX-512BW (the packers' word permutes) and AVX512_BF16 (CPUID 7.1
// EAX bit 5) and the OS saves the AVX-512 state. 64-bit Arm: Linux reports FEAT_BF16 (HWCAP2_BF16).
bool machine_allows() {
#if defined(__x86_64__)
  if (!compiled()) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & (1u << 16)) || !(b & (1u << 30))) return false;  // F, BW
  if (a < 1 || !__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return false;  // AVX512_BF16
  unsigned lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  constexpr unsigned kAvx512State = 0xE6;  // SSE, AVX, opmask, the upper zmm halves, zmm16-31
  return (lo & kAvx512State) == kAvx512State;
#elif defined(__aarch64__) && defined(__linux__)
  constexpr unsigned long kHwcap2Bf16 = 1ul << 14;
  return compiled() && (getauxval(AT_HWCAP2) & kHwcap2Bf16) != 0;
#else
  return false;
#endif
}

std::atomic<int>& state() {  // -1: not decided yet; 0 off; 1 on
  static std::atomic<int> s{-1};
  return s;
}

}  // namespace

int requested(const char* env_value) {
  if (env_value == nullptr || *env_value == '\0') return -1;
  return std::strcmp(env_value, "0") == 0 ? 0 : 1;
}

bool available() {
  static const bool allowed = machine_allows();
  return allowed;
}

bool enabled() {
  int s = state().load(std::memory_order_relaxed);
  if (s < 0) {
    // automatic: where AMX is not available (AMX is many times faster, and on the CPUs that have
    // both, vdpbf16ps is slower than the f32 FMA)
    const int want = requested(std::getenv("RINGATTN_BF16DOT"));
    s = available() && (want == 1 || (want < 0 && !amx::available())) ? 1 : 0;
    state().store(s, std::memory_order_relaxed);
  }
  return s == 1;
}

const char* instruction() {
#if defined(__aarch64__)
  return "BFDOT";
#else
  return "VDPBF16PS";
#endif
}

void set_enabled(bool on) { state().store(on && available() ? 1 : 0, std::memory_order_relaxed); }

}  // namespace ringattn::core::bf16dot

namespace ringattn::core::simd {

double bf16_dot_peak(double seconds) { return bf16dot::peak(seconds) * 1e9; }

Bf16ProductTimes bf16_product_times(Index D, int reps) {
  Bf16ProductTimes out;
  if (!bf16dot::available()) return out;
  const Tiling t = default_tiling();
  const Index n = t.q_rows, tk = t.k_cols, Dp = amx::padded_depth(D), ldk = amx::packed_keys(tk),
              Kp = amx::padded_depth(tk), ldc = amx::packed_keys(D), lds = tk + 16;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  auto bf16_bits = [&](Index count) {
    std::vector<std::uint16_t> x(count);
    for (auto& b : x) b = to_bf16(0.5f * nd(rng)).bits;
    return x;
  };
  const std::vector<std::uint16_t> Q = bf16_bits(n * D), K = bf16_bits(tk * D), V = bf16_bits(tk * D);
  std::vector<std::uint16_t> A((n + amx::kTileRows) * Dp), B(Dp / 2 * 2 * ldk), Pb((n + amx::kTileRows) * Kp),
      Vb(amx::row_pairs(tk) * 2 * ldc);
  amx::pack_rows(Q.data(), n, D, A.data());
  amx::pack_pairs(K.data(), tk, D, ldk, B.data());
  amx::pack_row_pairs(V.data(), tk, D, ldc, Vb.data());
  std::vector<float> S(n * lds), P(n * lds), rmax(n), O(n * D, 0.f), c(n, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  for (auto& p : P) p = ud(rng);
  amx::pack_rounded_rows(P.data(), n, tk, lds, 0, Pb.data());
  out.peak = bf16dot::peak(0.2) * 1e9;
  using clock = std::chrono::steady_clock;
  double score = 1e30, acc = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clock::now();
    bf16dot::scores(amx::Epilogue::max, A.data(), n, B.data(), ldk, tk, Dp, S.data(), lds, 0.125f, nullptr, nullptr,
                    rmax.data());
    const auto t1 = clock::now();
    bf16dot::accumulate(Pb.data(), n, Kp, Vb.data(), ldc, D, O.data(), D, c.data());
    const auto t2 = clock::now();
    score = std::min(score, std::chrono::duration<double>(t1 - t0).count());
    acc = std::min(acc, std::chrono::duration<double>(t2 - t1).count());
  }
  out.peak = std::max(out.peak, bf16dot::peak(0.2) * 1e9);
  out.score = score;
  out.accumulate = acc;
  out.product_flops = 2.0 * double(n) * double(tk) * double(D);
  return out;
}

}  // namespace ringattn::core::simd
