#include "ringattn/runtime/layer.hpp"

#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <type_traits>

namespace ringattn::runtime {

namespace {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Mat = Eigen::Map<RowMat<T>>;
template <class T>
using CMat = Eigen::Map<const RowMat<T>>;

// The attention's operand in its storage type: the computed values themselves when S is A, a
// rounded copy otherwise.
template <class S, class A>
const S* storage(const core::AlignedVector<A>& x, core::AlignedVector<S>& copy) {
  if constexpr (std::is_same_v<S, A>) {
    return x.data();
  } else {
    copy.resize(x.size());
    std::transform(x.begin(), x.end(), copy.begin(), [](A v) { return core::value_cast<S>(v); });
    return copy.data();
  }
}

}  // namespace

template <class S>
Layer<S>::Layer(const comm::Comm& comm, const LayerSetup& setup)
    : comm_(comm), s_(setup), red_dwo_(comm), red_dw_(comm) {
  // The attention backward progresses dWo's reduction between its tiles (MPI moves it only
  // inside MPI calls); its all-gather phase starts as soon as its reduce-scatter is done.
  StrategySetup as = s_.attention;
  as.poll = [this] { red_dwo_.test(); };
  attn_ = make_strategy<S>(comm, as);
  const core::Shape& sh = s_.attention.shape;
  L_ = s_.attention.layout->size(comm.rank());
  BL_ = sh.B * L_;
  M_ = s_.M;
  HD_ = sh.H * sh.D;
  KD_ = sh.HKV * sh.D;
  if (s_.rope) {
    std::vector<Index> local(L_);
    std::iota(local.begin(), local.end(), Index{0});
    const std::span<const Index> pos =
        s_.rope_local_positions ? std::span<const Index>(local) : s_.attention.layout->positions(comm.rank());
    rope_.emplace(*s_.rope, sh.D, pos);
  }
  x_.resize(BL_ * M_);
  dy_.resize(BL_ * M_);
  wq_.resize(M_ * HD_);
  wk_.resize(M_ * KD_);
  wv_.resize(M_ * KD_);
  wo_.resize(HD_ * M_);
  q_.resize(BL_ * HD_);
  k_.resize(BL_ * KD_);
  v_.resize(BL_ * KD_);
  dout_.resize(BL_ * HD_);
  o_.resize(BL_ * HD_);
  y_.resize(BL_ * M_);
  if (s_.backward) {
    dq_.resize(BL_ * HD_);
    dk_.resize(BL_ * KD_);
    dv_.resize(BL_ * KD_);
    dx_.resize(BL_ * M_);
    dw_part_.resize(M_ * (HD_ + 2 * KD_));
    dw_.resize(dw_part_.size());
    dwo_part_.resize(HD_ * M_);
    dwo_.resize(HD_ * M_);
  }
}

template <class S>
void Layer<S>::load(const A* x, const A* wq, const A* wk, const A* wv, const A* wo, const A* dy) {
  std::copy_n(x, x_.size(), x_.begin());
  std::copy_n(wq, wq_.size(), wq_.begin());
  std::copy_n(wk, wk_.size(), wk_.begin());
  std::copy_n(wv, wv_.size(), wv_.begin());
  std::copy_n(wo, wo_.size(), wo_.begin());
  if (dy) std::copy_n(dy, dy_.size(), dy_.begin());
  else std::fill(dy_.begin(), dy_.end(), A(0));
}

template <class S>
void Layer<S>::attention_outputs(A* o, A* lse, A* dq, A* dk, A* dv) const {
  attn_->outputs(o, lse, dq, dk, dv);
}

// BL = B*L rows (this rank's positions), M model dim, HD = H*D, KD = HKV*D.
template <class S>
LayerStats Layer<S>::forward() {
  LayerStats st;
  const double t_pass = comm::wtime();
  const core::Shape& sh = s_.attention.shape;
  const CMat<A> X(x_.data(), BL_, M_);

  // pass 1: projections Q = X Wq, K = X Wk, V = X Wv  ([BL, M] x [M, HD] -> [BL, HD] = [B, L, H, D])
  double t0 = comm::wtime();
  Mat<A>(q_.data(), BL_, HD_).noalias() = X * CMat<A>(wq_.data(), M_, HD_);
  Mat<A>(k_.data(), BL_, KD_).noalias() = X * CMat<A>(wk_.data(), M_, KD_);
  Mat<A>(v_.data(), BL_, KD_).noalias() = X * CMat<A>(wv_.data(), M_, KD_);
  st.gemm_s += comm::wtime() - t0;

  // pass 2: RoPE on Q and K at each token's global position
  if (rope_) {
    t0 = comm::wtime();
    rope_->forward(sh.B, sh.H, q_.data());
    rope_->forward(sh.B, sh.HKV, k_.data());
    st.rope_s = comm::wtime() - t0;
  }

  // dO = dY Wo^T depends only on inputs, so it is formed here, but it is backward work: its time
  // is charged to backward().
  dout_s_ = 0;
  if (s_.backward) {
    t0 = comm::wtime();
    Mat<A>(dout_.data(), BL_, HD_).noalias() = CMat<A>(dy_.data(), BL_, M_) * CMat<A>(wo_.data(), HD_, M_).transpose();
    dout_s_ = comm::wtime() - t0;
  }

  // pass 3: attention, its operands in the storage type
  attn_->load(storage(q_, qs_), storage(k_, ks_), storage(v_, vs_));
  if (s_.backward) attn_->load_dout(storage(dout_, douts_));
  st.attention = attn_->forward();
  attn_->outputs(o_.data(), nullptr, nullptr, nullptr, nullptr);

  // pass 4: output projection Y = O Wo  ([BL, HD] x [HD, M])
  t0 = comm::wtime();
  Mat<A>(y_.data(), BL_, M_).noalias() = CMat<A>(o_.data(), BL_, HD_) * CMat<A>(wo_.data(), HD_, M_);
  st.gemm_s += comm::wtime() - t0;
  st.total_s = comm::wtime() - t_pass - dout_s_;
  return st;
}

template <class S>
LayerStats Layer<S>::backward() {
  LayerStats st;
  const double t_pass = comm::wtime();
  const core::Shape& sh = s_.attention.shape;
  const int r = comm_.rank();
  const CMat<A> X(x_.data(), BL_, M_), dY(dy_.data(), BL_, M_);
  st.gemm_s = dout_s_;

  // in the forward pass this was: Y = O Wo, so now: dWo = O^T dY ([HD, BL] x [BL, M]); dO was
  // formed in forward(). dWo's sum over ranks needs nothing from the attention: start it now.
  double t0 = comm::wtime();
  Mat<A>(dwo_part_.data(), HD_, M_).noalias() = CMat<A>(o_.data(), BL_, HD_).transpose() * dY;
  st.gemm_s += comm::wtime() - t0;
  red_dwo_.start(dwo_part_.data(), dwo_.data(), HD_ * M_);

  // pass 1: attention backward, progressing the dWo reduction between its tiles
  st.attention = attn_->backward();
  st.dwo_done_by_attention_end = red_dwo_.test();
  attn_->outputs(nullptr, nullptr, dq_.data(), dk_.data(), dv_.data());

  // pass 2: in the forward pass this was: Q' = R Q, K' = R K, so now: dQ = R^T dQ', dK = R^T dK'
  if (rope_) {
    t0 = comm::wtime();
    rope_->backward(sh.B, sh.H, dq_.data());
    rope_->backward(sh.B, sh.HKV, dk_.data());
    st.rope_s = comm::wtime() - t0;
  }

  // pass 3: in the forward pass this was: Q = X Wq (K, V alike), so now: dWq = X^T dQ, ...
  // The three partials are one buffer [dWq | dWk | dWv] and one reduction.
  t0 = comm::wtime();
  const CMat<A> dQ(dq_.data(), BL_, HD_), dK(dk_.data(), BL_, KD_), dV(dv_.data(), BL_, KD_);
  A* part = dw_part_.data();
  Mat<A>(part, M_, HD_).noalias() = X.transpose() * dQ;
  Mat<A>(part + M_ * HD_, M_, KD_).noalias() = X.transpose() * dK;
  Mat<A>(part + M_ * (HD_ + KD_), M_, KD_).noalias() = X.transpose() * dV;
  st.gemm_s += comm::wtime() - t0;
  red_dwo_.test();
  red_dw_.start(dw_part_.data(), dw_.data(), Index(dw_part_.size()));

  // pass 4: dX = dQ Wq^T + dK Wk^T + dV Wv^T, overlapping both reductions
  t0 = comm::wtime();
  Mat<A> dX(dx_.data(), BL_, M_);
  dX.noalias() = dQ * CMat<A>(wq_.data(), M_, HD_).transpose();
  red_dwo_.test();
  red_dw_.test();
  dX.noalias() += dK * CMat<A>(wk_.data(), M_, KD_).transpose();
  red_dwo_.test();
  red_dw_.test();
  dX.noalias() += dV * CMat<A>(wv_.data(), M_, KD_).transpose();
  st.gemm_s += comm::wtime() - t0;

  red_dwo_.wait([&] { return fmt::format("rank {}: the dWo all-reduce", r); });
  red_dw_.wait([&] { return fmt::format("rank {}: the dWq/dWk/dWv all-reduce", r); });
  st.dwo = red_dwo_.stats();
  st.dwqkv = red_dw_.stats();
  if (s_.average_weight_grads) {  // test hook: the DDP convention, wrong here
    const A inv = A(1) / A(comm_.size());
    for (A& g : dw_) g *= inv;
    for (A& g : dwo_) g *= inv;
  }
  st.total_s = comm::wtime() - t_pass + dout_s_;
  return st;
}

template class Layer<float>;
template class Layer<double>;
template class Layer<core::bf16>;
template class Layer<core::f16>;

}  // namespace ringattn::runtime
