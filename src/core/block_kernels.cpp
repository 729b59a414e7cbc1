// The block kernels, written once against Highway and compiled for every SIMD target the build
// has (SSE4, AVX2, AVX-512 (AVX3, AVX3_DL), NEON, SVE, EMU128); block_attention.cpp calls the
// best one the CPU runs, or the one RINGATTN_SIMD names. The sweeps' parts are per-target headers:
// kernel_math-inl.hpp (exp, the softmax of a tile, operand copies) and tile_products-inl.hpp
// (register blocking, the score and accumulate products).
//
// For one head group (b, g), with R query rows per chunk, TQ per tile, TK keys per tile:
//   forward:  per chunk, Q' = alpha Q as A once (alpha = scale times log2 e);
//             per K/V tile, K transposed and V copied as A once;
//             per piece: sweep 1 S = Q' K^T, the row max kept as it is stored;
//                        sweep 2 m' = max(m, rowmax), P = 2^(S - m'), l' = c l + sum P, c = 2^(m - m');
//                        sweep 3 O = c O + P V, the rescale applied as O is loaded to take the sum.
//   backward: per chunk, Q' and Q, dO as A; per K/V tile, K and V transposed, K copied as A;
//             per piece: P = 2^(S - m) / l from the forward's own m and l (S recomputed bit for bit),
//                        dV += P^T dO, dS = scale P o (dO V^T - delta) formed as it is stored,
//                        dQ += dS K, dK += dS^T Q.
// Precision::bf16 (bf16 storage computing in f32; Workspace::precision, ignored for other types)
// rounds the f32 operand of the four products with one, as PyTorch's CPU flash kernel does: the
// forward's P after sweep 2 (l keeps the sum of the unrounded P) before O = c O + P V; the
// backward's P for dV += P^T dO only (dS is formed from the f32 P, as before), and dS before dQ and
// dK. Every product then has two bf16 operands, exact in f32, and depends only on the order of its
// sum. Two paths: the portable one, on every target, rounds the f32 tile in place (to nearest even;
// NaN stays NaN, overflow becomes inf) and runs the same FMA products (and the exact paths below);
// with AMX (amx::enabled()) or the dot products and a finite head group, the rounded tiles are
// packed as bf16 and the four products run there (amx::accumulate, bf16dot::accumulate), V and K
// packed per tile and Q and dO per chunk as pairs of rows, the depth padded with zeros to whole
// tiles; on the dot products the backward's dS is rounded as its epilogue forms it and never stored
// as f32 (tile_grad_rounded).
// Non-finite operands (NaN, +-inf in Q, K, V, dO) give what PyTorch's float64 autograd gives when each
// query row's softmax runs over the keys that row sees: an output is non-finite exactly when it
// depends, through a visible pair, on a non-finite value. Full pieces get that from IEEE arithmetic
// as they are (every pair in them is visible) once a NaN or +inf row max stays NaN (sweep 2) and the
// softmax of such a row is NaN (exp_tile's kNonFinite form, called only when a row max is NaN or
// +inf). A partial piece also multiplies the zeros of its invisible pairs, and 0 * NaN would carry a
// NaN to a row or key that never sees it: when a head group's operands (or its forward state) hold
// a non-finite value, found by one vector scan per group and block, its partial pieces sum over
// their visible pairs only (visible_accumulate, visible_backward), in scalar code that finite
// inputs never run.
//
// Every product element is one FMA chain in a fixed order (over d for S and dP, over the shared
// dimension for the others, then one FMA into the output), so results do not depend on how rows are
// blocked, and the backward's S is the forward's exactly. The copies give every operand a row
// stride of an odd number of cache lines (Workspace::ld, ldd), so a panel read down its rows uses
// all sets of L1 instead of a few. Vectors are named variables, never arrays: the same lines serve
// 4, 8, 16 lanes or SVE's scalable length.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/block_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/kernel_math-inl.hpp"     // exp, the softmax of a tile, operand copies
#include "core/tile_products-inl.hpp"  // register blocking, score and accumulate products
#include "core/nonfinite-inl.hpp"      // the exact paths for non-finite operands
#include "core/tile_walk.hpp"
#include "core/amx_tiles.hpp"  // bf16 products on AMX tiles
#include "core/bf16_dot.hpp"   // bf16 products on vdpbf16ps or BFDOT
#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/median.hpp"
#include "ringattn/core/simd.hpp"

HWY_BEFORE_NAMESPACE();
namespace ringattn::core::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- bf16 products on AMX tiles or bf16 dot-product instructions -----------------------------------

// Whether a kernel of storage S and accumulation A can compute its products of two bf16 operands on
// AMX tiles (tdpbf16ps, amx_tiles.hpp) or a dot-product instruction (vdpbf16ps, BFDOT; bf16_dot.hpp):
// the products are exact in f32 and summed in f32.
template <class S, class A>
constexpr bool kAmxTypes = std::is_same_v<S, bf16> && std::is_same_v<A, float>;

template <class S>
const std::uint16_t* bf16_bits(const S* x) {
  return reinterpret_cast<const std::uint16_t*>(x);
}

template <class A>
using Same = std::type_identity_t<A>;  // a parameter that takes A from the others (nullptr allowed)

// Which instructions compute the products of two bf16 operands in this call: none (the f32 FMA
// kernels), AMX tiles, or a dot-product instruction. Both take the same packed operands.
enum class Bf16Engine { none, amx, dot };

// Rows [0, n) of a product of packed rows (from chunk row i0) and packed keys (from tile key k0)
// on the engine, with epilogue e (see amx::scores): alpha times the raw sum, the scale applied after
// the sum where the FMA kernels take Q' = alpha Q.
template <class A>
void tile_scores(Bf16Engine engine, amx::Epilogue e, const Workspace<A>& ws, const std::uint16_t* rows, Index i0,
                 const std::uint16_t* keys, Index k0, Index n, Index tk, A* S, Index lds, A alpha, const Same<A>* P,
                 const Same<A>* delta, Same<A>* rmax) {
  if constexpr (std::is_same_v<A, float>) {
    const Index Dp = amx::padded_depth(ws.D);
    auto* product = engine == Bf16Engine::dot ? &bf16dot::scores : &amx::scores;
    product(e, rows + i0 * Dp, n, keys + 2 * k0, ws.ldk, tk, Dp, S, lds, alpha, P, delta, rmax);
  }
}

// The engine of this call (the workspace then holds the packed operands). A dot-product
// instruction wins where it is enabled (bf16dot::enabled(): automatically only without AMX); AMX
// takes the tile configuration of the calling thread for as long as the call runs.
template <class S, class A>
Bf16Engine bf16_engine(const Workspace<A>& ws, std::optional<amx::TileScope>& scope) {
  if constexpr (!kAmxTypes<S, A>) {
    return Bf16Engine::none;
  } else {
    if (ws.kb.empty()) return Bf16Engine::none;
    if (bf16dot::enabled()) return Bf16Engine::dot;
    if (!amx::enabled()) return Bf16Engine::none;
    scope.emplace();
    return Bf16Engine::amx;
  }
}

// Whether this kernel rounds P and dS to bf16 before their products (Precision::bf16, bf16 storage
// computing in float; the field means nothing for the other types).
template <class S, class A>
bool rounds_to_bf16(const Workspace<A>& ws) {
  return kAmxTypes<S, A> && ws.precision == Precision::bf16;
}

// O = c O + A B on the engine for A already packed (n rows of depth values after `lead` = b0 & 1
// zeros, as tile_accumulate below packs them) and the packed pairs of rows B from row b0 of the
// depth on (the pair of b0's row when it is odd: A then leads with a zero).
template <class A>
void tile_product(Bf16Engine engine, const std::uint16_t* packed, Index n, Index depth, const std::uint16_t* B,
                  Index b0, Index ldc, Index D, A* O, const Same<A>* c) {
  if constexpr (std::is_same_v<A, float>) {
    const Index lead = b0 & 1, Kp = amx::padded_depth(lead + depth);
    auto* product = engine == Bf16Engine::dot ? &bf16dot::accumulate : &amx::accumulate;
    product(packed, n, Kp, B + (b0 - lead) * ldc, ldc, D, O, D, c);
  }
}

// O = c O + X B on the engine (Precision::bf16) for the f32 tile X [n, depth] (row stride ldx; kTrans:
// X^T, [depth, n] read down its columns) rounded to bf16 into A (`packed`), and the packed pairs of
// rows B from row `b0` of the depth on (the pair of b0's row when it is odd: A then leads with a zero).
template <bool kTrans, class A>
void tile_accumulate(Bf16Engine engine, const A* X, Index n, Index depth, Index ldx, std::uint16_t* packed,
                     const std::uint16_t* B, Index b0, Index ldc, Index D, A* O, const Same<A>* c) {
  if constexpr (std::is_same_v<A, float>) {
    if (kTrans)
      amx::pack_rounded_cols(X, depth, n, ldx, b0 & 1, packed);
    else
      amx::pack_rounded_rows(X, n, depth, ldx, b0 & 1, packed);
    tile_product(engine, packed, n, depth, B, b0, ldc, D, O, c);
  }
}

// The backward's dS of a piece (rows from chunk row i0, keys from tile key k0) on the dot products,
// rounded to bf16 as it is formed, then dQ += dS K and dK += dS^T Q: dS goes to ws.pb packed as the
// A of dQ's product and is transposed from there for dK's (Precision::bf16; never stored as f32).
template <class A>
void tile_grad_rounded(const Workspace<A>& ws, std::uint16_t* pb, std::uint16_t* pbt, Index i0, Index k0, Index n,
                       Index tk, const Same<A>* P, Index ldp, A scale, const Same<A>* delta, A* dq, A* dk) {
  if constexpr (std::is_same_v<A, float>) {
    const Index Dp = amx::padded_depth(ws.D), lk = k0 & 1;
    bf16dot::grad_rounded(ws.dob.data() + i0 * Dp, n, ws.vb.data() + 2 * k0, ws.ldk, tk, Dp, scale, P, ldp, delta, lk,
                          pb);
    tile_product(Bf16Engine::dot, pb, n, tk, ws.kpb.data(), k0, ws.ldc, ws.D, dq, nullptr);
    amx::pack_cols_of_rows(pb, n, tk, amx::padded_depth(lk + tk), lk, i0 & 1, pbt);
    tile_product(Bf16Engine::dot, pbt, tk, n, ws.qpb.data(), i0, ws.ldc, ws.D, dk, nullptr);
  }
}

// ---- the two kernels ------------------------------------------------------------------------------

template <class S, class A>
Work forward_impl(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& mask, A scale, OnlineState<A> st,
                  Workspace<A>& ws, Progress progress, A softcap) {
  const Index G = q.pk.G, D = q.pk.D, rows = q.pk.L * G, Lk = kv.pk.L;
  Work work;
  if (!block_visible(mask, q.pos, kv.pos)) return work;
  const Tiling& t = ws.tiling;
  const A alpha = static_cast<A>(double(scale) * kLog2e);
  const A cap = static_cast<A>(double(softcap) * kLog2e);  // the cap in log2 units; 0: none
  const Index ldk = ws.ld, lds = ws.ld, ldv = ws.ldd;
  std::optional<amx::TileScope> scope;
  const Bf16Engine engine = bf16_engine<S>(ws, scope);
  const bool on_engine = engine != Bf16Engine::none;
  const bool bf16p = rounds_to_bf16<S>(ws);
  for (Index b = 0; b < q.pk.B; ++b)
    for (Index g = 0; g < q.pk.HKV; ++g) {
      const S* qg = q.q + q.pk.q_group(b, g);
      const S* kg = kv.k + kv.pk.kv_group(b, g);
      const S* vg = kv.v + kv.pk.kv_group(b, g);
      A* mg = st.m + q.pk.row_group(b, g);
      A* lg = st.l + q.pk.row_group(b, g);
      A* ag = st.acc + q.pk.q_group(b, g);
      // non-finite operands, or finite ones whose scores may overflow to +-inf or NaN
      const bool nonfinite = scores_may_overflow(max_magnitude(qg, rows * D), max_magnitude(kg, Lk * D), D, alpha) ||
                             any_nonfinite(vg, Lk * D);
      // AMX for finite operands only: the exact paths of non-finite ones read the float copies (Q', V)
      const bool tiles = on_engine && !nonfinite;
      const bool pv_tiles = tiles && bf16p;  // P V on AMX too (Precision::bf16)
      Index q0 = 0, c0 = 0;
      walk::for_each_tile(
          mask, q.pos, G, kv.pos, rows, Lk, t, ws.R,
          [&](Index a, Index e) {  // Q' = alpha Q for the chunk's rows (AMX: Q's rows packed)
            q0 = a;
            if (tiles)
              amx::pack_rows(bf16_bits(qg + a * D), e - a, D, ws.qb.data());
            else
              scaled_rows(qg + a * D, e - a, D, alpha, ws.qs.data());
          },
          [&](Index c, Index tk) {  // the K/V tile: K^T (AMX: K packed), and V's rows as A (or pairs of keys)
            c0 = c;
            if (tiles)
              amx::pack_pairs(bf16_bits(kg + c * D), tk, D, ws.ldk, ws.kb.data());
            else
              transpose_rows(kg + c * D, tk, D, ws.kt.data(), ldk);
            if (pv_tiles)
              amx::pack_row_pairs(bf16_bits(vg + c * D), tk, D, ws.ldc, ws.vpb.data());
            else
              copy_rows(vg + c * D, tk, D, ws.vw.data(), ldv);
          },
          [&](const walk::Tile& tile, TileClass tile_cls) {
            walk::for_each_piece(mask, q.pos, G, kv.pos, tile, tile_cls, t.strip_rows,
                                 [&](const walk::Tile& p, TileClass cls) {
              const Index n = p.tq, tk = p.tk, k0 = p.c0 - c0;
              A* Sc = ws.s.data();  // the scores, then the probabilities, of the piece
              A* rmax = ws.rowmax.data();
              A* c = ws.rowc.data();
              // sweep 1: S = Q' K^T; the row max as it is stored (a partial piece or soft-capped scores:
              // after masking and capping)
              if (cls == TileClass::partial || cap > A(0)) {
                if (tiles)
                  tile_scores(engine, amx::Epilogue::store, ws, ws.qb.data(), p.r0 - q0, ws.kb.data(), k0, n, tk, Sc, lds, alpha,
                              nullptr, nullptr, nullptr);
                else
                  scores<Epilogue::store, A>(ws.qs.data() + (p.r0 - q0) * D, n, D, D, ws.kt.data() + k0, ldk, tk, Sc,
                                             lds, nullptr, nullptr, A(0), nullptr, nullptr);
                if (cap > A(0))  // a full piece takes its row maxima as it is capped
                  cap_tile(Sc, n, tk, lds, cap, static_cast<A*>(nullptr), cls == TileClass::partial ? nullptr : rmax);
                if (cls == TileClass::partial) {
                  walk::apply_mask(Sc, lds, mask, q.pos, G, kv.pos, p);
                  if (nonfinite)  // NaN scores are ordered as before; nan_rows below settles their rows
                    for (Index i = 0; i < n; ++i) rmax[i] = *std::max_element(Sc + i * lds, Sc + i * lds + tk);
                  else
                    row_max(Sc, n, tk, lds, rmax);
                }
              } else if (tiles) {
                tile_scores(engine, amx::Epilogue::max, ws, ws.qb.data(), p.r0 - q0, ws.kb.data(), k0, n, tk, Sc, lds, alpha,
                            nullptr, nullptr, rmax);
              } else {
                scores<Epilogue::max, A>(ws.qs.data() + (p.r0 - q0) * D, n, D, D, ws.kt.data() + k0, ldk, tk, Sc, lds,
                                      nullptr, nullptr, A(0), rmax, ws.vmax.data());
              }
              const bool exact = nonfinite && cls == TileClass::partial;  // sum over visible pairs only
              auto sees = [&](Index i, Index j) {
                return cls != TileClass::partial || mask.visible(q.pos[(p.r0 + i) / G], kv.pos[p.c0 + j]);
              };
              if (nonfinite) nan_rows(Sc, lds, n, tk, rmax);
              // sweep 2: m' = max(m, rowmax), P = 2^(S - m'), l' = c l + sum P, c = 2^(m - m')
              A* m = mg + p.r0;
              A* l = lg + p.r0;
              A* m_new = ws.rowmax.data();  // the row max becomes the new running max
              for (Index i = 0; i < n; ++i) {
                // a NaN max (a NaN score) stays: the row's softmax is NaN from here on
                m_new[i] = std::isnan(rmax[i]) ? rmax[i] : std::max(m[i], rmax[i]);
                // 2^(m - m'): 0 on the first visible block, 1 once the max settles, 1 (state kept)
                // while nothing is visible yet
                c[i] = m_new[i] == -std::numeric_limits<A>::infinity() ? A(0) : m[i] - m_new[i];
              }
              if (any_nonfinite_max(m_new, n))
                exp_tile<false, A, true>(Sc, n, tk, lds, m_new, nullptr, ws.rowsum.data(), cls != TileClass::partial);
              else
                exp_tile<false, A>(Sc, n, tk, lds, m_new, nullptr, ws.rowsum.data());
              std::copy_n(m_new, n, m);
              pow_rows(c, n);
              for (Index i = 0; i < n; ++i) l[i] = c[i] * l[i] + ws.rowsum[i];
              // sweep 3: O = c O + P V (Precision::bf16: P rounded to bf16 first, after l took its sum)
              if (pv_tiles)
                tile_accumulate<false>(engine, Sc, n, tk, lds, ws.pb.data(), ws.vpb.data(), k0, ws.ldc, D, ag + p.r0 * D,
                                       c);
              else if (bf16p)
                round_bf16_tile(Sc, Sc, n, tk, lds);
              if (exact)
                visible_accumulate(Sc, n, lds, tk, ws.vw.data() + k0 * ldv, ldv, D, c, ag + p.r0 * D, D, sees);
              else if (!pv_tiles)
                accumulate<false, A>(Sc, n, lds, tk, ws.vw.data() + k0 * ldv, ldv, D, c, ag + p.r0 * D, D);
              work.flops += 4.0 * double(n) * double(tk) * double(D);
            });
            ++work.tile_pairs;
            progress();
          });
    }
  return work;
}

template <class S, class A>
Work backward_impl(const GradQueryShard<S>& gq, const KVBlock<S>& kv, const Mask& mask, A scale, A* dk, A* dv,
                   Workspace<A>& ws, Progress progress, A softcap) {
  const QueryShard<S>& q = gq.q;
  const Index G = q.pk.G, D = q.pk.D, rows = q.pk.L * G, Lk = kv.pk.L;
  Work work;
  if (!block_visible(mask, q.pos, kv.pos)) return work;
  const Tiling& t = ws.tiling;
  const A alpha = static_cast<A>(double(scale) * kLog2e);
  const A cap = static_cast<A>(double(softcap) * kLog2e);  // the cap in log2 units; 0: none
  const Index ld = ws.ld, ldd = ws.ldd;
  std::optional<amx::TileScope> scope;
  const Bf16Engine engine = bf16_engine<S>(ws, scope);
  const bool on_engine = engine != Bf16Engine::none;
  const bool bf16p = rounds_to_bf16<S>(ws);
  for (Index b = 0; b < q.pk.B; ++b)
    for (Index g = 0; g < q.pk.HKV; ++g) {
      const Index qo = q.pk.q_group(b, g), ro = q.pk.row_group(b, g), ko = kv.pk.kv_group(b, g);
      // the forward's own test: S is recomputed on AMX exactly when the forward computed it there
      const bool qkv_nonfinite = any_nonfinite(q.q + qo, rows * D) || any_nonfinite(kv.k + ko, Lk * D) ||
                                 any_nonfinite(kv.v + ko, Lk * D);
      const bool nonfinite = qkv_nonfinite || any_nonfinite(gq.dout + qo, rows * D) ||
                             any_nonfinite(gq.l + ro, rows) || any_nonfinite(gq.delta + ro, rows);
      const bool s_tiles = on_engine && !qkv_nonfinite;
      const bool dp_tiles = on_engine && !nonfinite;  // the exact paths read V^T (visible_backward)
      const bool acc_tiles = dp_tiles && bf16p;      // Precision::bf16: the three accumulates on AMX too
      Index q0 = 0, c0 = 0;
      const A *Qc = ws.qw.data(), *dOc = ws.dow.data(), *K = ws.kw.data();
      walk::for_each_tile(
          mask, q.pos, G, kv.pos, rows, Lk, t, ws.R,
          [&](Index a, Index e) {  // the chunk's rows: Q' = alpha Q (AMX: Q, dO packed); Q and dO as A
            q0 = a;
            if (s_tiles)
              amx::pack_rows(bf16_bits(q.q + qo + a * D), e - a, D, ws.qb.data());
            else
              scaled_rows(q.q + qo + a * D, e - a, D, alpha, ws.qs.data());
            if (dp_tiles) amx::pack_rows(bf16_bits(gq.dout + qo + a * D), e - a, D, ws.dob.data());
            if (acc_tiles) {  // Q and dO as pairs of rows, the B of dK += dS^T Q and dV += P^T dO
              amx::pack_row_pairs(bf16_bits(q.q + qo + a * D), e - a, D, ws.ldc, ws.qpb.data());
              amx::pack_row_pairs(bf16_bits(gq.dout + qo + a * D), e - a, D, ws.ldc, ws.dopb.data());
            } else {
              copy_rows(q.q + qo + a * D, e - a, D, ws.qw.data(), ldd);
              copy_rows(gq.dout + qo + a * D, e - a, D, ws.dow.data(), ldd);
            }
          },
          [&](Index c, Index tk) {  // the K/V tile: K^T and V^T (AMX: K, V packed); K's rows as A
            c0 = c;
            if (s_tiles)
              amx::pack_pairs(bf16_bits(kv.k + ko + c * D), tk, D, ws.ldk, ws.kb.data());
            else
              transpose_rows(kv.k + ko + c * D, tk, D, ws.kt.data(), ld);
            if (dp_tiles)
              amx::pack_pairs(bf16_bits(kv.v + ko + c * D), tk, D, ws.ldk, ws.vb.data());
            else
              transpose_rows(kv.v + ko + c * D, tk, D, ws.vt.data(), ld);
            if (acc_tiles)  // K as pairs of keys, the B of dQ += dS K
              amx::pack_row_pairs(bf16_bits(kv.k + ko + c * D), tk, D, ws.ldc, ws.kpb.data());
            else
              copy_rows(kv.k + ko + c * D, tk, D, ws.kw.data(), ldd);
          },
          [&](const walk::Tile& tile, TileClass tile_cls) {
            walk::for_each_piece(mask, q.pos, G, kv.pos, tile, tile_cls, t.strip_rows,
                                 [&](const walk::Tile& p, TileClass cls) {
              const Index n = p.tq, tk = p.tk, k0 = p.c0 - c0, i0 = p.r0 - q0;
              A* P = ws.s.data();
              A* dS = ws.p.data();
              const A* m = gq.m + ro + p.r0;
              const A* l = gq.l + ro + p.r0;
              // sweep 1: P = 2^(S - m) / l, with the forward's own m (S recomputed bit for bit, so
              // S - m <= 0 and P <= 1 however large the logits) and l kept apart
              if (s_tiles)
                tile_scores(engine, amx::Epilogue::store, ws, ws.qb.data(), i0, ws.kb.data(), k0, n, tk, P, ld, alpha, nullptr,
                            nullptr, nullptr);
              else
                scores<Epilogue::store, A>(ws.qs.data() + i0 * D, n, D, D, ws.kt.data() + k0, ld, tk, P, ld, nullptr,
                                           nullptr, A(0), nullptr, nullptr);
              if (cap > A(0)) cap_tile(P, n, tk, ld, cap, dS);  // dS holds 1 - tanh^2 until sweep 3
              if (cls == TileClass::partial) walk::apply_mask(P, ld, mask, q.pos, G, kv.pos, p);
              A* inv = ws.rowc.data();
              for (Index i = 0; i < n; ++i) inv[i] = l[i] == A(0) ? A(0) : A(1) / l[i];  // l = 0: m = -inf, no key
              if (any_nonfinite_max(m, n))
                exp_tile<true, A, true>(P, n, tk, ld, m, inv, nullptr, cls != TileClass::partial);
              else
                exp_tile<true, A>(P, n, tk, ld, m, inv, nullptr);
              if (nonfinite && cls == TileClass::partial) {  // passes 2-4 over the visible pairs only
                visible_backward(P, dS, n, tk, ld, dOc + i0 * ldd, Qc + i0 * ldd, K + k0 * ldd, ws.vt.data() + k0, ldd,
                                 D, l, gq.delta + ro + p.r0, scale, cap > A(0), bf16p, gq.dq + qo + p.r0 * D,
                                 dk + ko + p.c0 * D, dv + ko + p.c0 * D, [&](Index i, Index j) {
                                   return mask.visible(q.pos[(p.r0 + i) / G], kv.pos[p.c0 + j]);
                                 });
                work.flops += 10.0 * double(n) * double(tk) * double(D);
                return;
              }
              // sweep 2: dV += P^T dO (Precision::bf16: P rounded to bf16 for this product only)
              A* dVp = dv + ko + p.c0 * D;
              if (acc_tiles) {
                tile_accumulate<true>(engine, P, tk, n, ld, ws.pbt.data(), ws.dopb.data(), i0, ws.ldc, D, dVp,
                                      nullptr);
              } else if (bf16p) {
                round_bf16_tile(P, ws.pr.data(), n, tk, ld);
                accumulate<true, A>(ws.pr.data(), tk, ld, n, dOc + i0 * ldd, ldd, D, nullptr, dVp, D);
              } else {
                accumulate<true, A>(P, tk, ld, n, dOc + i0 * ldd, ldd, D, nullptr, dVp, D);
              }
              // in the forward pass this was: s' = c tanh(s / c), so now: dS takes 1 - tanh^2
              if (cap > A(0)) mul_tile(P, dS, n, tk, ld);
              // sweep 3: dS = scale P o (dO V^T - delta), formed as it is stored (the dot products with
              // Precision::bf16: rounded as it is formed, and sweep 4 with it)
              if (acc_tiles && engine == Bf16Engine::dot) {
                tile_grad_rounded(ws, ws.pb.data(), ws.pbt.data(), i0, k0, n, tk, P, ld, scale, gq.delta + ro + p.r0,
                                  gq.dq + qo + p.r0 * D, dk + ko + p.c0 * D);
                work.flops += 10.0 * double(n) * double(tk) * double(D);
                return;
              }
              if (dp_tiles)
                tile_scores(engine, amx::Epilogue::grad, ws, ws.dob.data(), i0, ws.vb.data(), k0, n, tk, dS, ld, scale, P,
                            gq.delta + ro + p.r0, nullptr);
              else
                scores<Epilogue::grad, A>(dOc + i0 * ldd, n, ldd, D, ws.vt.data() + k0, ld, tk, dS, ld, P,
                                          gq.delta + ro + p.r0, scale, nullptr, nullptr);
              // sweep 4: dQ += dS K, dK += dS^T Q (Precision::bf16: dS rounded to bf16 first)
              if (acc_tiles) {
                tile_accumulate<false>(engine, dS, n, tk, ld, ws.pb.data(), ws.kpb.data(), k0, ws.ldc, D,
                                       gq.dq + qo + p.r0 * D, nullptr);
                tile_accumulate<true>(engine, dS, tk, n, ld, ws.pbt.data(), ws.qpb.data(), i0, ws.ldc, D,
                                      dk + ko + p.c0 * D, nullptr);
              } else {
                if (bf16p) round_bf16_tile(dS, dS, n, tk, ld);
                accumulate<false, A>(dS, n, ld, tk, K + k0 * ldd, ldd, D, nullptr, gq.dq + qo + p.r0 * D, D);
                accumulate<true, A>(dS, tk, ld, n, Qc + i0 * ldd, ldd, D, nullptr, dk + ko + p.c0 * D, D);
              }
              work.flops += 10.0 * double(n) * double(tk) * double(D);
            });
            ++work.tile_pairs;
            progress();
          });
    }
  return work;
}

// delta_i = sum_d dO_id O_id, one FMA chain over d in the order of the f32 kernels' dP products:
// for a row whose softmax is one-hot (O is its V row exactly), dP - delta is then exactly 0, as in
// the dense reference (delta_on_bf16_products does the same for dP on bf16 products).
//
// A row of dO holding an infinity has delta NaN. The dense form's delta, sum_j P_ij dP_ij, is then
// a sum of infinities (NaN when their signs differ, else one of them), and dP_ij - delta is NaN for
// every visible j either way; dO_i . O_i would be one signed infinity instead, and dP_ij - delta
// would be +-inf for some j, which dK would carry as +-inf where PyTorch has NaN.
template <class S, class A>
void delta_impl(const Packing& pk, const S* dout, const A* o, A* delta) {
  const hn::CappedTag<A, 1> d1;
  const Index rows = pk.row_elems(), D = pk.D;
  for (Index r = 0; r < rows; ++r) {
    auto acc = hn::Zero(d1);
    bool inf = false;
    for (Index e = 0; e < D; ++e) {
      const A x = widen<A>(dout[r * D + e]);
      inf = inf || std::isinf(x);
      acc = hn::MulAdd(hn::Set(d1, x), hn::Set(d1, o[r * D + e]), acc);
    }
    delta[r] = inf ? std::numeric_limits<A>::quiet_NaN() : hn::GetLane(acc);
  }
}

// The peak of this core's FMA units for A: independent chains of fused multiply-adds for `seconds`
// in windows of about 2 ms; the best window's rate, or (sustained) the rate over the whole time.
template <class A>
double fma_peak_impl(double seconds, bool sustained) {
  const Tag<A> d;
  using V = hn::Vec<decltype(d)>;
  // Distinct starting values the compiler cannot see, and a result it must keep: twelve chains it
  // can neither merge nor drop.
  static volatile A init[12] = {A(1), A(2), A(3), A(4), A(5), A(6), A(7), A(8), A(9), A(10), A(11), A(12)};
  [[maybe_unused]] static volatile A sink;
  const V a = hn::Set(d, A(0.999999)), x = hn::Set(d, A(1e-6));
  double best = 0, flops = 0;
  const auto t_start = std::chrono::steady_clock::now();
  const auto t_end = t_start + std::chrono::duration<double>(seconds);
  constexpr long kIters = 1 << 20;
  do {
    V c0 = hn::Set(d, init[0]), c1 = hn::Set(d, init[1]), c2 = hn::Set(d, init[2]), c3 = hn::Set(d, init[3]);
    V c4 = hn::Set(d, init[4]), c5 = hn::Set(d, init[5]), c6 = hn::Set(d, init[6]), c7 = hn::Set(d, init[7]);
    V c8 = hn::Set(d, init[8]), c9 = hn::Set(d, init[9]), c10 = hn::Set(d, init[10]), c11 = hn::Set(d, init[11]);
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < kIters; ++i) {
      c0 = hn::MulAdd(c0, a, x);
      c1 = hn::MulAdd(c1, a, x);
      c2 = hn::MulAdd(c2, a, x);
      c3 = hn::MulAdd(c3, a, x);
      c4 = hn::MulAdd(c4, a, x);
      c5 = hn::MulAdd(c5, a, x);
      c6 = hn::MulAdd(c6, a, x);
      c7 = hn::MulAdd(c7, a, x);
      c8 = hn::MulAdd(c8, a, x);
      c9 = hn::MulAdd(c9, a, x);
      c10 = hn::MulAdd(c10, a, x);
      c11 = hn::MulAdd(c11, a, x);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const V s0 = hn::Add(hn::Add(hn::Add(c0, c1), hn::Add(c2, c3)), hn::Add(hn::Add(c4, c5), hn::Add(c6, c7)));
    sink = hn::GetLane(hn::Add(s0, hn::Add(hn::Add(c8, c9), hn::Add(c10, c11))));
    const double window = 2.0 * double(hn::Lanes(d)) * 12.0 * double(kIters);
    best = std::max(best, window / dt);
    flops += window;
  } while (std::chrono::steady_clock::now() < t_end);
  if (!sustained) return best;
  return flops / std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
}

// The three sweeps of one forward piece of the default tiles (kTileQ query rows against kTileK
// keys, head dim D) on warm operands, each timed on its own, the best of `reps`: what the kernels do
// when nothing else touches the core or its caches; and the median piece, what they typically do.
// Scores are about N(0, 1), as for unit-variance Q and K at the usual scale. Before them, the tile's
// start (K transposed, V copied) is timed too.
template <class A>
simd::PieceTimes piece_times_impl(Index D, int reps) {
  Workspace<A> ws(Tiling{kTileQ, kTileK, 32, kTileQ}, D);
  const Index n = kTileQ, tk = kTileK;
  for (Index e = 0; e < n * D; ++e) ws.qs[e] = A(std::sin(0.7 * double(e))) / A(std::sqrt(double(D)));
  // one K/V tile as the block holds it, keys by row; each repetition's tile start makes K^T and V's copy
  AlignedVector<A> k(tk * D), v(tk * D);
  for (Index j = 0; j < tk; ++j)
    for (Index d = 0; d < D; ++d) {
      k[j * D + d] = A(std::cos(1.3 * double(d * tk + j)));
      v[j * D + d] = A(std::sin(0.3 * double(j * D + d)));
    }
  AlignedVector<A> o(n * D, A(0)), c(n, A(1));
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  simd::PieceTimes best{1e30, 1e30, 1e30, 2.0 * double(n) * double(tk) * double(D), 1e30, 0};
  std::vector<double> whole;  // each repetition's three sweeps together
  const int runs = std::max(reps, 1);
  whole.reserve(std::size_t(runs));
  for (int r = 0; r < runs; ++r) {
    const auto ts = clock::now();
    transpose_rows(k.data(), tk, D, ws.kt.data(), ws.ld);
    copy_rows(v.data(), tk, D, ws.vw.data(), ws.ldd);
    const auto t0 = clock::now();
    scores<Epilogue::max, A>(ws.qs.data(), n, D, D, ws.kt.data(), ws.ld, tk, ws.s.data(), ws.ld, nullptr, nullptr, A(0),
                             ws.rowmax.data(), ws.vmax.data());
    const auto t1 = clock::now();
    exp_tile<false, A>(ws.s.data(), n, tk, ws.ld, ws.rowmax.data(), nullptr, ws.rowsum.data());
    const auto t2 = clock::now();
    accumulate<false, A>(ws.s.data(), n, ws.ld, tk, ws.vw.data(), ws.ldd, D, c.data(), o.data(), D);
    const auto t3 = clock::now();
    best.score = std::min(best.score, seconds(t0, t1));
    best.exp = std::min(best.exp, seconds(t1, t2));
    best.accumulate = std::min(best.accumulate, seconds(t2, t3));
    best.tile_start = std::min(best.tile_start, seconds(ts, t0));
    whole.push_back(seconds(t0, t3));
    std::fill(o.begin(), o.end(), A(0));  // O stays bounded over the repetitions
  }
  best.piece_median = median(std::move(whole));
  return best;
}

// ---- what the dispatch calls ------------------------------------------------------------------

// One entry point per storage type and pass; bf16 and f16 compute in float.
#define RINGATTN_ENTRY_POINTS(NAME, S)                                                                        \
  Work Forward##NAME(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& m, accum_t<S> s,               \
                     OnlineState<accum_t<S>> st, Workspace<accum_t<S>>& ws, Progress p, accum_t<S> cap) {     \
    return forward_impl<S, accum_t<S>>(q, kv, m, s, st, ws, p, cap);                                          \
  }                                                                                                           \
  Work Backward##NAME(const GradQueryShard<S>& g, const KVBlock<S>& kv, const Mask& m, accum_t<S> s,          \
                      accum_t<S>* dk, accum_t<S>* dv, Workspace<accum_t<S>>& ws, Progress p, accum_t<S> cap) { \
    return backward_impl<S, accum_t<S>>(g, kv, m, s, dk, dv, ws, p, cap);                                     \
  }                                                                                                           \
  void Delta##NAME(const Packing& pk, const S* dout, const accum_t<S>* o, accum_t<S>* delta) {                \
    delta_impl(pk, dout, o, delta);                                                                           \
  }
RINGATTN_ENTRY_POINTS(F32, float)
RINGATTN_ENTRY_POINTS(F64, double)
RINGATTN_ENTRY_POINTS(BF16, bf16)
RINGATTN_ENTRY_POINTS(F16, f16)
#undef RINGATTN_ENTRY_POINTS
double FmaPeak(bool f64, double seconds, bool sustained) {
  return f64 ? fma_peak_impl<double>(seconds, sustained) : fma_peak_impl<float>(seconds, sustained);
}
simd::PieceTimes TimePiece(bool f64, Index D, int reps) {
  return f64 ? piece_times_impl<double>(D, reps) : piece_times_impl<float>(D, reps);
}
// y = 2^x as the kernels compute it in A (Exp2; x rounded to A first), for tests of its accuracy.
template <class A>
void exp2_values(const double* x, double* y, Index n) {
  const Tag<A> d;
  const Index N = static_cast<Index>(hn::Lanes(d));
  AlignedVector<A> buf(N);
  for (Index i = 0; i < n; i += N) {
    const Index m = std::min(N, n - i);
    std::fill(buf.begin(), buf.end(), A(0));
    for (Index j = 0; j < m; ++j) buf[j] = static_cast<A>(x[i + j]);
    hn::StoreU(Exp2(d, hn::LoadU(d, buf.data())), d, buf.data());
    for (Index j = 0; j < m; ++j) y[i + j] = double(buf[j]);
  }
}
void Exp2Values(bool f64, const double* x, double* y, Index n) {
  if (f64) exp2_values<double>(x, y, n);
  else exp2_values<float>(x, y, n);
}
const char* TargetName() { return hwy::TargetName(HWY_TARGET); }
bool FusedMultiplyAdd() { return HWY_NATIVE_FMA != 0; }
// Columns a score block covers at once (its row stride must round up to them), and the tiles.
Index ColumnBlock(bool f64) {
  return f64 ? kScoreVecs * Index(hn::Lanes(Tag<double>())) : kScoreVecs * Index(hn::Lanes(Tag<float>()));
}
Tiling DefaultTiling() { return Tiling{kTileQ, kTileK, 32, 0}; }

}  // namespace ringattn::core::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ringattn::core {
// Overloads per storage type that call the best target's entry point.
#define RINGATTN_EXPORT(NAME, S)                                                                              \
  HWY_EXPORT(Forward##NAME);                                                                                  \
  HWY_EXPORT(Backward##NAME);                                                                                 \
  HWY_EXPORT(Delta##NAME);                                                                                    \
  Work dispatch_forward(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& mask, accum_t<S> scale,     \
                        OnlineState<accum_t<S>> st, Workspace<accum_t<S>>& ws, Progress progress,             \
                        accum_t<S> softcap) {                                                                 \
    return HWY_DYNAMIC_DISPATCH(Forward##NAME)(q, kv, mask, scale, st, ws, progress, softcap);               \
  }                                                                                                           \
  Work dispatch_backward(const GradQueryShard<S>& g, const KVBlock<S>& kv, const Mask& mask, accum_t<S> scale, \
                         accum_t<S>* dk, accum_t<S>* dv, Workspace<accum_t<S>>& ws, Progress progress,        \
                         accum_t<S> softcap) {                                                                \
    return HWY_DYNAMIC_DISPATCH(Backward##NAME)(g, kv, mask, scale, dk, dv, ws, progress, softcap);          \
  }                                                                                                           \
  void dispatch_delta(const Packing& pk, const S* dout, const accum_t<S>* o, accum_t<S>* delta) {             \
    HWY_DYNAMIC_DISPATCH(Delta##NAME)(pk, dout, o, delta);                                                    \
  }
namespace {
RINGATTN_EXPORT(F32, float)
RINGATTN_EXPORT(F64, double)
RINGATTN_EXPORT(BF16, bf16)
RINGATTN_EXPORT(F16, f16)
}  // namespace
#undef RINGATTN_EXPORT

template <class S>
Work block_forward(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& mask, accum_t<S> scale,
                   OnlineState<accum_t<S>> st, Workspace<accum_t<S>>& ws, Progress progress, accum_t<S> softcap) {
  return dispatch_forward(q, kv, mask, scale, st, ws, progress, softcap);
}

template <class S>
Work block_backward(const GradQueryShard<S>& g, const KVBlock<S>& kv, const Mask& mask, accum_t<S> scale,
                    accum_t<S>* dk, accum_t<S>* dv, Workspace<accum_t<S>>& ws, Progress progress,
                    accum_t<S> softcap) {
  return dispatch_backward(g, kv, mask, scale, dk, dv, ws, progress, softcap);
}

namespace {

// delta for bf16 storage where the backward's dP = dO V^T runs on bf16 products (AMX tiles or a
// dot-product instruction). A row whose O is exactly bf16 (a one-hot softmax makes O a V row) takes
// delta_i = dO_i . O_i on that engine, each element of whose products is one chain in a fixed order
// whatever its row and column: delta_i then equals the row's dP_ij bit for bit and dS = 0 exactly,
// as on the f32 kernels. Other rows, and a delta that is not finite, keep delta_impl's. (A head
// group whose block holds a NaN or an infinity computes its dP on the f32 kernels instead, which
// this cannot know: there a one-hot row's dS is a rounding error of dP, not 0.)
void delta_on_bf16_products(const Packing& pk, const bf16* dout, const float* o, float* delta) {
  const bool dot = bf16dot::enabled();
  if (!dot && !amx::enabled()) return;
  constexpr Index T = amx::kTileRows;
  const Index D = pk.D, Dp = amx::padded_depth(D), rows = pk.row_elems(), ldk = amx::packed_keys(T);
  const auto* dbits = reinterpret_cast<const std::uint16_t*>(dout);
  std::vector<Index> batch;  // up to T rows whose O is bf16
  std::vector<std::uint16_t> x(T * D), hi(T * D), a(2 * T * Dp), b(Dp * ldk);
  std::vector<float> s(T * T);
  std::optional<amx::TileScope> scope;
  auto flush = [&] {
    const Index n = static_cast<Index>(batch.size());
    if (n == 0) return;
    if (!dot && !scope) scope.emplace();
    for (Index i = 0; i < n; ++i)
      for (Index d = 0; d < D; ++d) {
        x[i * D + d] = dbits[batch[i] * D + d];
        hi[i * D + d] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(o[batch[i] * D + d]) >> 16);
      }
    amx::pack_rows(x.data(), n, D, a.data());
    amx::pack_pairs(hi.data(), n, D, ldk, b.data());
    (dot ? &bf16dot::scores : &amx::scores)(amx::Epilogue::store, a.data(), n, b.data(), ldk, n, Dp, s.data(), T, 1.0f,
                                            nullptr, nullptr, nullptr);
    for (Index i = 0; i < n; ++i) delta[batch[i]] = s[i * T + i];
    batch.clear();
  };
  for (Index r = 0; r < rows; ++r) {
    if (!std::isfinite(delta[r])) continue;
    std::uint32_t low = 0;  // the bits below bf16's: zero for every d when O's row is bf16
    for (Index d = 0; d < D; ++d) low |= std::bit_cast<std::uint32_t>(o[r * D + d]) & 0xFFFFu;
    if (low != 0) continue;
    batch.push_back(r);
    if (static_cast<Index>(batch.size()) == T) flush();
  }
  flush();
}

}  // namespace

template <class S>
void compute_delta(const Packing& pk, const S* dout, const accum_t<S>* o, accum_t<S>* delta) {
  dispatch_delta(pk, dout, o, delta);
  if constexpr (std::is_same_v<S, bf16>) delta_on_bf16_products(pk, dout, o, delta);
}

#define RINGATTN_INSTANTIATE(S)                                                                                   \
  template Work block_forward<S>(const QueryShard<S>&, const KVBlock<S>&, const Mask&, accum_t<S>,                \
                                 OnlineState<accum_t<S>>, Workspace<accum_t<S>>&, Progress, accum_t<S>);           \
  template Work block_backward<S>(const GradQueryShard<S>&, const KVBlock<S>&, const Mask&, accum_t<S>,           \
                                  accum_t<S>*, accum_t<S>*, Workspace<accum_t<S>>&, Progress, accum_t<S>);        \
  template void compute_delta<S>(const Packing&, const S*, const accum_t<S>*, accum_t<S>*);
RINGATTN_INSTANTIATE(float)
RINGATTN_INSTANTIATE(double)
RINGATTN_INSTANTIATE(bf16)
RINGATTN_INSTANTIATE(f16)
#undef RINGATTN_INSTANTIATE

HWY_EXPORT(FmaPeak);
HWY_EXPORT(TimePiece);
HWY_EXPORT(Exp2Values);
HWY_EXPORT(TargetName);
HWY_EXPORT(FusedMultiplyAdd);
HWY_EXPORT(ColumnBlock);
HWY_EXPORT(DefaultTiling);

namespace simd {

double fma_peak(DType t, double seconds) { return HWY_DYNAMIC_DISPATCH(FmaPeak)(t == DType::f64, seconds, false); }
double fma_sustained(DType t, double seconds) {
  return HWY_DYNAMIC_DISPATCH(FmaPeak)(t == DType::f64, seconds, true);
}
PieceTimes piece_times(DType t, Index head_dim, int reps) {
  return HWY_DYNAMIC_DISPATCH(TimePiece)(t == DType::f64, head_dim, reps);
}
void exp2_values(DType t, const double* x, double* y, Index n) {
  HWY_DYNAMIC_DISPATCH(Exp2Values)(t == DType::f64, x, y, n);
}
std::string current() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }
bool fused_multiply_add() { return HWY_DYNAMIC_DISPATCH(FusedMultiplyAdd)(); }
std::string kernels(DType t) {
  const std::string extra = t == DType::bf16 ? bf16_products() : "";
  return extra.empty() ? current() : current() + "+" + extra;
}
Index column_block(std::size_t elem_size) { return HWY_DYNAMIC_DISPATCH(ColumnBlock)(elem_size == 8); }
Tiling default_tiling() { return HWY_DYNAMIC_DISPATCH(DefaultTiling)(); }

// Every target this build compiled (HWY_TARGETS), best first.
std::vector<std::int64_t> compiled_targets() {
  std::vector<std::int64_t> out;
  for (std::int64_t bits = HWY_TARGETS; bits != 0; bits &= bits - 1) out.push_back(bits & -bits);
  return out;
}

}  // namespace simd
}  // namespace ringattn::core
#endif
