#pragma once
// The communication and memory ledger of one rank: what moved, in elements and bytes.
// The runtime counts what actually moved; expected_ledger() is the closed form for the ring
// protocol in which every block travels (forward N-1 sends and receives per rank, the same again
// for the replay, and one gradient return per (query rank, remote owner) pair).
#include <string>

#include "ringattn/core/layout.hpp"
#include "ringattn/core/ring_plan.hpp"

namespace ringattn::core {

// Trivially copyable: ranks gather it as is. Bytes are counted as things move, at their real
// element sizes (K/V blocks in the storage type, gradient returns in the accumulation type).
struct Ledger {
  Index fwd_kv_send_elems = 0, fwd_kv_recv_elems = 0;
  Index replay_kv_send_elems = 0, replay_kv_recv_elems = 0;
  Index grad_send_elems = 0, grad_recv_elems = 0;
  Index resident_qkv_elems = 0;   // the rank's own Q, K and V
  Index remote_block_elems = 0;   // the largest remote K/V block it held
  Index online_state_elems = 0;   // m, l and a: L * B * H * (D + 2)
  // Head-parallel strategies: elements moved by the all-to-alls of each pass (to and from other
  // ranks; what a rank keeps for itself is not counted).
  Index a2a_fwd_send_elems = 0, a2a_fwd_recv_elems = 0;
  Index a2a_bwd_send_elems = 0, a2a_bwd_recv_elems = 0;
  // All-gather strategy: the K/V gathered from the other ranks in each pass, and the dK/dV
  // reduce-scatter (contributions sent to their owners, and received for this rank's positions).
  Index ag_fwd_recv_elems = 0, ag_bwd_recv_elems = 0;
  Index rs_bwd_send_elems = 0, rs_bwd_recv_elems = 0;
  Index send_bytes = 0, recv_bytes = 0;  // everything that moved, in bytes

  Index send_elems() const {
    return fwd_kv_send_elems + replay_kv_send_elems + grad_send_elems + a2a_fwd_send_elems + a2a_bwd_send_elems +
           rs_bwd_send_elems;
  }
  Index recv_elems() const {
    return fwd_kv_recv_elems + replay_kv_recv_elems + grad_recv_elems + a2a_fwd_recv_elems + a2a_bwd_recv_elems +
           ag_fwd_recv_elems + ag_bwd_recv_elems + rs_bwd_recv_elems;
  }
  // Fills send_bytes and recv_bytes of a ring ledger: K/V elements of kv_bytes each, gradient
  // returns of grad_bytes each.
  void ring_bytes(Index kv_bytes, Index grad_bytes) {
    send_bytes = (fwd_kv_send_elems + replay_kv_send_elems) * kv_bytes + grad_send_elems * grad_bytes;
    recv_bytes = (fwd_kv_recv_elems + replay_kv_recv_elems) * kv_bytes + grad_recv_elems * grad_bytes;
  }
  bool operator==(const Ledger&) const = default;
  std::string str() const;
};

// Closed form for rank r. With e = 2 B HKV D (K and V of one position) and L_o the sizes:
//   fwd send  = e * sum_{j=0}^{N-2} L_{(r-j) mod N}     fwd recv  = e * (S - L_r)
//   grad send = e * (S - L_r)                           grad recv = e * (N - 1) * L_r
//   resident  = B L_r (H + 2 HKV) D    remote block = e * max_{o != r} L_o    online = L_r B H (D + 2)
// The replay equals the forward; without a backward pass the replay and gradients are zero.
Ledger expected_ledger(const Layout& layout, const Shape& shape, int rank, bool backward);

// Closed form for any traffic plan. With need(q, o) = "some pair of rank q's queries and block o's
// keys is visible", d(r, o) = (r - o) mod N and reach(o) = max { t : need(o + t, o) }:
//   aware:  fwd recv = e * sum_o [1 <= d(r,o) <= reach(o)] L_o,  fwd send = e * sum_o [d(r,o) < reach(o)] L_o,
//           grad send = e * sum_{o != r} [need(r, o)] L_o,       grad recv = e * L_r * #{q != r : need(q, r)}
//   skip_empty_grads: K/V as full, gradients as aware.
Ledger expected_ledger(const Layout& layout, const Shape& shape, int rank, bool backward, Traffic traffic,
                       const Mask& mask);

}  // namespace ringattn::core
