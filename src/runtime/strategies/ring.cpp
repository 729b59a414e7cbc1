#include "ringattn/runtime/ring_attention.hpp"

#include "ring_steps.hpp"

#include "ringattn/comm/simulation.hpp"
#include "ringattn/core/errors.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <type_traits>

namespace ringattn::runtime {

namespace {
// One tag per kind of message: within a kind, MPI's non-overtaking order between a pair of
// ranks keeps steps apart.
enum Tag : int { kTagForward = 11, kTagReplay = 12, kTagGrad = 13 };
}  // namespace

template <class T>
RingAttention<T>::RingAttention(const comm::Comm& comm, const StrategySetup& setup)
    : comm_(comm),
      s_(setup),
      plan_(*setup.layout, *setup.mask, setup.traffic),
      r_(comm.rank()),
      N_(comm.size()),
      ws_(core::resolve_tiling(setup.tiling, setup.shape.D, setup.layout->max_size(), setup.shape.G()), setup.shape.D,
          setup.precision) {
  const core::Shape& sh = s_.shape;
  L_ = s_.layout->size(r_);
  pq_ = core::Packing{sh.B, sh.HKV, sh.G(), L_, sh.D};
  const core::Packing pk_own = packing(r_);
  const Index max_block = 2 * core::Packing{sh.B, sh.HKV, 1, s_.layout->max_size(), sh.D}.kv_elems();
  // Forward buffers now; the backward's (dout, delta, dq, dK/dV, gradient returns) on the first
  // backward(), so a forward-only job never holds them.
  q_.resize(pq_.q_elems());
  kv_own_.resize(2 * pk_own.kv_elems());
  m_.resize(pq_.row_elems());
  l_.resize(pq_.row_elems());
  lse_.resize(pq_.row_elems());
  acc_.resize(pq_.q_elems());
  if (N_ > 1)
    for (auto* v : {&kv_buf_[0], &kv_buf_[1]}) v->resize(max_block);
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
  auto bytes = [](const auto&... v) { return ((Index(v.size()) * Index(sizeof(v[0]))) + ...); };
  return bytes(q_, kv_own_, dout_, kv_buf_[0], kv_buf_[1]) +
         bytes(m_, l_, lse_, acc_, delta_, dq_, dkv_own_, grad_send_[0], grad_send_[1], grad_recv_) +
         core::Workspace<A>::bytes(ws_.tiling, ws_.D, ws_.precision);
}

template <class T>
void RingAttention<T>::allocate_backward() {
  if (backward_ready_) return;
  backward_ready_ = true;
  const core::Shape& sh = s_.shape;
  const Index own = 2 * packing(r_).kv_elems();
  const Index max_block = 2 * core::Packing{sh.B, sh.HKV, 1, s_.layout->max_size(), sh.D}.kv_elems();
  dout_.resize(pq_.q_elems());
  delta_.resize(pq_.row_elems());
  dq_.resize(pq_.q_elems());
  dkv_own_.resize(own);
  if (N_ > 1) {
    for (auto* v : {&grad_send_[0], &grad_send_[1]}) v->resize(max_block);
    grad_recv_.resize(own);
  }
}

template <class T>
void RingAttention<T>::load_dout(const T* dout) {
  allocate_backward();
  has_dlse_ = false;
  if (s_.timing_only) return;  // no data
  core::pack_heads(pq_, dout, dout_.data());
}

template <class T>
void RingAttention<T>::load_dlse(const A* dlse) {
  has_dlse_ = dlse != nullptr;
  if (!dlse || s_.timing_only) return;
  dlse_.resize(pq_.row_elems());
  core::pack_rows(pq_, dlse, dlse_.data());
}

template <class T>
void RingAttention<T>::add_sink_grad(double* dsinks) const {
  if (s_.sinks && !s_.timing_only) core::add_sink_grad(pq_, m_.data(), l_.data(), delta_.data(), s_.sinks, dsinks);
}

template <class T>
void RingAttention<T>::load(const T* q, const T* k, const T* v) {
  const core::Packing pk = packing(r_);
  if (!s_.timing_only) {  // timing-only: no data
    core::pack_heads(pq_, q, q_.data());
    core::pack_heads(pk, k, kv_own_.data());
    core::pack_heads(pk, v, kv_own_.data() + pk.kv_elems());
  }
  const core::Shape& sh = s_.shape;
  ledger_ = core::Ledger{};
  ledger_.resident_qkv_elems = sh.B * L_ * (sh.H + 2 * sh.HKV) * sh.D;
  ledger_.online_state_elems = L_ * sh.B * sh.H * (sh.D + 2);
}

template <class T>
void RingAttention<T>::post_kv(comm::Exchange& kvx, RingSteps<T>& step, int j, const T* cur, int tag) {
  if (plan_.receives(r_, j + 1)) {
    const Index recv = block_elems(plan_.owner(r_, j + 1));
    kvx.irecv(kv_buf_[j % 2].data(), recv * sizeof(T), comm_.prev(), tag);
    step.kv_received(recv);
  }
  if (plan_.sends(r_, j)) {
    const Index send = block_elems(plan_.owner(r_, j));
    kvx.isend(cur, send * sizeof(T), comm_.next(), tag);
    step.kv_sent(send);
  }
}

template <class T>
const T* RingAttention<T>::wait_kv(comm::Exchange& kvx, RingSteps<T>& step, int j, const T* cur, const char* pass) {
  step.waited(kvx.wait([&] {
    return fmt::format("rank {} {} step {} (of 0..{}): the K/V block of rank {} from rank {}", r_, pass, j + 1,
                       plan_.steps() - 1, plan_.owner(r_, j + 1), comm_.prev());
  }));
  return plan_.receives(r_, j + 1) ? kv_buf_[j % 2].data() : cur;
}

template <class T>
PassStats RingAttention<T>::forward() {
  RingSteps<T> step(s_, r_, ledger_, obs_, Pass::forward, plan_.steps());
  core::OnlineState<A> st{m_.data(), l_.data(), acc_.data()};
  if (step.computes()) core::init_online_state(pq_, st);
  const A scale = static_cast<A>(s_.scale), softcap = static_cast<A>(s_.softcap);
  const T* cur = kv_own_.data();
  for (int j = 0; j < plan_.steps(); ++j) {
    const int owner = plan_.owner(r_, j);
    comm::Exchange kvx(comm_);
    step.begin(j, owner);
    post_kv(kvx, step, j, cur, kTagForward);  // the next block is in flight while this one is attended
    if (plan_.holds(r_, j)) {
      step.compute(
          [&] {
            return core::block_forward(qshard_, view(owner, cur), *s_.mask, scale, st, ws_, [&] {
              kvx.test();
              if (s_.poll) s_.poll();
            }, softcap);
          },
          [&] { return core::count_block_forward(qshard_, view(owner, cur), *s_.mask, ws_); }, 1.0);
      step.forward_block(owner, pq_, m_.data(), l_.data(), acc_.data());
    }
    cur = wait_kv(kvx, step, j, cur, "forward");
    step.end();
  }
  if (step.computes()) core::finalize_forward(pq_, st, lse_.data(), s_.sinks, /*every_row_sees_a_key=*/true);
  ledger_.ring_bytes(Index(sizeof(T)), Index(sizeof(A)));
  return step.finish();
}

template <class T>
PassStats RingAttention<T>::backward() {
  RingSteps<T> step(s_, r_, ledger_, obs_, Pass::backward, plan_.steps());
  allocate_backward();
  const A scale = static_cast<A>(s_.scale), softcap = static_cast<A>(s_.softcap);
  if (step.computes()) {
    core::compute_delta(pq_, dout_.data(), acc_.data(), delta_.data());
    if (has_dlse_)  // in the forward pass LSE_i = log sum_j e^S_ij, so dS_ij += P_ij dLSE_i
      for (std::size_t r = 0; r < delta_.size(); ++r) delta_[r] -= dlse_[r];
    std::fill(dq_.begin(), dq_.end(), A(0));
    std::fill(dkv_own_.begin(), dkv_own_.end(), A(0));
  }
  const core::GradQueryShard<T> gq{qshard_, dout_.data(), m_.data(), l_.data(), delta_.data(), dq_.data()};
  const Index own_elems = static_cast<Index>(dkv_own_.size());
  // Gradient transfers of step j complete at the end of step j+1, so they overlap compute.
  comm::Exchange gx0(comm_), gx1(comm_);
  comm::Exchange* gx[2] = {&gx0, &gx1};
  // A contribution computed in step j is sent as step j ends and travels during step j+1, while
  // the next one is computed into the other send buffer; the owner receives it into its one
  // receive buffer (posted once the previous contribution is summed) and sums it as step j+1 ends.
  bool pending[2] = {false, false};  // a contribution of the step of this parity is arriving
  auto finish_grads = [&](int j) {  // the owner sums contributions in step order
    const int slot = j % 2;
    const double w = gx[slot]->wait([&] {
      return fmt::format("rank {} backward step {} (of 0..{}): gradient return to rank {} / from rank {}", r_, j,
                         plan_.steps() - 1, plan_.owner(r_, j), (r_ + j) % N_);
    });
    if (pending[slot]) {
      pending[slot] = false;
      if (step.grad_received(j, (r_ + j) % N_, own_elems)) {
        const A* src = grad_recv_.data();
        for (Index e = 0; e < own_elems; ++e) dkv_own_[e] += src[e];
      }
    }
    return w;
  };
  const T* cur = kv_own_.data();
  for (int j = 0; j < plan_.steps(); ++j) {
    const int owner = plan_.owner(r_, j);
    comm::Exchange kvx(comm_);
    step.begin(j, owner);
    post_kv(kvx, step, j, cur, kTagReplay);
    // Own block: accumulate straight into our dK/dV; a remote one: into a send buffer.
    const bool returns = j > 0 && plan_.returns_grad(r_, j);
    if (j == 0 || returns) {
      const Index blk = block_elems(owner);
      A* target = j == 0 ? dkv_own_.data() : grad_send_[j % 2].data();
      if (j > 0 && step.computes()) std::fill_n(target, blk, A(0));
      step.compute(
          [&] {
            return core::block_backward(gq, view(owner, cur), *s_.mask, scale, target, target + blk / 2, ws_, [&] {
              kvx.test();
              gx[0]->test();
              gx[1]->test();
              if (s_.poll) s_.poll();
            }, softcap);
          },
          [&] { return core::count_block_forward(qshard_, view(owner, cur), *s_.mask, ws_); }, 2.5);
      step.replay_block(owner, packing(owner), target, target + blk / 2);
      if (returns) {
        gx[j % 2]->isend(target, blk * sizeof(A), owner, kTagGrad);
        step.grad_sent(owner, blk);
      }
    }
    const T* next = wait_kv(kvx, step, j, cur, "backward");
    if (j >= 2) step.waited(finish_grads(j - 1));
    const int source = (r_ + j) % N_;  // the rank whose contribution to our block was computed now
    if (j > 0 && plan_.returns_grad(source, j)) {
      gx[j % 2]->irecv(grad_recv_.data(), own_elems * sizeof(A), source, kTagGrad);
      pending[j % 2] = true;
      step.grad_posted(own_elems);
    }
    cur = next;
    step.end();
  }
  if (plan_.steps() >= 2) step.waited_after(finish_grads(plan_.steps() - 1));
  ledger_.ring_bytes(Index(sizeof(T)), Index(sizeof(A)));
  return step.finish();
}

template <class T>
void RingAttention<T>::outputs(A* o, A* lse, A* dq, A* dk, A* dv) const {
  const core::Packing pk = packing(r_);
  if (o) core::unpack_heads(pq_, acc_.data(), o);
  if (dq) core::unpack_heads(pq_, dq_.data(), dq);
  if (dk) core::unpack_heads(pk, dkv_own_.data(), dk);
  if (dv) core::unpack_heads(pk, dkv_own_.data() + pk.kv_elems(), dv);
  if (lse) core::unpack_rows(pq_, lse_.data(), lse);  // row stats [B, HKV, L, G] -> [B, H, L]
}

template class RingAttention<float>;
template class RingAttention<double>;
template class RingAttention<core::bf16>;
template class RingAttention<core::f16>;

}  // namespace ringattn::runtime
