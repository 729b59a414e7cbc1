#include "ringattn/runtime/allgather_attention.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "ring_steps.hpp"
#include "ringattn/comm/simulation.hpp"

namespace ringattn::runtime {

namespace {

// Heads [h0, h0 + p.H()) of rows [i0, i0 + p.L) of file-order [B, Lf, H, D] into the packing p.
template <class T>
void pack_rows(const core::Packing& p, const T* file, Index Lf, Index i0, Index H, Index h0, T* packed) {
  for (Index b = 0; b < p.B; ++b)
    for (Index i = 0; i < p.L; ++i)
      for (Index g = 0; g < p.HKV; ++g)
        std::copy_n(file + ((b * Lf + i0 + i) * H + h0 + g * p.G) * p.D, p.G * p.D,
                    packed + p.q_group(b, g) + i * p.G * p.D);
}

template <class T>
void pack_slice(const core::Packing& p, const T* file, Index H, Index h0, T* packed) {
  pack_rows(p, file, p.L, 0, H, h0, packed);
}

template <class T>
void unpack_slice(const core::Packing& p, const T* packed, Index H, Index h0, T* file) {
  for (Index b = 0; b < p.B; ++b)
    for (Index i = 0; i < p.L; ++i)
      for (Index g = 0; g < p.HKV; ++g)
        std::copy_n(packed + p.q_group(b, g) + i * p.G * p.D, p.G * p.D, file + ((b * p.L + i) * H + h0 + g * p.G) * p.D);
}

// One tag per kind of message (MPI's non-overtaking order keeps a pair's groups in sequence).
constexpr int kTagGather = 21, kTagReduce = 22;

// The keys query i sees form one interval [first, last] of global positions that contains i (every
// mask: causal, window, documents and their combinations), and both ends are non-decreasing in i.
// So a run a..b of consecutive query positions sees [first(a), last(b)], and each end is a binary
// search on visible(). A row that would not see itself is taken to need everything.
struct Interval {
  Index first, last;
};

Interval visible_keys(const core::Mask& m, Index i, Index S) {
  if (!m.visible(i, i)) return {0, S - 1};
  Index lo = 0, hi = i;  // smallest j <= i with visible(i, j)
  while (lo < hi) {
    const Index mid = lo + (hi - lo) / 2;
    if (m.visible(i, mid)) hi = mid;
    else lo = mid + 1;
  }
  const Index first = lo;
  lo = i, hi = S - 1;  // largest j >= i with visible(i, j)
  while (lo < hi) {
    const Index mid = lo + (hi - lo + 1) / 2;
    if (m.visible(i, mid)) lo = mid;
    else hi = mid - 1;
  }
  return {first, lo};
}

// The keys some query of `pos` (increasing) sees: disjoint intervals in increasing order.
std::vector<Interval> seen_keys(const core::Mask& m, std::span<const Index> pos, Index S) {
  std::vector<Interval> out;
  for (std::size_t a = 0; a < pos.size();) {
    std::size_t b = a;
    while (b + 1 < pos.size() && pos[b + 1] == pos[b] + 1) ++b;
    const Interval iv{visible_keys(m, pos[a], S).first, visible_keys(m, pos[b], S).last};
    if (!out.empty() && iv.first <= out.back().last + 1) out.back().last = std::max(out.back().last, iv.last);
    else out.push_back(iv);
    a = b + 1;
  }
  return out;
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
          setup.shape.D, setup.precision) {
  const core::Shape& sh = s_.shape;
  L_ = s_.layout->size(r_);
  pq_ = core::Packing{sh.B, G_, sh.G(), L_, sh.D};
  const core::Layout& lay = *s_.layout;
  need_.resize(N_);
  give_.resize(N_);
  for (int q = 0; q < N_; ++q) need_[q] = Range{0, lay.size(q)}, give_[q] = Range{0, L_};
  if (s_.mask->window() > 0 || s_.mask->has_docs()) {
    // The smallest range of `owner`'s local indices holding every key in `seen`.
    auto covering = [&](const std::vector<Interval>& seen, int owner) {
      const std::span<const Index> pos = lay.positions(owner);
      Range r{pos.size() ? Index(pos.size()) : 0, 0};
      for (const Interval& iv : seen) {
        const Index a = std::lower_bound(pos.begin(), pos.end(), iv.first) - pos.begin();
        const Index b = std::upper_bound(pos.begin(), pos.end(), iv.last) - pos.begin();
        if (a < b) r.lo = std::min(r.lo, a), r.hi = std::max(r.hi, b);
      }
      return r.hi > r.lo ? r : Range{};
    };
    const std::vector<Interval> mine = seen_keys(*s_.mask, lay.positions(r_), sh.S);
    std::int64_t short_of_all = 0;
    for (int q = 0; q < N_; ++q) {
      need_[q] = covering(mine, q);
      give_[q] = q == r_ ? need_[q] : covering(seen_keys(*s_.mask, lay.positions(q), sh.S), r_);
      if (need_[q].size() < lay.size(q)) short_of_all = 1;
    }
    std::int64_t any[1] = {short_of_all};
    comm_.allreduce_max(std::span<std::int64_t>(any));  // every rank takes the same way
    sliced_ = any[0] != 0;
    if (!sliced_)
      for (int q = 0; q < N_; ++q) need_[q] = Range{0, lay.size(q)}, give_[q] = Range{0, L_};
  }
  p2p_ = sliced_ || comm::simulated();
  displ_.assign(N_ + 1, 0);
  sdispl_.assign(N_ + 1, 0);
  for (int q = 0; q < N_; ++q) {
    displ_[q + 1] = displ_[q] + block_elems(q);
    sdispl_[q + 1] = sdispl_[q] + (q == r_ ? 0 : give_elems(q));
  }
  rdispl_ = sdispl_;  // the reduce-scatter receives, in the accumulation type, what the gather sent
  g_.resize(groups_);
  for (Group& g : g_) {
    g.q.resize(pq_.q_elems());
    g.m.resize(pq_.row_elems());
    g.l.resize(pq_.row_elems());
    g.lse.resize(pq_.row_elems());
    g.acc.resize(pq_.q_elems());
  }
  if (sliced_) send_.resize(sdispl_[N_]);
  else own_block_.resize(block_elems(r_));
  for (auto& buf : gathered_) buf.resize(displ_[N_]);
}

template <class S>
core::Packing AllGatherAttention<S>::block_packing(int owner) const {
  return core::Packing{s_.shape.B, G_, 1, need_[owner].size(), s_.shape.D};
}

template <class S>
core::Packing AllGatherAttention<S>::own_packing() const {
  return core::Packing{s_.shape.B, G_, 1, L_, s_.shape.D};
}

template <class S>
core::KVBlock<S> AllGatherAttention<S>::view(int owner, const S* gathered) const {
  const core::Packing pk = block_packing(owner);
  const S* k = gathered + displ_[owner];
  return core::KVBlock<S>{pk, s_.layout->positions(owner).subspan(need_[owner].lo, need_[owner].size()), k,
                          k + pk.kv_elems()};
}

template <class S>
Index AllGatherAttention<S>::resident_bytes() const {
  auto bytes = [](const auto& v) { return Index(v.size()) * Index(sizeof(v[0])); };
  Index b = bytes(q_file_) + bytes(k_file_) + bytes(v_file_) + bytes(dout_file_) + bytes(own_block_) + bytes(send_) +
            bytes(gathered_[0]) + bytes(gathered_[1]) + bytes(contrib_) + bytes(returned_);
  for (const Group& g : g_)
    b += bytes(g.q) + bytes(g.dout) + bytes(g.m) + bytes(g.l) + bytes(g.acc) + bytes(g.lse) + bytes(g.delta) +
         bytes(g.dq) + bytes(g.dkv);
  return b + core::Workspace<A>::bytes(ws_.tiling, ws_.D, ws_.precision);
}

template <class S>
void AllGatherAttention<S>::allocate_backward() {
  if (backward_ready_) return;
  backward_ready_ = true;
  for (Group& g : g_) {
    g.dout.resize(pq_.q_elems());
    g.delta.resize(pq_.row_elems());
    g.dq.resize(pq_.q_elems());
    g.dkv.resize(2 * own_packing().kv_elems());
  }
  contrib_.resize(displ_[N_]);
  returned_.resize(rdispl_[N_]);
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
  has_dlse_ = false;
  if (s_.timing_only) return;
  const core::Shape& sh = s_.shape;
  dout_file_.assign(dout, dout + sh.B * L_ * sh.H * sh.D);
  for (int g = 0; g < groups_; ++g) pack_slice(pq_, dout, sh.H, Index(g) * G_ * sh.G(), g_[g].dout.data());
}

template <class S>
void AllGatherAttention<S>::load_dlse(const A* dlse) {
  has_dlse_ = dlse != nullptr;
  if (!dlse || s_.timing_only) return;
  const core::Shape& sh = s_.shape;
  for (int g = 0; g < groups_; ++g) {  // rows of heads [h0, h0 + G H/HKV) from [B, H, L]
    Group& grp = g_[g];
    grp.dlse.resize(pq_.row_elems());
    const Index h0 = Index(g) * G_ * sh.G();
    for (Index b = 0; b < pq_.B; ++b)
      for (Index kv = 0; kv < pq_.HKV; ++kv)
        for (Index i = 0; i < L_; ++i)
          for (Index t = 0; t < pq_.G; ++t)
            grp.dlse[pq_.row_group(b, kv) + i * pq_.G + t] = dlse[(b * sh.H + h0 + kv * pq_.G + t) * L_ + i];
  }
}

template <class S>
void AllGatherAttention<S>::add_sink_grad(double* dsinks) const {
  if (!s_.sinks || s_.timing_only) return;
  for (int g = 0; g < groups_; ++g) {
    const Index h0 = Index(g) * G_ * s_.shape.G();
    core::add_sink_grad(pq_, g_[g].m.data(), g_[g].l.data(), g_[g].delta.data(), s_.sinks + h0, dsinks + h0);
  }
}

template <class S>
Index AllGatherAttention<S>::start_gather(int g, int slot, comm::Exchange& x, Pass pass) {
  const core::Shape& sh = s_.shape;
  Index received = 0, sent = 0;  // elements
  if (!p2p_) {
    const core::Packing own = own_packing();
    if (!s_.timing_only) {  // this rank's K then V of the group's kv heads, packed as a block travels
      pack_slice(own, k_file_.data(), sh.HKV, Index(g) * G_, own_block_.data());
      pack_slice(own, v_file_.data(), sh.HKV, Index(g) * G_, own_block_.data() + own.kv_elems());
    }
    std::vector<std::int64_t> counts(N_), displs(N_);
    for (int q = 0; q < N_; ++q) {
      counts[q] = block_elems(q) * Index(sizeof(S));
      displs[q] = displ_[q] * Index(sizeof(S));
    }
    x.iallgatherv(own_block_.data(), gathered_[slot].data(), counts, displs, "the K/V all-gather");
    received = displ_[N_] - block_elems(r_);
    sent = Index(N_ - 1) * block_elems(r_);  // what this block costs the others: once per peer
  } else if (!sliced_) {
    // The whole block to every peer, point to point (the simulation build: see p2p_).
    const core::Packing own = own_packing();
    if (!s_.timing_only) {
      pack_slice(own, k_file_.data(), sh.HKV, Index(g) * G_, own_block_.data());
      pack_slice(own, v_file_.data(), sh.HKV, Index(g) * G_, own_block_.data() + own.kv_elems());
      std::copy_n(own_block_.data(), block_elems(r_), gathered_[slot].data() + displ_[r_]);
    }
    // Peers in the order r+1, r+2, ..: the first messages of every rank go to different ranks.
    for (int j = 1; j < N_; ++j)
      if (const int q = (r_ + N_ - j) % N_; block_elems(q) > 0) {
        x.irecv(gathered_[slot].data() + displ_[q], block_elems(q) * sizeof(S), q, kTagGather);
        received += block_elems(q);
      }
    for (int j = 1; j < N_; ++j)
      if (const int q = (r_ + j) % N_; block_elems(r_) > 0) {
        x.isend(own_block_.data(), block_elems(r_) * sizeof(S), q, kTagGather);
        sent += block_elems(r_);
      }
  } else {
    // Each peer's slice of this rank's K then V (its own slice straight into the gathered group),
    // then one message each way per pair that needs anything.
    if (!s_.timing_only)
      for (int q = 0; q < N_; ++q) {
        const Range rg = q == r_ ? need_[r_] : give_[q];
        if (rg.size() == 0) continue;
        S* dst = q == r_ ? gathered_[slot].data() + displ_[r_] : send_.data() + sdispl_[q];
        const core::Packing p{sh.B, G_, 1, rg.size(), sh.D};
        pack_rows(p, k_file_.data(), L_, rg.lo, sh.HKV, Index(g) * G_, dst);
        pack_rows(p, v_file_.data(), L_, rg.lo, sh.HKV, Index(g) * G_, dst + p.kv_elems());
      }
    for (int j = 1; j < N_; ++j)
      if (const int q = (r_ + N_ - j) % N_; need_[q].size() > 0) {
        x.irecv(gathered_[slot].data() + displ_[q], block_elems(q) * sizeof(S), q, kTagGather);
        received += block_elems(q);
      }
    for (int j = 1; j < N_; ++j)
      if (const int q = (r_ + j) % N_; give_[q].size() > 0) {
        x.isend(send_.data() + sdispl_[q], give_elems(q) * sizeof(S), q, kTagGather);
        sent += give_elems(q);
      }
  }
  (pass == Pass::forward ? ledger_.ag_fwd_recv_elems : ledger_.ag_bwd_recv_elems) += received;
  ledger_.remote_block_elems = std::max(ledger_.remote_block_elems, received);
  ledger_.send_bytes += sent * Index(sizeof(S));
  ledger_.recv_bytes += received * Index(sizeof(S));
  return (sent + received) * Index(sizeof(S));
}

template <class S>
PassStats AllGatherAttention<S>::forward() {
  RingSteps<S> step(s_, r_, ledger_, nullptr, Pass::forward, groups_);
  ledger_.ag_fwd_recv_elems = 0;
  ledger_.send_bytes = ledger_.recv_bytes = 0;
  const A scale = static_cast<A>(s_.scale), softcap = static_cast<A>(s_.softcap);
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
    const double* sinks = s_.sinks ? s_.sinks + Index(g) * G_ * s_.shape.G() : nullptr;  // the group's heads
    if (step.computes()) core::init_online_state(pq_, st);
    const core::QueryShard<S> qs{pq_, s_.layout->positions(r_), grp.q.data()};
    const S* kv = gathered_[g % 2].data();
    for (int q = 0; q < N_; ++q) {
      if (need_[q].size() == 0 || L_ == 0) continue;
      step.compute(
          [&] {
            return core::block_forward(qs, view(q, kv), *s_.mask, scale, st, ws_, [&] {
              gather[(g + 1) % 2].test();
              if (s_.poll) s_.poll();
            }, softcap);
          },
          [&] { return core::count_block_forward(qs, view(q, kv), *s_.mask, ws_); }, 1.0);
    }
    if (step.computes()) core::finalize_forward(pq_, st, grp.lse.data(), sinks, /*every_row_sees_a_key=*/true);
    step.end();
  }
  return step.finish();
}

template <class S>
PassStats AllGatherAttention<S>::backward() {
  RingSteps<S> step(s_, r_, ledger_, nullptr, Pass::backward, groups_);
  allocate_backward();
  ledger_.ag_bwd_recv_elems = ledger_.rs_bwd_send_elems = ledger_.rs_bwd_recv_elems = 0;
  const A scale = static_cast<A>(s_.scale), softcap = static_cast<A>(s_.softcap);
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
      if (has_dlse_)  // dS_ij += P_ij dLSE_i
        for (std::size_t r = 0; r < grp.delta.size(); ++r) grp.delta[r] -= grp.dlse[r];
      std::fill(grp.dq.begin(), grp.dq.end(), A(0));
      std::fill(contrib_.begin(), contrib_.end(), A(0));
    }
    const core::QueryShard<S> qs{pq_, s_.layout->positions(r_), grp.q.data()};
    const core::GradQueryShard<S> gq{qs, grp.dout.data(), grp.m.data(), grp.l.data(), grp.delta.data(), grp.dq.data()};
    // Reduce-scatter, pipelined: every other rank's contribution to this rank's block is received
    // while this rank computes; its own contribution to block q goes to q as soon as block q is
    // done. Blocks are taken in the order r+1, r+2, .., r (mod N), so at any moment each owner
    // receives from one rank, as in the ring, and the last send overlaps the own block.
    comm::Exchange reduce(comm_);
    Index sent = 0, received = 0;
    for (int q = 0; q < N_; ++q)
      if (q != r_ && give_[q].size() > 0) {
        reduce.irecv(returned_.data() + rdispl_[q], give_elems(q) * sizeof(A), q, kTagReduce);
        received += give_elems(q);
      }
    for (int j = 1; j <= N_; ++j) {
      const int q = (r_ + j) % N_;
      if (need_[q].size() == 0) continue;
      A* dk = contrib_.data() + displ_[q];
      A* dv = dk + block_packing(q).kv_elems();
      if (L_ > 0)
        step.compute(
            [&] {
              return core::block_backward(gq, view(q, kv), *s_.mask, scale, dk, dv, ws_, [&] {
                gather[(g + 1) % 2].test();
                reduce.test();
                if (s_.poll) s_.poll();
              }, softcap);
            },
            [&] { return core::count_block_forward(qs, view(q, kv), *s_.mask, ws_); }, 2.5);
      if (q != r_) {  // a rank without queries still sends its (zero) contribution: the owner waits for it
        reduce.isend(dk, block_elems(q) * sizeof(A), q, kTagReduce);
        sent += block_elems(q);
      }
    }
    step.waited(reduce.wait([&] {
      return fmt::format("rank {} backward: the dK/dV reduce-scatter of kv-head group {} (of 0..{})", r_, g,
                         groups_ - 1);
    }));
    step.moved((sent + received) * Index(sizeof(A)));
    ledger_.rs_bwd_send_elems += sent;
    ledger_.rs_bwd_recv_elems += received;
    ledger_.send_bytes += sent * Index(sizeof(A));
    ledger_.recv_bytes += received * Index(sizeof(A));
    if (step.computes()) {
      // dK then dV of [B, G, L, D]; source q's slice covers local rows give_[q].
      const core::Packing own = own_packing();
      std::fill(grp.dkv.begin(), grp.dkv.end(), A(0));
      for (int q = 0; q < N_; ++q) {  // in source-rank order, this rank's own contribution in its place
        const Range rg = give_[q];
        const A* src = q == r_ ? contrib_.data() + displ_[r_] : returned_.data() + rdispl_[q];
        const core::Packing p{own.B, own.HKV, 1, rg.size(), own.D};
        for (int part = 0; part < 2; ++part)
          for (Index b = 0; b < p.B; ++b)
            for (Index h = 0; h < p.HKV; ++h) {
              const A* from = src + part * p.kv_elems() + p.kv_group(b, h);
              A* to = grp.dkv.data() + part * own.kv_elems() + own.kv_group(b, h) + rg.lo * own.D;
              for (Index e = 0; e < rg.size() * own.D; ++e) to[e] += from[e];
            }
      }
    }
    step.end();
  }
  return step.finish();
}

template <class S>
void AllGatherAttention<S>::outputs(A* o, A* lse, A* dq, A* dk, A* dv) const {
  const core::Shape& sh = s_.shape;
  const core::Packing own = own_packing();
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
