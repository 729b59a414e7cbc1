#include "ringattn/runtime/ring_attention.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace ringattn::runtime {

namespace {
// One tag per kind of message: within a kind, MPI's non-overtaking order between a pair of
// ranks keeps steps apart.
enum Tag : int { kTagForward = 11, kTagReplay = 12, kTagGrad = 13 };
}  // namespace

template <class T>
RingAttention<T>::RingAttention(const comm::Comm& comm, const RingSetup& setup)
    : comm_(comm), s_(setup), r_(comm.rank()), N_(comm.size()), ws_(setup.tiling) {
  const core::Shape& sh = s_.shape;
  L_ = s_.layout->size(r_);
  pq_ = core::Packing{sh.B, sh.HKV, sh.G(), L_, sh.D};
  const core::Packing pk_own = packing(r_);
  const Index max_block = 2 * core::Packing{sh.B, sh.HKV, 1, s_.layout->max_size(), sh.D}.kv_elems();
  q_.resize(pq_.q_elems());
  dout_.resize(pq_.q_elems());
  kv_own_.resize(2 * pk_own.kv_elems());
  m_.resize(pq_.row_elems());
  l_.resize(pq_.row_elems());
  acc_.resize(pq_.q_elems());
  delta_.resize(pq_.row_elems());
  dq_.resize(pq_.q_elems());
  dkv_own_.resize(2 * pk_own.kv_elems());
  if (N_ > 1) {
    for (auto* v : {&kv_buf_[0], &kv_buf_[1], &grad_send_[0], &grad_send_[1]}) v->resize(max_block);
    for (auto* v : {&grad_recv_[0], &grad_recv_[1]}) v->resize(2 * pk_own.kv_elems());
  }
  qshard_ = core::QueryShard<T>{pq_, s_.layout->positions(r_), q_.data()};
}

template <class T>
core::Packing RingAttention<T>::packing(int owner) const {
  const core::Shape& sh = s_.shape;
  return core::Packing{sh.B, sh.HKV, 1, s_.layout->size(owner), sh.D};
}

template <class T>
core::KVBlock<T> RingAttention<T>::view(int owner, const T* kv) const {
  const core::Packing pk = packing(owner);
  return core::KVBlock<T>{pk, s_.layout->positions(owner), kv, kv + pk.kv_elems()};
}

template <class T>
Index RingAttention<T>::resident_bytes() const {
  Index elems = 0;
  for (const auto* v : {&q_, &kv_own_, &dout_, &m_, &l_, &acc_, &delta_, &dq_, &dkv_own_, &kv_buf_[0], &kv_buf_[1],
                        &grad_send_[0], &grad_send_[1], &grad_recv_[0], &grad_recv_[1], &ws_.s, &ws_.p, &ws_.rowbuf})
    elems += static_cast<Index>(v->size());
  return elems * static_cast<Index>(sizeof(T));
}

template <class T>
void RingAttention<T>::load(const T* q, const T* k, const T* v, const T* dout) {
  const core::Packing pk = packing(r_);
  core::pack_heads(pq_, q, q_.data());
  core::pack_heads(pk, k, kv_own_.data());
  core::pack_heads(pk, v, kv_own_.data() + pk.kv_elems());
  if (dout) core::pack_heads(pq_, dout, dout_.data());
  const core::Shape& sh = s_.shape;
  ledger_ = core::Ledger{};
  ledger_.resident_qkv_elems = sh.B * L_ * (sh.H + 2 * sh.HKV) * sh.D;
  ledger_.online_state_elems = L_ * sh.B * sh.H * (sh.D + 2);
}

template <class T>
PassStats RingAttention<T>::forward() {
  PassStats ps;
  const double t_pass = comm::wtime();
  core::OnlineState<T> st{m_.data(), l_.data(), acc_.data()};
  core::init_online_state(pq_, st);
  ledger_.fwd_kv_send_elems = ledger_.fwd_kv_recv_elems = ledger_.remote_block_elems = 0;
  const T scale = static_cast<T>(s_.scale);
  const T* cur = kv_own_.data();
  for (int j = 0; j < N_; ++j) {
    const int owner = ((r_ - j) % N_ + N_) % N_;
    comm::Exchange kvx(comm_);
    StepRecord rec{Pass::forward, j, owner, 0, 0, 0};
    if (j + 1 < N_) {  // the next block is in flight while this one is attended
      const int next_owner = ((r_ - j - 1) % N_ + N_) % N_;
      const Index recv = block_elems(next_owner), send = block_elems(owner);
      kvx.irecv(kv_buf_[j % 2].data(), recv * sizeof(T), comm_.prev(), kTagForward);
      kvx.isend(cur, send * sizeof(T), comm_.next(), kTagForward);
      ledger_.fwd_kv_recv_elems += recv;
      ledger_.fwd_kv_send_elems += send;
      ledger_.remote_block_elems = std::max(ledger_.remote_block_elems, recv);
      rec.bytes = (recv + send) * static_cast<Index>(sizeof(T));
    }
    const double t0 = comm::wtime();
    ps.work += core::block_forward(qshard_, view(owner, cur), *s_.mask, scale, st, ws_, [&] { kvx.test(); });
    rec.compute_s = comm::wtime() - t0;
    rec.wait_s = kvx.wait(s_.timeout_s, [&] {
      return fmt::format("rank {} forward step {}/{}: receiving the K/V block of rank {} from rank {}", r_, j + 1, N_,
                         ((r_ - j - 1) % N_ + N_) % N_, comm_.prev());
    });
    if (j + 1 < N_) cur = kv_buf_[j % 2].data();
    ps.compute_s += rec.compute_s;
    ps.wait_s += rec.wait_s;
    ps.steps.push_back(rec);
  }
  core::finalize_forward(pq_, st);
  ps.total_s = comm::wtime() - t_pass;
  return ps;
}

template <class T>
PassStats RingAttention<T>::backward() {
  PassStats ps;
  const double t_pass = comm::wtime();
  ledger_.replay_kv_send_elems = ledger_.replay_kv_recv_elems = 0;
  ledger_.grad_send_elems = ledger_.grad_recv_elems = 0;
  const T scale = static_cast<T>(s_.scale);
  core::compute_delta(pq_, dout_.data(), acc_.data(), delta_.data());
  std::fill(dq_.begin(), dq_.end(), T(0));
  std::fill(dkv_own_.begin(), dkv_own_.end(), T(0));
  const core::GradQueryShard<T> gq{qshard_, dout_.data(), m_.data(), delta_.data(), dq_.data()};
  const Index own_elems = static_cast<Index>(dkv_own_.size());
  // Gradient transfers of the previous step complete one step late, so they overlap compute.
  comm::Exchange gx0(comm_), gx1(comm_);
  comm::Exchange* gx[2] = {&gx0, &gx1};
  auto add_returned = [&](int step) {  // the owner sums contributions in step order
    if (step == s_.drop_grad_step) return;
    const T* src = grad_recv_[step % 2].data();
    for (Index e = 0; e < own_elems; ++e) dkv_own_[e] += src[e];
  };
  const T* cur = kv_own_.data();
  for (int j = 0; j < N_; ++j) {
    const int owner = ((r_ - j) % N_ + N_) % N_;
    comm::Exchange kvx(comm_);
    StepRecord rec{Pass::backward, j, owner, 0, 0, 0};
    if (j + 1 < N_) {
      const int next_owner = ((r_ - j - 1) % N_ + N_) % N_;
      const Index recv = block_elems(next_owner), send = block_elems(owner);
      kvx.irecv(kv_buf_[j % 2].data(), recv * sizeof(T), comm_.prev(), kTagReplay);
      kvx.isend(cur, send * sizeof(T), comm_.next(), kTagReplay);
      ledger_.replay_kv_recv_elems += recv;
      ledger_.replay_kv_send_elems += send;
      rec.bytes += (recv + send) * static_cast<Index>(sizeof(T));
    }
    const int source = (r_ + j) % N_;  // the rank whose contribution to our block arrives now
    if (j > 0) {
      gx[j % 2]->irecv(grad_recv_[j % 2].data(), own_elems * sizeof(T), source, kTagGrad);
      ledger_.grad_recv_elems += own_elems;
      rec.bytes += own_elems * static_cast<Index>(sizeof(T));
    }
    // Own block: accumulate straight into our dK/dV; remote block: into a send buffer.
    const Index blk = block_elems(owner);
    T* target = j == 0 ? dkv_own_.data() : grad_send_[j % 2].data();
    if (j > 0) std::fill_n(target, blk, T(0));
    const double t0 = comm::wtime();
    ps.work += core::block_backward(gq, view(owner, cur), *s_.mask, scale, target, target + blk / 2, ws_, [&] {
      kvx.test();
      gx[(j + 1) % 2]->test();
    });
    rec.compute_s = comm::wtime() - t0;
    if (j > 0) {
      gx[j % 2]->isend(target, blk * sizeof(T), owner, kTagGrad);
      ledger_.grad_send_elems += blk;
      rec.bytes += blk * static_cast<Index>(sizeof(T));
    }
    rec.wait_s = kvx.wait(s_.timeout_s, [&] {
      return fmt::format("rank {} backward step {}/{}: receiving the K/V block of rank {} from rank {}", r_, j + 1,
                         N_, ((r_ - j - 1) % N_ + N_) % N_, comm_.prev());
    });
    if (j > 1) {
      rec.wait_s += gx[(j - 1) % 2]->wait(s_.timeout_s, [&] {
        return fmt::format("rank {} backward step {}/{}: gradient return with rank {} (to) and rank {} (from)", r_,
                           j, N_, ((r_ - j + 1) % N_ + N_) % N_, (r_ + j - 1) % N_);
      });
      add_returned(j - 1);
    }
    if (j + 1 < N_) cur = kv_buf_[j % 2].data();
    ps.compute_s += rec.compute_s;
    ps.wait_s += rec.wait_s;
    ps.steps.push_back(rec);
  }
  if (N_ > 1) {
    const int last = N_ - 1;
    const double w = gx[last % 2]->wait(s_.timeout_s, [&] {
      return fmt::format("rank {} backward step {}/{}: gradient return with rank {} (to) and rank {} (from)", r_, N_,
                         N_, ((r_ - last) % N_ + N_) % N_, (r_ + last) % N_);
    });
    add_returned(last);
    ps.wait_s += w;
    ps.steps.back().wait_s += w;
  }
  ps.total_s = comm::wtime() - t_pass;
  return ps;
}

template <class T>
void RingAttention<T>::outputs(T* o, T* lse, T* dq, T* dk, T* dv) const {
  const core::Packing pk = packing(r_);
  if (o) core::unpack_heads(pq_, acc_.data(), o);
  if (dq) core::unpack_heads(pq_, dq_.data(), dq);
  if (dk) core::unpack_heads(pk, dkv_own_.data(), dk);
  if (dv) core::unpack_heads(pk, dkv_own_.data() + pk.kv_elems(), dv);
  if (lse) {  // row stats [B, HKV, L, G] -> [B, H, L]
    const Index G = pq_.G, H = pq_.H();
    for (Index b = 0; b < pq_.B; ++b)
      for (Index g = 0; g < pq_.HKV; ++g)
        for (Index i = 0; i < L_; ++i)
          for (Index t = 0; t < G; ++t) lse[(b * H + g * G + t) * L_ + i] = m_[pq_.row_group(b, g) + i * G + t];
  }
}

template class RingAttention<float>;
template class RingAttention<double>;

}  // namespace ringattn::runtime
