#pragma once
// bf16 products on Intel AMX tiles (private to src/core). Where both operands of a product are
// bf16 (S = Q K^T, dP = dO V^T with bf16 storage; with Precision::bf16 also P V, P^T dO, dS K and
// dS^T Q, P and dS rounded to bf16), the products of two bf16 values are exact in f32 and AMX's
// tdpbf16ps sums them in f32: the same results as the f32 FMA kernels up to the order of the sum,
// at many times their rate. Used only when the CPU has AMX-BF16, AVX-512 and AVX512_BF16, Linux
// grants the tile data state, and RINGATTN_AMX is not 0 (enabled()).
//
// The intrinsics live in amx_tiles.cpp, the one file compiled with AMX and AVX-512 flags; it
// includes nothing but <immintrin.h> and C headers, so that no inline function of a shared header
// is emitted there with AVX-512 code the linker could pick for the rest of the library.
// Detection and pack_rows (amx_support.cpp) are portable code; the other packers (pack_pairs,
// pack_row_pairs, the rounding pack_rounded_* and pack_cols_of_rows) are AVX-512 code in
// amx_tiles.cpp, called with AMX or the dot products of bf16_dot.hpp, which both need it on x86
// (portable code in builds without the tile flags). The rounding ones round as to_bf16 does, except
// that f32 denormals may become zero: the products take denormal bf16 operands as zero anyway.
//
// Operands as the tile products read them (bf16 bits as uint16):
//   A (the rows: Q or dO)  [rows, Dp]          row i is the row's D values, zero to Dp
//   B (the keys: K or V)   [Dp / 2, 2 ldk]     B[kk][2 j + t] = X[j][2 kk + t] (pairs of depth, as
//                                              AMX's B operand takes them), zero past D and past tk
// with Dp = D rounded up to 32 (one tile row of bf16). The tile walk reads A rows up to 15 past
// the last row asked for and B keys up to 15 past the last key: the buffers hold them (zeros or
// other rows; those products are never stored).
//
// The accumulate products O = c O + A B (Precision::bf16) have depth keys (P V, dS K) or query rows
// (P^T dO, dS^T Q), and output columns D:
//   A (P or dS rounded, or their transposes)  [m, Kp]     row r: `lead` zeros, then the f32 tile's
//                                                         row (or column) r rounded to bf16, zero to Kp
//   B (V, K per tile; dO, Q per chunk)       [*, 2 ldc]  B[kk][2 d + t] = X[2 kk + t][d] (pairs of
//                                                         consecutive rows of X), zero past D
// with Kp = lead + depth rounded up to 32. A piece's depth may start at an odd row of B (strips and
// trimmed keys): lead = 1 then, and the product starts at the pair before it, whose first row meets
// A's zero. B's rows past the depth meet A's zeros too: they must be finite (the callers use this
// path only for finite head groups, and the packing zeroes kDepthStep rows past the end).
#include <cstdint>

namespace ringattn::core::amx {

using Index = std::int64_t;

// Whether the kernels compute bf16 products on AMX now: the CPU and OS allow it, the build has the
// tile code, RINGATTN_AMX is not "0", and set_enabled(false) was not called.
bool enabled();
// Whether this machine and build can use AMX at all (independent of RINGATTN_AMX and set_enabled).
bool available();
// Turns AMX use on or off (on only takes effect when available()); for tests and benchmarks.
void set_enabled(bool on);
// Whether the value of RINGATTN_AMX asks for AMX: unset (null), empty or anything but "0".
bool requested(const char* env_value);
// Whether amx_tiles.cpp was compiled with the tile instructions (x86-64 with a compiler that has them).
bool compiled();

constexpr Index kDepthStep = 32;  // bf16 values in one tile row
constexpr Index kTileRows = 16;   // rows of a tile, and f32 columns of a result tile
inline Index padded_depth(Index D) { return (D + kDepthStep - 1) / kDepthStep * kDepthStep; }
// Keys per row of a packed B for tiles of up to k_cols keys: room for a tile read from any
// offset, and an odd number of cache lines per row (2 ldk bf16 = 64 (ldk / 16) bytes).
inline Index packed_keys(Index k_cols) {
  Index ldk = (k_cols + 2 * kTileRows - 1) / kTileRows * kTileRows;
  if ((ldk / kTileRows) % 2 == 0) ldk += kTileRows;
  return ldk;
}

// A = rows [0, n) of X (row stride D), zero from D to Dp, then `pad` zero rows.
void pack_rows(const std::uint16_t* X, Index n, Index D, std::uint16_t* A, Index pad = kTileRows);
// B from keys [0, tk) of X (row stride D): pairs of depth, ldk keys per row, zero past tk and D.
void pack_pairs(const std::uint16_t* X, Index tk, Index D, Index ldk, std::uint16_t* B);

// A [n + kTileRows, Kp] from the f32 tile P [n, depth] (row stride ldp), each value rounded to the
// nearest bf16 (ties to even; NaN stays NaN, overflow becomes inf), row i = `lead` zeros, P's row i,
// zeros to Kp = padded_depth(lead + depth); then kTileRows zero rows.
void pack_rounded_rows(const float* P, Index n, Index depth, Index ldp, Index lead, std::uint16_t* A);
// The same for P^T: A [m + kTileRows, Kp], row j = `lead` zeros, then P[0, j] .. P[depth - 1, j]
// rounded, zero to Kp = padded_depth(lead + depth) (P [depth, m], row stride ldp).
void pack_rounded_cols(const float* P, Index depth, Index m, Index ldp, Index lead, std::uint16_t* A);
// pack_rounded_cols for a tile already rounded and packed by rows: X in pack_rounded_rows' layout
// (row i = `xlead` zeros, then the tile's row i of m values; row stride Kx), A as pack_rounded_cols
// leaves it (row j = `lead` zeros, then X's column j over rows [0, n), zeros to
// Kp = padded_depth(lead + n); then kTileRows zero rows). The values are copied, not rounded again.
void pack_cols_of_rows(const std::uint16_t* X, Index n, Index m, Index Kx, Index xlead, Index lead, std::uint16_t* A);
// B from rows [0, n) of X (row stride D): pairs of consecutive rows, ldc columns per row (2 ldc
// bf16), zero past D and for kDepthStep + 1 rows past n.
void pack_row_pairs(const std::uint16_t* X, Index n, Index D, Index ldc, std::uint16_t* B);
// Rows of a packed B that pack_row_pairs fills for n rows of X.
inline Index row_pairs(Index n) { return (n + kDepthStep + 2) / 2; }

// O = c O + A B over Kp for n rows of A and D columns: O row stride ldo, c per row (null: 1), the
// sum formed on tiles and added to c O by one FMA per element. A's rows at `A` (row stride Kp), B's
// pair rows at `B` (row stride 2 ldc). The calling thread must hold a TileScope.
void accumulate(const std::uint16_t* A, Index n, Index Kp, const std::uint16_t* B, Index ldc, Index D, float* O,
                Index ldo, const float* c);

enum class Epilogue { max, store, grad };

// C = A B^T over Dp for n rows and tk keys, then per element of S (row stride lds, columns < tk):
//   max:   S = alpha C, rmax[i] = row i's max of S;
//   store: S = alpha C;
//   grad:  S = alpha P o (C - delta[i])  (P [n, lds]).
// A's rows start at `A` (row stride Dp), B's keys at `B` (a packed B plus a key offset times 2;
// row stride 2 ldk). The calling thread must hold a TileScope.
void scores(Epilogue e, const std::uint16_t* A, Index n, const std::uint16_t* B, Index ldk, Index tk, Index Dp,
            float* S, Index lds, float alpha, const float* P, const float* delta, float* rmax);

// The tile configuration of the calling thread for scores(), loaded on construction and released
// (the tile registers returned to their initial state) on destruction.
class TileScope {
 public:
  TileScope();
  ~TileScope();
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

}  // namespace ringattn::core::amx
