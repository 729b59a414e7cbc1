#pragma once
// How a Ulysses group of U ranks shares the heads, and what its all-to-alls move.
//
// Member u of a group takes the query heads [u Hu, (u+1) Hu), Hu = H / U, over all the group's
// positions. Query head h reads kv head h / G (G = H / HKV). The member's heads are cut into runs of
// Gu = gcd(Hu, G) consecutive heads; a run never straddles two kv heads, so the member holds
// HKVu = Hu / Gu kv heads, local kv head j being kv head (u Hu + j Gu) / G. When HKV % U == 0 that
// is HKV / U distinct heads (Gu = G); otherwise some kv heads are replicated to several members
// (and, when Hu and G do not divide one another, more than once to one member): more bytes, which
// the ledger shows, and each copy's dK/dV is summed back into its head by the owner of the position.
#include <numeric>

#include "ringattn/core/layout.hpp"
#include "ringattn/core/ledger.hpp"
#include "ringattn/core/shape.hpp"

namespace ringattn::core {

struct HeadSplit {
  Index U = 1, G = 1;     // group size; query heads per kv head of the whole shape
  Index Hu = 1, Gu = 1;   // a member's query heads, and per local kv head
  Index HKVu = 1;         // a member's kv heads (copies included)
  Index q_head(int u, Index j) const { return u * Hu + j; }                // member u's query head j
  Index kv_head(int u, Index j) const { return (u * Hu + j * Gu) / G; }    // member u's kv head j
  // The shape member u attends: all S positions, its heads.
  Shape local(const Shape& s) const { return Shape{s.B, s.S, Hu, HKVu, s.D}; }
  bool replicates(const Shape& s) const { return U * HKVu > s.HKV; }
};

// Requires H % HKV == 0 and H % U == 0 (the caller validates).
inline HeadSplit split_heads(const Shape& s, Index U) {
  HeadSplit h;
  h.U = U;
  h.G = s.H / s.HKV;
  h.Hu = s.H / U;
  h.Gu = std::gcd(h.Hu, h.G);
  h.HKVu = h.Hu / h.Gu;
  return h;
}

// Closed form of the all-to-all fields of rank r's ledger (usp with groups of U consecutive ranks;
// ulysses is U = N). With Lw the shard sizes, v over the other members w of r's group, and
// e = Hu + 2 HKVu (a position's q, k, v for one member):
//   forward   send = sum_w B D (Lr e + Lw Hu) + B Hu Lw    (q, k, v out; O and LSE back to w)
//             recv = sum_w B D (Lw e + Lr Hu) + B Hu Lr
//   backward  send = sum_w B D (Lr Hu + Lw e)              (dO out; dQ, dK, dV back to w)
//             recv = sum_w B D (Lw Hu + Lr e)
// With even shards and HKV % N == 0 (ulysses) each pass receives (N-1)/N B (S/N) (2H + 2HKV) D,
// plus the forward's LSE (N-1)/N B (S/N) H. Bytes: q, k, v, dO in `storage` bytes, the rest in
// `accum` bytes; send_bytes and recv_bytes hold the all-to-alls' bytes only.
Ledger expected_a2a_ledger(const Layout& layout, const Shape& s, int U, int r, bool backward, Index storage,
                           Index accum);

}  // namespace ringattn::core
