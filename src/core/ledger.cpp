#include "ringattn/core/ledger.hpp"

#include <algorithm>
#include <fmt/format.h>

#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/core/head_split.hpp"

namespace ringattn::core {

std::string Shape::str() const { return fmt::format("B={} S={} H={} HKV={} D={}", B, S, H, HKV, D); }

std::string Ledger::str() const {
  return fmt::format(
      "fwd {}/{} replay {}/{} grad {}/{} a2a fwd {}/{} bwd {}/{} (send/recv elems), {}/{} bytes, resident {}, "
      "remote {}, online {}",
      fwd_kv_send_elems, fwd_kv_recv_elems, replay_kv_send_elems, replay_kv_recv_elems, grad_send_elems,
      grad_recv_elems, a2a_fwd_send_elems, a2a_fwd_recv_elems, a2a_bwd_send_elems, a2a_bwd_recv_elems, send_bytes,
      recv_bytes, resident_qkv_elems, remote_block_elems, online_state_elems);
}

Ledger expected_ledger(const Layout& layout, const Shape& s, int r, bool backward) {
  const int N = layout.ranks();
  const Index e = 2 * s.B * s.HKV * s.D;
  const Index Lr = layout.size(r);
  Ledger l;
  for (int j = 0; j + 1 < N; ++j) l.fwd_kv_send_elems += e * layout.size(((r - j) % N + N) % N);
  l.fwd_kv_recv_elems = e * (s.S - Lr);
  for (int o = 0; o < N; ++o)
    if (o != r) l.remote_block_elems = std::max(l.remote_block_elems, e * layout.size(o));
  if (backward) {
    l.replay_kv_send_elems = l.fwd_kv_send_elems;
    l.replay_kv_recv_elems = l.fwd_kv_recv_elems;
    l.grad_send_elems = e * (s.S - Lr);
    l.grad_recv_elems = e * (N - 1) * Lr;
  }
  l.resident_qkv_elems = s.B * Lr * (s.H + 2 * s.HKV) * s.D;
  l.online_state_elems = Lr * s.B * s.H * (s.D + 2);
  return l;
}

Ledger expected_ledger(const Layout& layout, const Shape& s, int r, bool backward, Traffic traffic,
                       const Mask& mask) {
  Ledger l = expected_ledger(layout, s, r, backward);
  if (traffic == Traffic::full) return l;
  const int N = layout.ranks();
  const Index e = 2 * s.B * s.HKV * s.D;
  auto need = [&](int q, int o) { return block_visible(mask, layout.positions(q), layout.positions(o)); };
  if (traffic == Traffic::aware) {
    l.fwd_kv_send_elems = l.fwd_kv_recv_elems = l.remote_block_elems = 0;
    for (int o = 0; o < N; ++o) {
      int reach = 0;
      for (int t = 1; t < N; ++t)
        if (need((o + t) % N, o)) reach = t;
      const int d = ((r - o) % N + N) % N;
      if (d >= 1 && d <= reach) {
        l.fwd_kv_recv_elems += e * layout.size(o);
        l.remote_block_elems = std::max(l.remote_block_elems, e * layout.size(o));
      }
      if (d < reach) l.fwd_kv_send_elems += e * layout.size(o);
    }
    if (backward) {
      l.replay_kv_send_elems = l.fwd_kv_send_elems;
      l.replay_kv_recv_elems = l.fwd_kv_recv_elems;
    }
  }
  if (backward) {
    l.grad_send_elems = l.grad_recv_elems = 0;
    for (int o = 0; o < N; ++o) {
      if (o == r) continue;
      if (need(r, o)) l.grad_send_elems += e * layout.size(o);
      if (need(o, r)) l.grad_recv_elems += e * layout.size(r);
    }
  }
  return l;
}

Ledger expected_a2a_ledger(const Layout& layout, const Shape& s, int U, int r, bool backward, Index storage,
                           Index accum) {
  const HeadSplit h = split_heads(s, U);
  const Index e = h.Hu + 2 * h.HKVu, Lr = layout.size(r), BD = s.B * s.D;
  Ledger l;
  const int first = r / U * U;
  for (int w = first; w < first + U; ++w) {
    if (w == r) continue;
    const Index Lw = layout.size(w);
    // forward: q, k, v (storage) out and in; O and LSE (accumulation) back
    l.a2a_fwd_send_elems += BD * (Lr * e + Lw * h.Hu) + s.B * h.Hu * Lw;
    l.a2a_fwd_recv_elems += BD * (Lw * e + Lr * h.Hu) + s.B * h.Hu * Lr;
    l.send_bytes += storage * BD * Lr * e + accum * (BD * Lw * h.Hu + s.B * h.Hu * Lw);
    l.recv_bytes += storage * BD * Lw * e + accum * (BD * Lr * h.Hu + s.B * h.Hu * Lr);
    if (!backward) continue;
    // backward: dO (storage) out and in; dQ, dK, dV (accumulation) back
    l.a2a_bwd_send_elems += BD * (Lr * h.Hu + Lw * e);
    l.a2a_bwd_recv_elems += BD * (Lw * h.Hu + Lr * e);
    l.send_bytes += storage * BD * Lr * h.Hu + accum * BD * Lw * e;
    l.recv_bytes += storage * BD * Lw * h.Hu + accum * BD * Lr * e;
  }
  return l;
}

}  // namespace ringattn::core
