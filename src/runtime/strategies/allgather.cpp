#include "ringattn/runtime/allgather_attention.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "ring_steps.hpp"
#include "ringattn/comm/simulation.hpp"

namespace ringattn::runtime {

namespace {

// Heads [h0, h0 + p.H()) of file-order [B, L, H, D] into the packing p, and back.
template <class T>
void pack_slice(const core::Packing& p, const T* file, Index H, Index h0, T* packed) {
  for (Index b = 0; b < p.B; ++b)
    for (Index i = 0; i < p.L; ++i)
      for (Index g = 0; g < p.HKV; ++g)
        std::copy_n(file + ((b * p.L + i) * H + h0 + g * p.G) * p.D, p.G * p.D, packed + p.q_group(b, g) + i * p.G * p.D);
}

template <class T>
void unpack_slice(const core::Packing& p, const T* packed, Index H, Index h0, T* file) {
  for (Index b = 0; b < p.B; ++b)
    for (Index i = 0; i < p.L; ++i)
      for (Index g = 0; g < p.HKV; ++g)
        std::copy_n(packed + p.q_group(b, g) + i * p.G * p.D, p.G * p.D, file + ((b * p.L + i) * H + h0 + g * p.G) * p.D);
}

}  // namespace

template <class S>
AllGatherAttention<S>::AllGatherAttention(const comm::Comm& comm, const StrategySetup& setup)
    : comm_(comm),
      s_(setup),
      r_(comm.rank()),
      N_(comm.size()),
      G_(setup.kv_head_group),
      groups_(static_cast<int>(setup.shape.HKV / setup.kv_head_group)),
      ws_(core::resolve_tiling(setup.tiling, setup.shape.D, setup.layout->max_size(), setup.shape.G()),
          setup.shape.D) {
  const core::Shape& sh = s_.shape;
  L_ = s_.layout->size(r_);
  pq_ = core::Packing{sh.B, G_, sh.G(), L_, sh.D};
  displ_.assign(N_ + 1, 0);
  for (int q = 0; q < N_; ++q) displ_[q + 1] = displ_[q] + block_elems(q);
  g_.resize(groups_);
  for (Group& g : g_) {
    g.q.resize(pq_.q_elems());
    g.m.resize(pq_.row_elems());
    g.l.resize(pq_.row_elems());
    g.lse.resize(pq_.row_elems());
    g.acc.resize(pq_.q_elems());
  }
  own_block_.resize(block_elems(r_));
  for (auto& buf : gathered_) buf.resize(displ_[N_]);
}

template <class S>
core::Packing AllGatherAttention<S>::block_packing(int owner) const {
  return core::Packing{s_.shape.B, G_, 1, s_.layout->size(owner), s_.shape.D};
}

template <class S>
core::KVBlock<S> AllGatherAttention<S>::view(int owner, const S* gathered) const {
  const core::Packing pk = block_packing(owner);
  const S* k = gathered + displ_[owner];
  return core::KVBlock<S>{pk, s_.layout->positions(owner), k, k + pk.kv_elems()};
}

template <class S>
Index AllGatherAttention<S>::resident_bytes() const {
  auto bytes = [](const auto& v) { return Index(v.size()) * Index(sizeof(v[0])); };
  Index b = bytes(q_file_) + bytes(k_file_) + bytes(v_file_) + bytes(dout_file_) + bytes(own_block_) +
            bytes(gathered_[0]) + bytes(gathered_[1]) + bytes(contrib_) + bytes(returned_);
  for (const Group& g : g_)
    b += bytes(g.q) + bytes(g.dout) + bytes(g.m) + bytes(g.l) + bytes(g.acc) + bytes(g.lse) + bytes(g.delta) +
         bytes(g.dq) + bytes(g.dkv);
  return b + core::Workspace<A>::bytes(ws_.tiling, ws_.D);
}

template <class S>
void AllGatherAttention<S>::allocate_backward() {
  if (backward_ready_) return;
  backward_ready_ = true;
  for (Group& g : g_) {
    g.dout.resize(pq_.q_elems());
    g.delta.resize(pq_.row_elems());
    g.dq.resize(pq_.q_elems());
    g.dkv.resize(block_elems(r_));
  }
  contrib_.resize(displ_[N_]);
  returned_.resize(Index(N_) * block_elems(r_));
}

template <class S>
void AllGatherAttention<S>::load(const S* q, const S* k, const S* v) {
  const core::Shape& sh = s_.shape;
  if (!s_.timing_only) {  // timing-only: no data
    q_file_.assign(q, q + sh.B * L_ * sh.H * sh.D);
    k_file_.assign(k, k + sh.B * L_ * sh.HKV * sh.D);
    v_file_.assign(v, v + sh.B * L_ * sh.HKV * sh.D);
    for (int g = 0; g < groups_; ++g) pack_slice(pq_, q, sh.H, Index(g) * G_ * sh.G(), g_[g].q.data());
  }
  ledger_ = core::Ledger{};
  ledger_.resident_qkv_elems = sh.B * L_ * (sh.H + 2 * sh.HKV) * sh.D;
  ledger_.online_state_elems = L_ * sh.B * sh.H * (sh.D + 2);
}

template <class S>
void AllGatherAttention<S>::load_dout(const S* dout) {
  allocate_backward();
  if (s_.timing_only) return;
  const core::Shape& sh = s_.shape;
  dout_file_.assign(dout, dout + sh.B * L_ * sh.H * sh.D);
  for (int g = 0; g < groups_; ++g) pack_slice(pq_, dout, sh.H, Index(g) * G_ * sh.G(), g_[g].dout.data());
}

template <class S>
Index AllGatherAttention<S>::start_gather(int g, int slot, comm::Exchange& x, Pass pass) {
  const core::Packing own = block_packing(r_);
  if (!s_.timing_only) {  // this rank's K then V of the group's kv heads, packed as a block travels
    pack_slice(own, k_file_.data(), s_.shape.HKV, Index(g) * G_, own_block_.data());
    pack_slice(own, v_file_.data(), s_.shape.HKV, Index(g) * G_, own_block_.data() + own.kv_elems());
  }
  std::vector<std::int64_t> counts(N_), displs(N_);
  for (int q = 0; q < N_; ++q) {
    counts[q] = block_elems(q) * Index(sizeof(S));
    displs[q] = displ_[q] * Index(sizeof(S));
  }
  x.iallgatherv(own_block_.data(), gathered_[slot].data(), counts, displs, "the K/V all-gather");
  const Index received = displ_[N_] - block_elems(r_);
  (pass == Pass::forward ? ledger_.ag_fwd_recv_elems : ledger_.ag_bwd_recv_elems) += received;
  ledger_.remote_block_elems = std::max(ledger_.remote_block_elems, received);
  // What this rank's block costs the others to receive: sent once per peer.
  const Index sent = Index(N_ - 1) * block_elems(r_) * Index(sizeof(S));
  ledger_.send_bytes += sent;
  ledger_.recv_bytes += received * Index(sizeof(S));
  return sent + received * Index(sizeof(S));
}

template <class S>
PassStats AllGatherAttention<S>::forward() {
  RingSteps<S> step(s_, r_, ledger_, nullptr, Pass::forward, groups_);
  ledger_.ag_fwd_recv_elems = 0;
  ledger_.send_bytes = ledger_.recv_bytes = 0;
  const A scale = static_cast<A>(s_.scale);
  comm::Exchange gather[2] = {comm::Exchange(comm_), comm::Exchange(comm_)};
  const Index first = start_gather(0, 0, gather[0], Pass::forward);
  for (int g = 0; g < groups_; ++g) {
    step.begin(g, -1, Phase::gather);
    if (g == 0) step.moved(first);
    step.waited(gather[g % 2].wait([&] {
      return fmt::format("rank {} forward: the K/V all-gather of kv-head group {} (of 0..{})", r_, g, groups_ - 1);
    }));
    // The next group's gather is in flight while this one is attended.
    if (g + 1 < groups_) step.moved(start_gather(g + 1, (g + 1) % 2, gather[(g + 1) % 2], Pass::forward));
    Group& grp = g_[g];
    core::OnlineState<A> st{grp.m.data(), grp.l.data(), grp.acc.data()};
    if (step.computes()) core::init_online_state(pq_, st);
    const core::QueryShard<S> qs{pq_, s_.layout->positions(r_), grp.q.data()};
    const S* kv = gathered_[g % 2].data();
    for (int q = 0; q < N_; ++q) {
      if (s_.layout->size(q) == 0 || L_ == 0) continue;
      step.compute(
          [&] {
            return core::block_forward(qs, view(q, kv), *s_.mask, scale, st, ws_, [&] {
              gather[(g + 1) % 2].test();
              if (s_.poll) s_.poll();
            });
          },
          [&] { return core::count_block_forward(qs, view(q, kv), *s_.mask, ws_); }, 1.0);
    }
    if (step.computes()) core::finalize_forward(pq_, st, grp.lse.data());
    step.end();
  }
  return step.finish();
}

template <class S>
PassStats AllGatherAttention<S>::backward() {
  RingSteps<S> step(s_, r_, ledger_, nullptr, Pass::backward, groups_);
  allocate_backward();
  ledger_.ag_bwd_recv_elems = ledger_.rs_bwd_send_elems = ledger_.rs_bwd_recv_elems = 0;
  const A scale = static_cast<A>(s_.scale);
  const Index own = block_elems(r_);
  comm::Exchange gather[2] = {comm::Exchange(comm_), comm::Exchange(comm_)};
  const Index first = start_gather(0, 0, gather[0], Pass::backward);
  for (int g = 0; g < groups_; ++g) {
    step.begin(g, -1, Phase::gather);
    if (g == 0) step.moved(first);
    step.waited(gather[g % 2].wait([&] {
      return fmt::format("rank {} backward: the K/V all-gather of kv-head group {} (of 0..{})", r_, g, groups_ - 1);
    }));
    if (g + 1 < groups_) step.moved(start_gather(g + 1, (g + 1) % 2, gather[(g + 1) % 2], Pass::backward));
    Group& grp = g_[g];
    const S* kv = gathered_[g % 2].data();
    if (step.computes()) {
      core::compute_delta(pq_, grp.dout.data(), grp.acc.data(), grp.delta.data());
      std::fill(grp.dq.begin(), grp.dq.end(), A(0));
      std::fill(contrib_.begin(), contrib_.end(), A(0));
    }
    const core::QueryShard<S> qs{pq_, s_.layout->positions(r_), grp.q.data()};
    const core::GradQueryShard<S> gq{qs, grp.dout.data(), grp.m.data(), grp.l.data(), grp.delta.data(), grp.dq.data()};
    for (int q = 0; q < N_; ++q) {
      if (s_.layout->size(q) == 0 || L_ == 0) continue;
      A* dk = contrib_.data() + displ_[q];
      A* dv = dk + block_packing(q).kv_elems();
      step.compute(
          [&] {
            return core::block_backward(gq, view(q, kv), *s_.mask, scale, dk, dv, ws_, [&] {
              gather[(g + 1) % 2].test();
              if (s_.poll) s_.poll();
            });
          },
          [&] { return core::count_block_forward(qs, view(q, kv), *s_.mask, ws_); }, 2.5);
    }
    // Reduce-scatter: each contribution to its owner; the owner sums them in source-rank order.
    std::vector<std::int64_t> sc(N_), sd(N_), rc(N_), rd(N_);
    for (int q = 0; q < N_; ++q) {
      sc[q] = block_elems(q) * Index(sizeof(A));
      sd[q] = displ_[q] * Index(sizeof(A));
      rc[q] = own * Index(sizeof(A));
      rd[q] = Index(q) * own * Index(sizeof(A));
    }
    step.waited(comm_.alltoallv(contrib_.data(), sc, sd, returned_.data(), rc, rd, "the dK/dV reduce-scatter"));
    step.moved((displ_[N_] - own + Index(N_ - 1) * own) * Index(sizeof(A)));
    ledger_.rs_bwd_send_elems += displ_[N_] - own;
    ledger_.rs_bwd_recv_elems += Index(N_ - 1) * own;
    ledger_.send_bytes += (displ_[N_] - own) * Index(sizeof(A));
    ledger_.recv_bytes += Index(N_ - 1) * own * Index(sizeof(A));
    if (step.computes()) {
      std::copy_n(returned_.data(), own, grp.dkv.data());
      for (int q = 1; q < N_; ++q) {
        const A* src = returned_.data() + Index(q) * own;
        for (Index e = 0; e < own; ++e) grp.dkv[e] += src[e];
      }
    }
    step.end();
  }
  return step.finish();
}

template <class S>
void AllGatherAttention<S>::outputs(A* o, A* lse, A* dq, A* dk, A* dv) const {
  const core::Shape& sh = s_.shape;
  const core::Packing own = block_packing(r_);
  for (int g = 0; g < groups_; ++g) {
    const Group& grp = g_[g];
    const Index h0 = Index(g) * G_ * sh.G(), k0 = Index(g) * G_;
    if (o) unpack_slice(pq_, grp.acc.data(), sh.H, h0, o);
    if (dq) unpack_slice(pq_, grp.dq.data(), sh.H, h0, dq);
    if (dk) unpack_slice(own, grp.dkv.data(), sh.HKV, k0, dk);
    if (dv) unpack_slice(own, grp.dkv.data() + own.kv_elems(), sh.HKV, k0, dv);
    if (lse)  // row stats [B, G, L, H/HKV] -> [B, H, L]
      for (Index b = 0; b < pq_.B; ++b)
        for (Index kv = 0; kv < pq_.HKV; ++kv)
          for (Index i = 0; i < L_; ++i)
            for (Index t = 0; t < pq_.G; ++t)
              lse[(b * sh.H + h0 + kv * pq_.G + t) * L_ + i] = grp.lse[pq_.row_group(b, kv) + i * pq_.G + t];
  }
}

template class AllGatherAttention<float>;
template class AllGatherAttention<double>;
template class AllGatherAttention<core::bf16>;
template class AllGatherAttention<core::f16>;

}  // namespace ringattn::runtime
