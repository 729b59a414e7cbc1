#pragma once
// The SIMD target the kernels run on. One kernel source is compiled for every target the build
// has; at run time the best one this CPU supports is chosen, or the one RINGATTN_SIMD names
// (Highway's names: AVX3_DL, AVX3, AVX2, SSE4, EMU128, NEON, SVE, SVE2, ...).
#include <cstdint>
#include <string>
#include <vector>

#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/shape.hpp"

namespace ringattn::core::simd {

// The target the kernels run on now ("AVX2").
std::string current();
// Whether that target's multiply-add is one fused operation, rounded once (Highway's HWY_NATIVE_FMA).
bool fused_multiply_add();
// What computes attention of storage type t: current(), with "+AMX", "+VDPBF16PS" or "+BFDOT" when
// bf16 products run on those (bf16_products()).
std::string kernels(DType t);
// Targets this build has and this CPU runs, best first.
std::vector<std::string> available();
// Restricts the kernels to `name`. Throws InputError when the build has no such target or this
// CPU cannot run it; the message names the targets it can.
void select(const std::string& name);
// select(RINGATTN_SIMD) once, when the variable is set; a bad value throws InputError naming it.
void select_from_environment();

// The FMA peak of this core in FLOP/s for f32 or f64 on the current target: independent chains of
// fused multiply-adds, the best rate seen in `seconds`.
double fma_peak(DType t, double seconds = 0.2);
// The same chains' rate over the whole of `seconds`: what the core sustains while other tenants of
// a shared machine take their turns (on an idle core, the peak).
double fma_sustained(DType t, double seconds);

// One forward piece of the default tiles (a query tile against a K/V tile, head dim D) on warm
// operands, its three sweeps timed apart, the best of `reps`, in seconds: the score product
// S = Q' K^T with its row max, the exponentials P = 2^(S - m) with their row sums, and the
// accumulate O = c O + P V. Each product has `product_flops` (2 x rows x keys x D). `tile_start` is
// the forward's preparation of the K/V tile (K transposed, V copied), which the query tiles of a
// chunk share. What the kernels do undisturbed, for benchmarks on machines whose other tenants make
// whole-run rates swing. `piece_median` is the median over the repetitions of one piece's three
// sweeps together: what they typically do on this machine as it is, which a whole run follows.
struct PieceTimes {
  double score = 0, exp = 0, accumulate = 0, product_flops = 0, tile_start = 0, piece_median = 0;
};
PieceTimes piece_times(DType t, Index head_dim, int reps = 1000);

// The bf16 products of the same piece on the dot-product instruction (vdpbf16ps or BFDOT), where
// this machine has it: the score product S = Q K^T with its row max and the accumulate
// O = c O + P V with P rounded to bf16 and packed, each the best of `reps` in seconds, and the
// instruction's peak in FLOP/s (sixteen chains, the better of two measured just before and after).
// All zero where the instruction is not available.
struct Bf16ProductTimes {
  double score = 0, accumulate = 0, product_flops = 0, peak = 0;
};
Bf16ProductTimes bf16_product_times(Index head_dim, int reps = 1000);
// That instruction's peak alone, in FLOP/s (0 where it is not available).
double bf16_dot_peak(double seconds = 0.2);

// y[i] = 2^x[i] as the kernels compute it on the current target, in f32 (x[i] rounded to float
// first) or f64, for x[i] <= 0: 0 below 2^-125 (f32) or 2^-1021 (f64) and for -inf; NaN stays NaN.
// For tests of its accuracy (tests/unit/block_attention_test.cpp bounds its error in ulps).
void exp2_values(DType t, const double* x, double* y, Index n);

// The current target's default tiles, and the columns its score kernel covers at once.
Tiling default_tiling();
Index column_block(std::size_t elem_size);

// Every target the build compiled, as Highway's bits, best first (for tests and the dispatch).
std::vector<std::int64_t> compiled_targets();

}  // namespace ringattn::core::simd
