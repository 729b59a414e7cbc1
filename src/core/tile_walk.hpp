#pragma once
// Which parts of a (query rows x K/V block) product the kernels compute, and in what order
// (private to src/core; the same for every SIMD target).
//
// Query rows are swept in chunks of R rows whose operands stay in L2; within a chunk the K/V tiles
// are the outer loop and the query tiles the inner one, so each row meets the keys in increasing
// order and a K/V tile is prepared (transposed, widened) once per chunk. A tile with no visible pair
// is skipped; a partly visible tile is cut into strips of `strip_rows` rows, each trimmed to the keys
// its rows can see: on a causal diagonal that is a staircase instead of the whole square.
#include <algorithm>
#include <limits>
#include <span>

#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/mask.hpp"

namespace ringattn::core::walk {

// Query rows [r0, r0 + tq) of one head group, keys [c0, c0 + tk) of one block.
struct Tile {
  Index r0, tq, c0, tk;
};

// Class of a tile from the global positions of its first and last rows and keys (row r is
// position r / G).
inline TileClass classify(const Mask& mask, std::span<const Index> qpos, Index G, std::span<const Index> kpos,
                          const Tile& t) {
  if (mask.is_full()) return TileClass::full;
  return mask.classify(qpos[t.r0 / G], qpos[(t.r0 + t.tq - 1) / G], kpos[t.c0], kpos[t.c0 + t.tk - 1]);
}

// Calls fn(piece, class) for the parts of tile t that hold visible pairs. Positions increase along
// rows and keys, so a key that classify() calls empty for a strip's first..last positions is seen
// by none of its rows.
template <class Fn>
void for_each_piece(const Mask& mask, std::span<const Index> qpos, Index G, std::span<const Index> kpos, const Tile& t,
                    TileClass cls, Index strip, Fn&& fn) {
  if (cls != TileClass::partial) {
    fn(t, cls);
    return;
  }
  const Index step = strip > 0 ? strip : t.tq;
  for (Index r0 = t.r0; r0 < t.r0 + t.tq; r0 += step) {
    const Index tq = std::min(step, t.r0 + t.tq - r0);
    const Index qmin = qpos[r0 / G], qmax = qpos[(r0 + tq - 1) / G];
    Index a = t.c0, b = t.c0 + t.tk;
    while (a < b && mask.classify(qmin, qmax, kpos[a], kpos[a]) == TileClass::empty) ++a;
    while (b > a && mask.classify(qmin, qmax, kpos[b - 1], kpos[b - 1]) == TileClass::empty) --b;
    if (a == b) continue;
    const Tile piece{r0, tq, a, b - a};
    const TileClass c = classify(mask, qpos, G, kpos, piece);
    if (c != TileClass::empty) fn(piece, c);
  }
}

// Scores of invisible pairs of a partly visible piece become -inf (row stride lds). The keys a
// position sees are an interval of positions (causal: j <= i; a window: i - w < j; documents: i's
// own), and key positions increase along the piece, so each row sees an interval of its keys: only
// the invisible keys at either end are tested, one by one from the ends inward, and filled.
template <class T>
void apply_mask(T* s, Index lds, const Mask& mask, std::span<const Index> qpos, Index G, std::span<const Index> kpos,
                const Tile& t) {
  const std::span<const Index> keys = kpos.subspan(t.c0, t.tk);
  for (Index i = 0; i < t.tq; ++i) {
    const Index qi = qpos[(t.r0 + i) / G];
    T* row = s + i * lds;
    Index lo = 0, hi = t.tk;
    while (lo < hi && !mask.visible(qi, keys[lo])) ++lo;
    while (hi > lo && !mask.visible(qi, keys[hi - 1])) --hi;
    std::fill(row, row + lo, -std::numeric_limits<T>::infinity());
    std::fill(row + hi, row + t.tk, -std::numeric_limits<T>::infinity());
  }
}

// Calls chunk(q0, q1) for each chunk of query rows, then within it tile_start(c0, tk) for each K/V
// tile that has a visible pair with the chunk, then fn(tile, class) for its query tiles with one.
template <class Chunk, class TileStart, class Fn>
void for_each_tile(const Mask& mask, std::span<const Index> qpos, Index G, std::span<const Index> kpos, Index rows,
                   Index Lk, const Tiling& tiling, Index R, Chunk&& chunk, TileStart&& tile_start, Fn&& fn) {
  const Index TQ = tiling.q_rows, TK = tiling.k_cols;
  for (Index q0 = 0; q0 < rows; q0 += R) {
    const Index q1 = std::min(rows, q0 + R);
    bool chunk_started = false;
    for (Index c0 = 0; c0 < Lk; c0 += TK) {
      const Index tk = std::min(TK, Lk - c0);
      bool started = false;
      for (Index r0 = q0; r0 < q1; r0 += TQ) {
        const Tile tile{r0, std::min(TQ, q1 - r0), c0, tk};
        const TileClass cls = classify(mask, qpos, G, kpos, tile);
        if (cls == TileClass::empty) continue;
        if (!chunk_started) chunk(q0, q1);
        if (!started) tile_start(c0, tk);
        chunk_started = started = true;
        fn(tile, cls);
      }
    }
  }
}

}  // namespace ringattn::core::walk
