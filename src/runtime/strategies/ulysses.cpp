#include "ringattn/runtime/ulysses_attention.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace ringattn::runtime {

namespace {

int degree(const comm::Comm& comm, const StrategySetup& s) {
  const int U = s.kind == StrategyKind::ulysses ? comm.size() : s.ulysses_degree;
  if (U < 1 || comm.size() % U != 0 || s.shape.H % U != 0)
    throw std::logic_error(fmt::format("UlyssesAttention: U={} must divide N={} and H={}", U, comm.size(), s.shape.H));
  return U;
}

std::vector<Index> scaled(const std::vector<Index>& sizes, Index per_position) {
  std::vector<Index> out(sizes.size());
  for (std::size_t v = 0; v < sizes.size(); ++v) out[v] = sizes[v] * per_position;
  return out;
}

}  // namespace

template <class S>
UlyssesAttention<S>::UlyssesAttention(const comm::Comm& comm, const StrategySetup& setup)
    : s_(setup),
      r_(comm.rank()),
      U_(degree(comm, setup)),
      u_(r_ % U_),
      L_(setup.layout->size(r_)),
      hs_(core::split_heads(setup.shape, U_)),
      group_(comm.split(r_ / U_, u_)),
      ring_(comm.split(u_, r_ / U_)),
      group_layout_(core::Layout::grouped(*setup.layout, U_)) {
  const core::Shape& sh = s_.shape;
  const int g = r_ / U_;
  Lg_ = group_layout_.size(g);
  gidx_.resize(U_);
  Lw_.resize(U_);
  for (int v = 0; v < U_; ++v) {
    const auto pos = s_.layout->positions(g * U_ + v);
    Lw_[v] = Index(pos.size());
    for (Index p : pos) gidx_[v].push_back(group_layout_.local_index(p));
  }
  inner_setup_ = s_;
  inner_setup_.shape = hs_.local(sh);
  inner_setup_.layout = &group_layout_;
  inner_setup_.tiling = core::resolve_tiling(s_.tiling, sh.D, group_layout_.max_size(), hs_.Gu);
  inner_setup_.sinks = s_.sinks ? s_.sinks + hs_.q_head(u_, 0) : nullptr;  // this member's heads
  inner_setup_.kind = StrategyKind::ring;
  inner_setup_.ulysses_degree = 1;
  inner_setup_.hooks.stall_rank = s_.hooks.stall_rank == r_ ? g : -1;
  inner_ = std::make_unique<RingAttention<S>>(ring_, inner_setup_);

  const Index B = sh.B, qkv = q_row() + 2 * kv_row();
  qkv_send_.resize(U_ * B * L_ * qkv);
  qkv_recv_.resize(B * Lg_ * qkv);
  q_g_.resize(B * Lg_ * q_row());
  k_g_.resize(B * Lg_ * kv_row());
  v_g_.resize(B * Lg_ * kv_row());
  o_g_.resize(B * Lg_ * q_row());
  lse_g_.resize(B * hs_.Hu * Lg_);
  const Index ret = std::max(qkv, q_row() + hs_.Hu);  // per position: dQ, dK, dV or O, LSE
  out_send_.resize(B * Lg_ * ret);
  out_recv_.resize(U_ * B * L_ * ret);
  o_.resize(B * L_ * sh.H * sh.D);
  lse_.resize(B * sh.H * L_);
}

template <class S>
Index UlyssesAttention<S>::resident_bytes() const {
  auto bytes = [](const auto&... v) { return ((Index(v.size()) * Index(sizeof(v[0]))) + ...); };
  return inner_->resident_bytes() + bytes(qkv_send_, qkv_recv_, dout_send_, dout_recv_, q_g_, k_g_, v_g_, dout_g_) +
         bytes(o_g_, lse_g_, dq_g_, dk_g_, dv_g_, out_send_, out_recv_, o_, lse_, dq_, dk_, dv_);
}

// Member v's block of the send buffer: [q: B, L, Hu, D][k: B, L, HKVu, D][v: same] of this rank's
// positions, v's heads.
template <class S>
void UlyssesAttention<S>::load(const S* q, const S* k, const S* v) {
  const core::Shape& sh = s_.shape;
  const Index B = sh.B, D = sh.D, qr = q_row(), kr = kv_row(), blk = B * L_ * (qr + 2 * kr);
  if (!s_.timing_only) {
    for (int m = 0; m < U_; ++m) {
      S* qd = qkv_send_.data() + m * blk;
      S* kd = qd + B * L_ * qr;
      S* vd = kd + B * L_ * kr;
      for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < L_; ++i) {
          const Index row = b * L_ + i;
          std::memcpy(qd + row * qr, q + (row * sh.H + hs_.q_head(m, 0)) * D, sizeof(S) * qr);
          for (Index j = 0; j < hs_.HKVu; ++j) {
            const Index src = (row * sh.HKV + hs_.kv_head(m, j)) * D;
            std::memcpy(kd + row * kr + j * D, k + src, sizeof(S) * D);
            std::memcpy(vd + row * kr + j * D, v + src, sizeof(S) * D);
          }
        }
    }
  }
  a2a_ = core::Ledger{};
  a2a_bytes_[0][0] = a2a_bytes_[0][1] = a2a_bytes_[1][0] = a2a_bytes_[1][1] = 0;
}

template <class S>
void UlyssesAttention<S>::load_dout(const S* dout) {
  const core::Shape& sh = s_.shape;
  const Index B = sh.B, D = sh.D, qr = q_row(), blk = B * L_ * qr;
  has_dlse_ = false;
  if (!backward_ready_) {  // the backward's buffers, on first use
    backward_ready_ = true;
    dout_send_.resize(U_ * blk);
    dout_recv_.resize(B * Lg_ * qr);
    dout_g_.resize(B * Lg_ * qr);
    dq_g_.resize(B * Lg_ * qr);
    dk_g_.resize(B * Lg_ * kv_row());
    dv_g_.resize(B * Lg_ * kv_row());
    dq_.resize(B * L_ * sh.H * D);
    dk_.resize(B * L_ * sh.HKV * D);
    dv_.resize(B * L_ * sh.HKV * D);
  }
  if (!s_.timing_only) {
    for (int m = 0; m < U_; ++m)
      for (Index row = 0; row < B * L_; ++row)
        std::memcpy(dout_send_.data() + m * blk + row * qr, dout + (row * sh.H + hs_.q_head(m, 0)) * D,
                    sizeof(S) * qr);
  }
}

// Member v's block: [B, Hu, L] of this rank's positions, v's heads.
template <class S>
void UlyssesAttention<S>::load_dlse(const A* dlse) {
  has_dlse_ = dlse != nullptr;
  if (!dlse) return;
  const Index B = s_.shape.B, Hu = hs_.Hu;
  dlse_send_.resize(U_ * B * Hu * L_);
  dlse_recv_.resize(B * Hu * Lg_);
  dlse_g_.resize(B * Hu * Lg_);
  if (s_.timing_only) return;
  for (int m = 0; m < U_; ++m)
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < Hu; ++h)
        std::copy_n(dlse + (b * s_.shape.H + hs_.q_head(m, h)) * L_, L_, dlse_send_.data() + ((m * B + b) * Hu + h) * L_);
}

template <class S>
void UlyssesAttention<S>::add_sink_grad(double* dsinks) const {
  inner_->add_sink_grad(dsinks + hs_.q_head(u_, 0));  // the inner ring's sinks are this member's heads
}

template <class S>
template <class T>
double UlyssesAttention<S>::exchange(Pass pass, const core::AlignedVector<T>& send, const std::vector<Index>& send_counts,
                                 core::AlignedVector<T>& recv, const std::vector<Index>& recv_counts, const char* what,
                                 StepRecord& rec) {
  std::vector<std::int64_t> sb(U_), sd(U_), rb(U_), rd(U_);
  std::int64_t so = 0, ro = 0;
  Index sent = 0, received = 0;
  for (int v = 0; v < U_; ++v) {
    sb[v] = send_counts[v] * Index(sizeof(T));
    rb[v] = recv_counts[v] * Index(sizeof(T));
    sd[v] = so;
    rd[v] = ro;
    so += sb[v];
    ro += rb[v];
    if (v == u_) continue;  // what a rank keeps is not communication
    sent += send_counts[v];
    received += recv_counts[v];
  }
  if (so > std::int64_t(send.size() * sizeof(T)) || ro > std::int64_t(recv.size() * sizeof(T)))
    throw std::logic_error("UlyssesAttention: all-to-all buffer too small");
  const int p = static_cast<int>(pass);
  a2a_bytes_[p][0] += sent * Index(sizeof(T));
  a2a_bytes_[p][1] += received * Index(sizeof(T));
  if (pass == Pass::forward) {
    a2a_.a2a_fwd_send_elems += sent;
    a2a_.a2a_fwd_recv_elems += received;
  } else {
    a2a_.a2a_bwd_send_elems += sent;
    a2a_.a2a_bwd_recv_elems += received;
  }
  rec.bytes += (sent + received) * Index(sizeof(T));
  const double waited = group_.alltoallv(send.data(), sb, sd, recv.data(), rb, rd,
                                         fmt::format("{} of Ulysses group {}", what, r_ / U_));
  rec.wait_s += waited;
  return waited;
}

// A pass's figures: the all-to-all in, the ring's steps, the all-to-all out.
template <class S>
PassStats UlyssesAttention<S>::finish_pass(const StepRecord& in, const PassStats& ring, const StepRecord& out,
                                       double t_pass) {
  PassStats ps;
  ps.steps.push_back(in);
  ps.steps.insert(ps.steps.end(), ring.steps.begin(), ring.steps.end());
  ps.steps.push_back(out);
  ps.work = ring.work;
  ps.compute_s = ring.compute_s;
  ps.a2a_wait_s = in.wait_s + out.wait_s;
  ps.wait_s = ring.wait_s + ps.a2a_wait_s;
  fold_ledger();
  ps.total_s = comm::wtime() - t_pass;
  return ps;
}

template <class S>
void UlyssesAttention<S>::fold_ledger() {
  const core::Ledger& ring = inner_->ledger();
  ledger_ = ring;
  ledger_.a2a_fwd_send_elems = a2a_.a2a_fwd_send_elems;
  ledger_.a2a_fwd_recv_elems = a2a_.a2a_fwd_recv_elems;
  ledger_.a2a_bwd_send_elems = a2a_.a2a_bwd_send_elems;
  ledger_.a2a_bwd_recv_elems = a2a_.a2a_bwd_recv_elems;
  ledger_.send_bytes = ring.send_bytes + a2a_bytes_[0][0] + a2a_bytes_[1][0];
  ledger_.recv_bytes = ring.recv_bytes + a2a_bytes_[0][1] + a2a_bytes_[1][1];
}

template <class S>
PassStats UlyssesAttention<S>::forward() {
  const double t_pass = comm::wtime();
  const core::Shape& sh = s_.shape;
  const Index B = sh.B, D = sh.D, Hu = hs_.Hu, qr = q_row(), kr = kv_row(), qkv = qr + 2 * kr;
  a2a_.a2a_fwd_send_elems = a2a_.a2a_fwd_recv_elems = 0;
  a2a_bytes_[0][0] = a2a_bytes_[0][1] = 0;

  // phase 1: q, k, v of every member's positions for this member's heads
  StepRecord in{Pass::forward, 0, -1, 0, 0, 0, Phase::a2a};
  const std::vector<Index> own(U_, L_);
  exchange(Pass::forward, qkv_send_, scaled(own, B * qkv), qkv_recv_, scaled(Lw_, B * qkv), "the q/k/v all-to-all",
           in);
  double t0 = comm::wtime();
  Index at = 0;
  if (!s_.timing_only) {
    for (int v = 0; v < U_; at += B * Lw_[v] * qkv, ++v) {
      const Index Lv = Lw_[v];
      const S* qs = qkv_recv_.data() + at;
      const S* ks = qs + B * Lv * qr;
      const S* vs = ks + B * Lv * kr;
      for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < Lv; ++i) {
          const Index to = b * Lg_ + gidx_[v][i], from = b * Lv + i;
          std::memcpy(q_g_.data() + to * qr, qs + from * qr, sizeof(S) * qr);
          std::memcpy(k_g_.data() + to * kr, ks + from * kr, sizeof(S) * kr);
          std::memcpy(v_g_.data() + to * kr, vs + from * kr, sizeof(S) * kr);
        }
    }
  }
  inner_->load(q_g_.data(), k_g_.data(), v_g_.data());
  in.compute_s = comm::wtime() - t0;  // rearranging, not attention: kept out of the pass's compute

  // phase 2: the ring over the groups on this head slice
  const PassStats ring = inner_->forward();
  if (!s_.timing_only) inner_->outputs(o_g_.data(), lse_g_.data(), nullptr, nullptr, nullptr);

  // phase 3: O and LSE back to the owners of the positions
  StepRecord out{Pass::forward, 1, -1, 0, 0, 0, Phase::a2a};
  t0 = comm::wtime();
  const Index ret = qr + Hu;  // per position: O [Hu, D] and LSE [Hu]
  at = 0;
  if (!s_.timing_only) {
    for (int v = 0; v < U_; at += B * Lw_[v] * ret, ++v) {
      const Index Lv = Lw_[v];
      A* od = out_send_.data() + at;
      A* ld = od + B * Lv * qr;
      for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < Lv; ++i) {
          const Index gi = gidx_[v][i];
          std::memcpy(od + (b * Lv + i) * qr, o_g_.data() + (b * Lg_ + gi) * qr, sizeof(A) * qr);
          for (Index h = 0; h < Hu; ++h) ld[(b * Hu + h) * Lv + i] = lse_g_[(b * Hu + h) * Lg_ + gi];
        }
    }
  }
  out.compute_s = comm::wtime() - t0;
  exchange(Pass::forward, out_send_, scaled(Lw_, B * ret), out_recv_, scaled(own, B * ret), "the O/LSE all-to-all",
           out);
  t0 = comm::wtime();
  if (!s_.timing_only) {
    for (int v = 0; v < U_; ++v) {
      const A* os = out_recv_.data() + v * B * L_ * ret;
      const A* ls = os + B * L_ * qr;
      for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < L_; ++i) {
          std::memcpy(o_.data() + ((b * L_ + i) * sh.H + hs_.q_head(v, 0)) * D, os + (b * L_ + i) * qr, sizeof(A) * qr);
          for (Index h = 0; h < Hu; ++h) lse_[(b * sh.H + hs_.q_head(v, h)) * L_ + i] = ls[(b * Hu + h) * L_ + i];
        }
    }
  }
  out.compute_s += comm::wtime() - t0;

  return finish_pass(in, ring, out, t_pass);
}

template <class S>
PassStats UlyssesAttention<S>::backward() {
  const double t_pass = comm::wtime();
  if (!backward_ready_) throw std::logic_error("UlyssesAttention::backward before load_dout");
  const core::Shape& sh = s_.shape;
  const Index B = sh.B, D = sh.D, qr = q_row(), kr = kv_row(), qkv = qr + 2 * kr;
  a2a_.a2a_bwd_send_elems = a2a_.a2a_bwd_recv_elems = 0;
  a2a_bytes_[1][0] = a2a_bytes_[1][1] = 0;

  // in the forward pass q went to the head's member: dO goes the same way
  StepRecord in{Pass::backward, 0, -1, 0, 0, 0, Phase::a2a};
  const std::vector<Index> own(U_, L_);
  exchange(Pass::backward, dout_send_, scaled(own, B * qr), dout_recv_, scaled(Lw_, B * qr), "the dO all-to-all", in);
  double t0 = comm::wtime();
  Index at = 0;
  if (!s_.timing_only) {
    for (int v = 0; v < U_; at += B * Lw_[v] * qr, ++v)
      for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < Lw_[v]; ++i)
          std::memcpy(dout_g_.data() + (b * Lg_ + gidx_[v][i]) * qr, dout_recv_.data() + at + (b * Lw_[v] + i) * qr,
                      sizeof(S) * qr);
  }
  inner_->load_dout(dout_g_.data());
  in.compute_s = comm::wtime() - t0;
  if (has_dlse_) {  // in the forward pass LSE came back from the head's member: dL/dLSE goes to it
    exchange(Pass::backward, dlse_send_, scaled(own, B * hs_.Hu), dlse_recv_, scaled(Lw_, B * hs_.Hu),
             "the dLSE all-to-all", in);
    t0 = comm::wtime();
    if (!s_.timing_only) {
      Index from = 0;
      for (int v = 0; v < U_; from += B * hs_.Hu * Lw_[v], ++v)
        for (Index b = 0; b < B; ++b)
          for (Index h = 0; h < hs_.Hu; ++h)
            for (Index i = 0; i < Lw_[v]; ++i)
              dlse_g_[(b * hs_.Hu + h) * Lg_ + gidx_[v][i]] = dlse_recv_[from + (b * hs_.Hu + h) * Lw_[v] + i];
    }
    inner_->load_dlse(dlse_g_.data());
    in.compute_s += comm::wtime() - t0;
  }

  const PassStats ring = inner_->backward();
  if (!s_.timing_only) inner_->outputs(nullptr, nullptr, dq_g_.data(), dk_g_.data(), dv_g_.data());

  // in the forward pass q, k, v came from the owners: dQ, dK, dV go back to them
  StepRecord out{Pass::backward, 1, -1, 0, 0, 0, Phase::a2a};
  t0 = comm::wtime();
  at = 0;
  if (!s_.timing_only) {
    for (int v = 0; v < U_; at += B * Lw_[v] * qkv, ++v) {
      const Index Lv = Lw_[v];
      A* qd = out_send_.data() + at;
      A* kd = qd + B * Lv * qr;
      A* vd = kd + B * Lv * kr;
      for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < Lv; ++i) {
          const Index from = b * Lg_ + gidx_[v][i], to = b * Lv + i;
          std::memcpy(qd + to * qr, dq_g_.data() + from * qr, sizeof(A) * qr);
          std::memcpy(kd + to * kr, dk_g_.data() + from * kr, sizeof(A) * kr);
          std::memcpy(vd + to * kr, dv_g_.data() + from * kr, sizeof(A) * kr);
        }
    }
  }
  out.compute_s = comm::wtime() - t0;
  exchange(Pass::backward, out_send_, scaled(Lw_, B * qkv), out_recv_, scaled(own, B * qkv),
           "the dQ/dK/dV all-to-all", out);
  t0 = comm::wtime();
  if (!s_.timing_only) {
    std::fill(dk_.begin(), dk_.end(), A(0));
    std::fill(dv_.begin(), dv_.end(), A(0));
  }
  // A replicated kv head gets one contribution per copy: summed in member, then copy order.
  if (!s_.timing_only) {
    for (int v = 0; v < U_; ++v) {
      const A* qs = out_recv_.data() + v * B * L_ * qkv;
      const A* ks = qs + B * L_ * qr;
      const A* vs = ks + B * L_ * kr;
      for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < L_; ++i) {
          const Index row = b * L_ + i;
          std::memcpy(dq_.data() + (row * sh.H + hs_.q_head(v, 0)) * D, qs + row * qr, sizeof(A) * qr);
          for (Index j = 0; j < hs_.HKVu; ++j) {
            A* dk = dk_.data() + (row * sh.HKV + hs_.kv_head(v, j)) * D;
            A* dv = dv_.data() + (row * sh.HKV + hs_.kv_head(v, j)) * D;
            const A* k = ks + row * kr + j * D;
            const A* w = vs + row * kr + j * D;
            for (Index d = 0; d < D; ++d) {
              dk[d] += k[d];
              dv[d] += w[d];
            }
          }
        }
    }
  }
  out.compute_s += comm::wtime() - t0;

  return finish_pass(in, ring, out, t_pass);
}

template <class S>
void UlyssesAttention<S>::outputs(A* o, A* lse, A* dq, A* dk, A* dv) const {
  auto copy = [](const core::AlignedVector<A>& from, A* to) {
    if (to) std::copy(from.begin(), from.end(), to);
  };
  copy(o_, o);
  copy(lse_, lse);
  copy(dq_, dq);
  copy(dk_, dk);
  copy(dv_, dv);
}

template class UlyssesAttention<float>;
template class UlyssesAttention<double>;
template class UlyssesAttention<core::bf16>;
template class UlyssesAttention<core::f16>;

}  // namespace ringattn::runtime
