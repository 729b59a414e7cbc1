#pragma once
// bf16 score products on a bf16 dot-product instruction (private to src/core): vdpbf16ps on x86-64
// CPUs with AVX512_BF16 and no AMX (AMD Zen 4 and Zen 5; Intel Cooper Lake), BFDOT on 64-bit Arm
// with FEAT_BF16 (Neoverse V1, V2). Both multiply pairs of bf16 values and add the two products to
// an f32 lane, at twice the lanes' f32 FMA rate on those cores. The products of two bf16 values are
// exact in f32, so the scores are the f32 kernels' up to the order of the sum (and denormal
// operands, which the instructions may take as zero).
//
// The operands are amx_tiles.hpp's packing: A the rows (Q or dO) [rows, Dp], B the keys (K or V) as
// pairs of depth [Dp / 2, 2 ldk], so one workspace serves either product. scores() has amx::scores'
// contract (the same epilogues; it reads no row past n and no key past tk rounded up to 16).
//
// The intrinsics live in bf16_dot.cpp, the one file compiled with AVX512_BF16 (or Arm +bf16) flags,
// for the reason amx_tiles.hpp gives; detection (CPUID and XCR0, or HWCAP2) is portable code in
// bf16_dot_support.cpp.
#include <cstdint>

#include "core/amx_tiles.hpp"

namespace ringattn::core::bf16dot {

using Index = std::int64_t;

// Whether the kernels compute bf16 score products with vdpbf16ps now: the CPU and OS allow it, the
// build has the code, AMX is not in use (it is faster where present), and RINGATTN_BF16DOT does not
// say otherwise: "0" turns the path off, "1" turns it on even where AMX is present (for tests and
// benchmarks; AMX then stays off for bf16 scores).
bool enabled();
// Whether this machine and build can run the path at all.
bool available();
// Turns the path on or off (on only takes effect when available()); for tests and benchmarks.
void set_enabled(bool on);
// "VDPBF16PS" (x86-64) or "BFDOT" (64-bit Arm).
const char* instruction();
// What the value of RINGATTN_BF16DOT asks for (see enabled()).
int requested(const char* env_value);  // -1: unset or empty (automatic), 0: off, 1: on
bool compiled();
// This core's rate on the instruction, in GFLOP/s as the products count them (two flops per bf16
// product): sixteen independent chains for about `seconds`, the best window of about 2 ms; 0 when
// the path is not available(). The peak the bf16 products are measured against.
double peak(double seconds);

// As amx::scores: C = A B^T over Dp for n rows and tk keys, then the epilogue per element of S.
void scores(amx::Epilogue e, const std::uint16_t* A, Index n, const std::uint16_t* B, Index ldk, Index tk, Index Dp,
            float* S, Index lds, float alpha, const float* P, const float* delta, float* rmax);
// scores(Epilogue::grad) for a product whose dS is used only rounded to bf16 (Precision::bf16): dS
// is not stored as f32 but rounded (as amx::pack_rounded_rows rounds) into A in that packer's
// layout with `lead`, ready for accumulate(): row i = `lead` zeros, dS's row i, zeros to
// Kp = amx::padded_depth(lead + tk), then amx::kTileRows zero rows. P has row stride ldp.
void grad_rounded(const std::uint16_t* A, Index n, const std::uint16_t* B, Index ldk, Index tk, Index Dp, float alpha,
                  const float* P, Index ldp, const float* delta, Index lead, std::uint16_t* dS);
// As amx::accumulate: O = c O + A B over Kp for n rows of A and D columns (A [n, Kp] rounded rows,
// B pairs of consecutive rows of V, K, dO or Q [*, 2 ldc]); reads no row past n and no column past
// D rounded up to 16 (x86) or 4 (Arm).
void accumulate(const std::uint16_t* A, Index n, Index Kp, const std::uint16_t* B, Index ldc, Index D, float* O,
                Index ldo, const float* c);

}  // namespace ringattn::core::bf16dot
