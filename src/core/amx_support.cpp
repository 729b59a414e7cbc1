// What amx_tiles.hpp needs besides the tile instructions, in portable code: whether the CPU, the
// OS and the build allow AMX and the user wants it, and the packing of Q's and dO's rows (the
// other packers are in amx_tiles.cpp).
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/amx_tiles.hpp"

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace ringattn::core::amx {
namespace {

// The CPU has AMX-TILE, AMX-BF16, AVX-512F and BW (the packers' word permutes) and AVX512_BF16
// (whose vcvtneps2bf16 and vcvtne2ps2bf16 the packers of Precision::bf16 round with), the OS saves
// AVX-512 and tile state (XCR0), and Linux grants this process the tile data (arch_prctl
// ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): without that grant the first tile instruction would fault.
bool machine_allows() {
#if defined(__x86_64__) && defined(__linux__)
  if (!compiled()) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool avx512 = (b & (1u << 16)) && (b & (1u << 30)), amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
  const unsigned subleaves = a;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  if (!avx512 || !amx_bf16 || !amx_tile) return false;
  if (subleaves < 1 || !__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return false;  // AVX512_BF16
  unsigned lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const unsigned long long xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
  constexpr unsigned long long kAvx512State = 0xE6, kTileState = 0x60000;  // SSE, AVX, opmask, zmm; TILECFG, TILEDATA
  if ((xcr0 & kAvx512State) != kAvx512State || (xcr0 & kTileState) != kTileState) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

std::atomic<int>& state() {  // -1: not decided yet; 0 off; 1 on
  static std::atomic<int> s{-1};
  return s;
}

}  // namespace

bool requested(const char* env_value) { return env_value == nullptr || std::strcmp(env_value, "0") != 0; }

bool available() {
  static const bool allowed = machine_allows();
  return allowed;
}

bool enabled() {
  int s = state().load(std::memory_order_relaxed);
  if (s < 0) {
    s = available() && requested(std::getenv("RINGATTN_AMX")) ? 1 : 0;
    state().store(s, std::memory_order_relaxed);
  }
  return s == 1;
}

void set_enabled(bool on) { state().store(on && available() ? 1 : 0, std::memory_order_relaxed); }

void pack_rows(const std::uint16_t* X, Index n, Index D, std::uint16_t* A, Index pad) {
  const Index Dp = padded_depth(D);
  for (Index i = 0; i < n; ++i) {
    std::memcpy(A + i * Dp, X + i * D, sizeof(std::uint16_t) * D);
    std::memset(A + i * Dp + D, 0, sizeof(std::uint16_t) * (Dp - D));
  }
  std::memset(A + n * Dp, 0, sizeof(std::uint16_t) * pad * Dp);
}

}  // namespace ringattn::core::amx
