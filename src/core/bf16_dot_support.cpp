// What bf16_dot.hpp needs besides the instruction, in portable code: whether the CPU, the OS and
// the build allow it, and whether the user wants it.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/bf16_dot.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace ringattn::core::bf16dot {
namespace {

// x86-64: the CPU has AVX-512F and AVX512_BF16 (CPUID 7.1 EAX bit 5) and the OS saves the AVX-512
// state. 64-bit Arm: Linux reports FEAT_BF16 (HWCAP2_BF16).
bool machine_allows() {
#if defined(__x86_64__)
  if (!compiled()) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & (1u << 16))) return false;  // AVX-512F
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
