#pragma once
// Block attention of a rank's queries against one K/V block, forward and backward, tiled in
// the FlashAttention-2 manner: a Q tile against a K/V tile, the score tile kept in cache,
// no L x L scratch. Pure math: no MPI, no I/O, no allocation (scratch comes in a Workspace).
//
// Types: S is the storage type of the operands (q, k, v, dout), A = accum_t<S> the type every
// score, state and gradient is computed and accumulated in.
//
// Shapes, for one head group (b, g) with G query heads sharing one kv head:
//   q, dout, o, dq   [Lq*G, D]  row r is local query position r / G
//   m, l, lse, delta [Lq*G]
//   k, v, dk, dv     [Lk, D]
// Positions are global and sorted; visibility is decided by the Mask on global positions.
//
// Non-finite operands (NaN or +-inf in q, k, v, dout) propagate as in PyTorch's float64 autograd of
// softmax(scale q k^T) v with each query row's softmax over the keys it sees: an output element (O,
// LSE, dq, dk, dv) is non-finite exactly when it depends, through a visible (query, key) pair, on a
// non-finite value (a row with a NaN or +inf score is NaN; 0 times a NaN of a visible pair is NaN; an
// invisible pair carries nothing). A row that sees no key keeps O = 0, LSE = -inf and no gradient.
// A row whose visible scores are all -inf (an infinite key or query, or a product past the float
// range) has a NaN softmax, as torch's; the kernels cannot tell it from a row that sees no key, so
// finalize_forward decides, told whether every row sees one (self-attention: each query sees its own
// position's key under every Mask).
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ringattn/core/aligned.hpp"
#include "ringattn/core/function_ref.hpp"
#include "ringattn/core/mask.hpp"
#include "ringattn/core/packed.hpp"
#include "ringattn/core/storage.hpp"

namespace ringattn::core {

// The softmax base is 2 for both accumulation types: log2 e is folded into the scale (and into a
// cap and a sink), one 2^x per score, and no reduction by ln 2 is needed (the running max is kept
// in log2 units).
inline constexpr double kLog2e = 1.4426950408889634;

// How the products with one f32 operand (P V, P^T dO, dS K, dS^T Q) take that operand:
//   f32:  exactly (the default; every storage type);
//   bf16: P and dS rounded to bf16 first, as FlashAttention and PyTorch's CPU flash kernel do, so
//         that with bf16 storage every product has two bf16 operands and runs on bf16 dot products
//         where the CPU has them (AMX tiles). bf16 storage only (the plan refuses it otherwise).
enum class Precision { f32, bf16 };

struct Tiling {
  Index q_rows = 0;       // rows of a query tile (positions x heads); 0: the SIMD target's default
  Index k_cols = 0;       // keys of a K/V tile; 0: the SIMD target's default
  Index strip_rows = 32;  // a partially visible tile is computed in strips of this many rows, each
                          // trimmed to the keys its rows can see (a staircase along the diagonal);
                          // 0: no strips, one piece trimmed to the keys any of its rows sees
  Index chunk_rows = 0;   // query rows are swept in chunks of this many (rounded up to whole tiles),
                          // each against every K/V tile; 0: as many as keep ~1 MiB of row operands
};

// The tiling the kernels use on this SIMD target: defaults filled in, tiles no larger than the
// shards (Lmax positions, G rows each), chunks in whole tiles.
Tiling resolve_tiling(const Tiling& t, Index head_dim, Index Lmax, Index G);

// Work actually done, counted as FlashAttention does: forward 4*rows*cols*D per computed piece,
// backward 2.5x that (five GEMMs of 2*rows*cols*D instead of two). A full tile is one piece; a
// partial tile is its trimmed strips. tile_pairs counts tile pairs with any visible pair.
struct Work {
  Index tile_pairs = 0;
  double flops = 0;
  Work& operator+=(const Work& o) {
    tile_pairs += o.tile_pairs;
    flops += o.flops;
    return *this;
  }
};

using Progress = FunctionRef<void()>;

// Scratch of the kernels, sized once for a resolved tiling (accumulation type A): the score and
// probability tiles, the transposed K and V tiles, the chunk's scaled queries, and the row operands
// copied as A (Q, dO of the chunk; K, V of the tile). Rows of the tiles are padded to whole column
// blocks of the SIMD target, and every row stride is an odd number of cache lines, so that a
// product's operand panel, read row after row, spreads over all sets of the L1 cache.
template <class A>
struct Workspace {
  // The buffers of Precision::bf16 exist only in a workspace made for it.
  Workspace(const Tiling& resolved, Index head_dim, Precision precision = Precision::f32);
  static Index bytes(const Tiling& resolved, Index head_dim, Precision precision = Precision::f32);
  Tiling tiling;
  Index D = 0, R = 0;               // head dim, rows per chunk
  Index ld = 0, ldd = 0;            // row strides of the tiles [*, k_cols] and of the row operands [*, D]
  AlignedVector<A> s, p;            // score / probability / dS tiles [q_rows, ld]
  AlignedVector<A> kt, vt;          // K and V tiles transposed [D, ld]
  AlignedVector<A> qs;              // the chunk's queries times the scale [R, D]
  AlignedVector<A> qw, dow, kw, vw;  // Q, dO of the chunk [R, ldd]; K, V of the tile [k_cols, ldd]
  AlignedVector<A> rowmax, rowc, rowsum, vmax;  // per tile row; the score kernel's running maxima
  // bf16 operands packed for AMX tile or dot products (float accumulation, when the machine has either):
  // the chunk's Q and dO rows [R + 16, Dp], the tile's K and V as pairs of depth [Dp / 2, 2 ldk]
  // (bf16 bits; Dp = D rounded up to 32; see src/core/amx_tiles.hpp)
  Index ldk = 0;
  AlignedVector<std::uint16_t> qb, dob, kb, vb;
  // Precision::bf16 on AMX or dot products: the piece's P or dS rounded to bf16 as rows over its keys [q_rows + 16,
  // Kk] and as their transpose over its rows [k_cols + 16, Kq] (Kk, Kq: k_cols + 1, q_rows + 1
  // rounded up to 32); V and K of the tile, Q and dO of the chunk as pairs of consecutive rows
  // [amx::row_pairs(k_cols or R), 2 ldc] (see src/core/amx_tiles.hpp)
  Index ldc = 0;
  AlignedVector<std::uint16_t> pb, pbt, vpb, kpb, qpb, dopb;
  // Precision::bf16 on the f32 FMA kernels (float workspaces): the backward's rounded P [q_rows, ld], beside the
  // f32 P that dS is formed from
  AlignedVector<A> pr;
  Precision precision = Precision::f32;  // as constructed
};

// Whether the kernels compute the bf16 products S = Q K^T and dP = dO V^T on AMX tiles now (Intel
// AMX-BF16, granted by the OS; off when the environment variable RINGATTN_AMX is 0).
bool amx_bf16_active();
// What computes the products of two bf16 operands now: "AMX", "VDPBF16PS" (x86 AVX512_BF16 without
// AMX, or RINGATTN_BF16DOT=1), "BFDOT" (Arm FEAT_BF16), or "" (the f32 FMA kernels). RINGATTN_AMX=0
// turns AMX off, RINGATTN_BF16DOT=0 the dot products.
std::string bf16_products();

// One rank's queries in packed form (storage type).
template <class S>
struct QueryShard {
  Packing pk;                     // L = this rank's positions
  std::span<const Index> pos;     // [L] global positions, increasing
  const S* q = nullptr;           // query-like
};

// A K/V block as it travels (storage type).
template <class S>
struct KVBlock {
  Packing pk;                     // L = the block's positions, G = 1
  std::span<const Index> pos;     // [Lk]
  const S* k = nullptr;           // kv-like
  const S* v = nullptr;
};

// Online-softmax state per query row (accumulation type): running max m, exp-sum l, weighted sum a.
template <class A>
struct OnlineState {
  A* m = nullptr;    // row stats, init -inf
  A* l = nullptr;    // row stats, init 0
  A* acc = nullptr;  // query-like, init 0
};

template <class A>
void init_online_state(const Packing& pk, OnlineState<A> st);

// Fold one K/V block into the running state of every query row:
//   m' = max(m, max_j S_ij), c = e^(m - m'), l' = c l + sum_j e^(S_ij - m'),
//   a' = c a + sum_j e^(S_ij - m') V_j,   S_ij = scale * q_i . k_j over visible j,
// soft-capped as S_ij = softcap tanh(S_ij / softcap) when softcap > 0 (0: none). A row whose
// visible scores here are all -inf keeps the state of a row that saw nothing (m = -inf, l = 0);
// finalize_forward decides what that row's softmax is (see there).
template <class S>
Work block_forward(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& mask, accum_t<S> scale,
                   OnlineState<accum_t<S>> st, Workspace<accum_t<S>>& ws, Progress progress = {},
                   accum_t<S> softcap = 0);

// O = a / l in place (acc becomes O) and LSE = m + log l (natural log) into lse [rows]; m and l
// stay, in the kernel's units, for the backward. A row with no visible key has O = 0, m = LSE = -inf
// and l = 0; a row with a NaN or +inf score has l = NaN, so O and LSE are NaN. every_row_sees_a_key:
// the caller knows that each row saw at least one key (self-attention over the whole sequence), so
// a row left with l = 0 saw only scores of -inf: its softmax is NaN, as torch's, so m, l and O become
// NaN (the backward then gives NaN to its dq and to the dk and dv of the keys it sees), and LSE is
// -inf, torch.logsumexp's value for such a row.
// Attention sinks: `sinks` [pk.H()] (natural-log logits, head h = g G + t of the packing; null:
// none) join each row's softmax denominator and attend to no value. The row's state merges with
// (m, l, a) = (sink_h, 1, 0) first, so the m and l the backward reads and LSE include it; a row with
// no visible key then has O = 0 and LSE = sink_h (softmax over the sink alone), and a sink of -inf
// changes nothing.
template <class A>
void finalize_forward(const Packing& pk, OnlineState<A> st, A* lse, const double* sinks = nullptr,
                      bool every_row_sees_a_key = false);

// The sinks' gradient from this shard's rows (in row order, in double), added into dsinks [pk.H()]:
//   dL/dsink_h = -sum_i P_sink,i delta_i,   P_sink,i = e^(sink_h - LSE_i) = 2^(sink_h log2 e - m_i) / l_i
// with delta the backward's row term (D_i = sum dO_i.O_i - dLSE_i) and m, l the row statistics
// finalize_forward left (the second form keeps every bit where the sink dominates a huge row).
template <class A>
void add_sink_grad(const Packing& pk, const A* m, const A* l, const A* delta, const double* sinks, double* dsinks);

// What the backward needs of the query side.
template <class S>
struct GradQueryShard {
  using A = accum_t<S>;
  QueryShard<S> q;
  const S* dout = nullptr;   // query-like
  const A* m = nullptr;      // row stats: the forward's final running max (kernel units)
  const A* l = nullptr;      // row stats: the forward's exp-sum (0: the row sees no key)
  const A* delta = nullptr;  // row stats: D_i = sum_d dO_i . O_i (- dL/dLSE_i when LSE has a gradient)
  A* dq = nullptr;           // query-like, accumulated
};

// D_i = sum_d dO_id O_id for every row, one chain in the order of the kernels' dP = dO V^T; NaN
// for a row of dO holding an infinity (its dS row is NaN, as in the dense form). For bf16 storage
// whose dP runs on bf16 products, a row whose O is exactly bf16 takes D_i from those products.
template <class S>
void compute_delta(const Packing& pk, const S* dout, const accum_t<S>* o, accum_t<S>* delta);

// Contribution of the local queries through one K/V block, accumulated into dq (local) and
// dk, dv (kv-like, shaped like the block):
//   P = exp(S - m) / l, dP = dO V^T, dS = P o (dP - D),
//   dQ += scale dS K,  dK += scale dS^T Q,  dV += P^T dO,
// with dS times 1 - tanh^2(s / softcap) when the scores were soft-capped (softcap > 0): 0 for an
// infinite score, whose q or k then gets 0 * inf = NaN from it, as in torch.
template <class S>
Work block_backward(const GradQueryShard<S>& g, const KVBlock<S>& kv, const Mask& mask, accum_t<S> scale,
                    accum_t<S>* dk, accum_t<S>* dv, Workspace<accum_t<S>>& ws, Progress progress = {},
                    accum_t<S> softcap = 0);

// The Work block_forward would report for these operands, counted by the same walk over tiles
// and strips without computing anything (the data pointers are not read): what a timing-only
// simulation charges instead of the arithmetic. block_backward's is the same tile pairs and 2.5x
// the flops.
template <class S>
Work count_block_forward(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& mask,
                         const Workspace<accum_t<S>>& ws);

// Whether any (query, key) pair of the rank and the block is visible (a whole block that is
// not is skipped: no compute, no gradient).
bool block_visible(const Mask& mask, std::span<const Index> qpos, std::span<const Index> kpos);

}  // namespace ringattn::core
