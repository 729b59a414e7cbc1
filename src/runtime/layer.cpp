#include "ringattn/runtime/layer.hpp"

#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>

#include "ringattn/core/errors.hpp"
#include "ringattn/core/inputs.hpp"
#include "ringattn/core/layer_reference.hpp"
#include "ringattn/io/json.hpp"
#include "ringattn/io/npy.hpp"
#include "ringattn/io/report.hpp"
#include "ringattn/runtime/common.hpp"
#include "ringattn/runtime/staged_outputs.hpp"

namespace ringattn::runtime {

namespace {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Mat = Eigen::Map<RowMat<T>>;
template <class T>
using CMat = Eigen::Map<const RowMat<T>>;

// The ring backward calls its observer after every block it attends and every gradient it sends
// or receives; each call progresses the pending dWo reduction (MPI moves it only inside MPI calls)
// and starts its all-gather phase as soon as its reduce-scatter phase is done.
template <class T>
class ReduceProgress : public RingObserver<T> {
 public:
  ReduceProgress(comm::OrderedAllreduce<T>& red, RingObserver<T>* next) : red_(red), next_(next) {}
  void replay_block(int step, int owner, const core::Packing& pk, const T* dk, const T* dv) override {
    red_.test();
    if (next_) next_->replay_block(step, owner, pk, dk, dv);
  }
  void grad_sent(int step, int to, core::Index elems) override {
    red_.test();
    if (next_) next_->grad_sent(step, to, elems);
  }
  void grad_received(int step, int from, core::Index elems) override {
    red_.test();
    if (next_) next_->grad_received(step, from, elems);
  }

 private:
  comm::OrderedAllreduce<T>& red_;
  RingObserver<T>* next_;  // the caller's observer (Layer::set_observer), which sees every event too
};

}  // namespace

template <class T>
Layer<T>::Layer(const comm::Comm& comm, const LayerSetup& setup)
    : comm_(comm), s_(setup), ring_(comm, setup.ring), red_dwo_(comm), red_dw_(comm) {
  const core::Shape& sh = s_.ring.shape;
  L_ = s_.ring.layout->size(comm.rank());
  BL_ = sh.B * L_;
  M_ = s_.M;
  HD_ = sh.H * sh.D;
  KD_ = sh.HKV * sh.D;
  if (s_.rope) {
    std::vector<Index> local(L_);
    std::iota(local.begin(), local.end(), Index{0});
    const std::span<const Index> pos =
        s_.rope_local_positions ? std::span<const Index>(local) : s_.ring.layout->positions(comm.rank());
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

template <class T>
void Layer<T>::load(const T* x, const T* wq, const T* wk, const T* wv, const T* wo, const T* dy) {
  std::copy_n(x, x_.size(), x_.begin());
  std::copy_n(wq, wq_.size(), wq_.begin());
  std::copy_n(wk, wk_.size(), wk_.begin());
  std::copy_n(wv, wv_.size(), wv_.begin());
  std::copy_n(wo, wo_.size(), wo_.begin());
  if (dy) std::copy_n(dy, dy_.size(), dy_.begin());
  else std::fill(dy_.begin(), dy_.end(), T(0));
}

// BL = B*L rows (this rank's positions), M model dim, HD = H*D, KD = HKV*D.
template <class T>
LayerStats Layer<T>::forward() {
  LayerStats st;
  const double t_pass = comm::wtime();
  const core::Shape& sh = s_.ring.shape;
  const CMat<T> X(x_.data(), BL_, M_);

  // pass 1: projections Q = X Wq, K = X Wk, V = X Wv  ([BL, M] x [M, HD] -> [BL, HD] = [B, L, H, D])
  double t0 = comm::wtime();
  Mat<T>(q_.data(), BL_, HD_).noalias() = X * CMat<T>(wq_.data(), M_, HD_);
  Mat<T>(k_.data(), BL_, KD_).noalias() = X * CMat<T>(wk_.data(), M_, KD_);
  Mat<T>(v_.data(), BL_, KD_).noalias() = X * CMat<T>(wv_.data(), M_, KD_);
  st.gemm_s += comm::wtime() - t0;

  // pass 2: RoPE on Q and K at each token's global position
  if (rope_) {
    t0 = comm::wtime();
    rope_->forward(sh.B, sh.H, q_.data());
    rope_->forward(sh.B, sh.HKV, k_.data());
    st.rope_s = comm::wtime() - t0;
  }

  // RingAttention::load takes dout with q, k, v. dO = dY Wo^T depends only on inputs, so it is
  // formed here, but it is backward work: its time is charged to backward().
  dout_s_ = 0;
  if (s_.backward) {
    t0 = comm::wtime();
    Mat<T>(dout_.data(), BL_, HD_).noalias() = CMat<T>(dy_.data(), BL_, M_) * CMat<T>(wo_.data(), HD_, M_).transpose();
    dout_s_ = comm::wtime() - t0;
  }

  // pass 3: ring attention
  ring_.load(q_.data(), k_.data(), v_.data(), s_.backward ? dout_.data() : nullptr);
  st.ring = ring_.forward();
  ring_.outputs(o_.data(), nullptr, nullptr, nullptr, nullptr);

  // pass 4: output projection Y = O Wo  ([BL, HD] x [HD, M])
  t0 = comm::wtime();
  Mat<T>(y_.data(), BL_, M_).noalias() = CMat<T>(o_.data(), BL_, HD_) * CMat<T>(wo_.data(), HD_, M_);
  st.gemm_s += comm::wtime() - t0;
  st.total_s = comm::wtime() - t_pass - dout_s_;
  return st;
}

template <class T>
LayerStats Layer<T>::backward() {
  LayerStats st;
  const double t_pass = comm::wtime();
  const core::Shape& sh = s_.ring.shape;
  const double timeout = s_.ring.timeout_s;
  const int r = comm_.rank();
  const CMat<T> X(x_.data(), BL_, M_), dY(dy_.data(), BL_, M_);
  st.gemm_s = dout_s_;

  // in the forward pass this was: Y = O Wo, so now: dWo = O^T dY ([HD, BL] x [BL, M]); dO was
  // formed in forward(). dWo's sum over ranks needs nothing from the ring: start it now.
  double t0 = comm::wtime();
  Mat<T>(dwo_part_.data(), HD_, M_).noalias() = CMat<T>(o_.data(), BL_, HD_).transpose() * dY;
  st.gemm_s += comm::wtime() - t0;
  red_dwo_.start(dwo_part_.data(), dwo_.data(), HD_ * M_);

  // pass 1: ring backward, progressing the dWo reduction at every step
  ReduceProgress<T> progress(red_dwo_, observer_);
  ring_.set_observer(&progress);
  st.ring = ring_.backward();
  ring_.set_observer(observer_);
  st.dwo_done_by_ring_end = red_dwo_.test();
  ring_.outputs(nullptr, nullptr, dq_.data(), dk_.data(), dv_.data());

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
  const CMat<T> dQ(dq_.data(), BL_, HD_), dK(dk_.data(), BL_, KD_), dV(dv_.data(), BL_, KD_);
  T* part = dw_part_.data();
  Mat<T>(part, M_, HD_).noalias() = X.transpose() * dQ;
  Mat<T>(part + M_ * HD_, M_, KD_).noalias() = X.transpose() * dK;
  Mat<T>(part + M_ * (HD_ + KD_), M_, KD_).noalias() = X.transpose() * dV;
  st.gemm_s += comm::wtime() - t0;
  red_dwo_.test();
  red_dw_.start(dw_part_.data(), dw_.data(), Index(dw_part_.size()));

  // pass 4: dX = dQ Wq^T + dK Wk^T + dV Wv^T, overlapping both reductions
  t0 = comm::wtime();
  Mat<T> dX(dx_.data(), BL_, M_);
  dX.noalias() = dQ * CMat<T>(wq_.data(), M_, HD_).transpose();
  red_dwo_.test();
  red_dw_.test();
  dX.noalias() += dK * CMat<T>(wk_.data(), M_, KD_).transpose();
  red_dwo_.test();
  red_dw_.test();
  dX.noalias() += dV * CMat<T>(wv_.data(), M_, KD_).transpose();
  st.gemm_s += comm::wtime() - t0;

  red_dwo_.wait(timeout, [&] { return fmt::format("rank {}: the dWo all-reduce", r); });
  red_dw_.wait(timeout, [&] { return fmt::format("rank {}: the dWq/dWk/dWv all-reduce", r); });
  st.dwo = red_dwo_.stats();
  st.dwqkv = red_dw_.stats();
  if (s_.average_weight_grads) {  // test hook: the DDP convention, wrong here
    const T inv = T(1) / T(comm_.size());
    for (T& g : dw_) g *= inv;
    for (T& g : dwo_) g *= inv;
  }
  st.total_s = comm::wtime() - t_pass + dout_s_;
  return st;
}

template class Layer<float>;
template class Layer<double>;

// ---- run_layer_job: `ringattn run --layer` ----------------------------------------------------

namespace {

using core::DType;
using core::Shape;

// The six layer tensors: x and dy are positional [B, S, M] (position axis 1); the weights are
// not positional and every rank holds them whole.
enum LayerFile { kX, kWq, kWk, kWv, kWo, kDy, kFiles };
constexpr const char* kFileNames[kFiles] = {"x", "wq", "wk", "wv", "wo", "dy"};
constexpr core::InputTensor kFileIds[kFiles] = {core::InputTensor::x,  core::InputTensor::wq, core::InputTensor::wk,
                                                core::InputTensor::wv, core::InputTensor::wo, core::InputTensor::dy};

struct LayerPlan : RingOptions {  // layout, mask, traffic, scale
  Shape shape;
  Index M = 0;
  DType dtype = DType::f32;
  io::NpyHeader headers[kFiles];
  bool have_dy = true;

  std::vector<Index> file_shape(int f) const {
    const Index HD = shape.H * shape.D, KD = shape.HKV * shape.D;
    switch (f) {
      case kWq: return {M, HD};
      case kWk:
      case kWv: return {M, KD};
      case kWo: return {HD, M};
      default: return {shape.B, shape.S, M};
    }
  }
  static bool positional(int f) { return f == kX || f == kDy; }
  // Generated weights are scaled by 1/sqrt(fan_in) so that Q, K, V and Y stay of order one
  // (unit-variance weights would make the scores grow like M and saturate the softmax).
  double weight_scale(int f) const {
    if (f == kWo) return 1.0 / std::sqrt(double(shape.H * shape.D));
    return positional(f) ? 1.0 : 1.0 / std::sqrt(double(M));
  }
};

// Shape from x, wq, wk, wv, wo, dy. The weights give H*D and HKV*D; --heads or --head-dim splits them.
void shape_from_files(const LayerConfig& lc, LayerPlan& p) {
  const JobConfig& c = lc.job;
  for (int f = 0; f < kFiles; ++f) {
    const std::string path = path_in(c.inputs, std::string(kFileNames[f]) + ".npy");
    if (f == kDy && !c.backward && !std::filesystem::exists(path)) {
      p.have_dy = false;
      continue;
    }
    p.headers[f] = io::read_npy_header(path);
    const auto& sh = p.headers[f].shape;
    const std::size_t want = LayerPlan::positional(f) ? 3 : 2;
    if (sh.size() != want)
      throw InputError(fmt::format("{}: has {} dimensions {} (expected {})", path, sh.size(), shape_str(sh),
                                   want == 3 ? "3: [B, S, M]" : "2: a weight matrix"));
    if (p.headers[f].dtype != p.headers[kX].dtype)
      throw InputError(fmt::format("{}: dtype {} differs from x.npy's {} (expected all inputs alike)", path,
                                   core::dtype_name(p.headers[f].dtype), core::dtype_name(p.headers[kX].dtype)));
  }
  const auto& x = p.headers[kX].shape;
  p.dtype = p.headers[kX].dtype;
  p.M = x[2];
  const Index HD = p.headers[kWq].shape[1], KD = p.headers[kWk].shape[1];
  Index D = 0;
  if (c.head_dim) {
    D = *c.head_dim;
  } else if (c.heads) {
    if (*c.heads < 1 || HD % *c.heads != 0)
      throw InputError(fmt::format("--heads {} does not divide wq.npy's H*D = {}", *c.heads, HD));
    D = HD / *c.heads;
  } else {
    throw InputError(fmt::format("--layer --inputs: wq.npy gives H*D = {}; give --heads or --head-dim to split it", HD));
  }
  if (D < 1 || HD % D != 0 || KD % D != 0)
    throw InputError(fmt::format("--layer --inputs: head dim D = {} does not divide wq.npy's H*D = {} and wk.npy's "
                                 "HKV*D = {}", D, HD, KD));
  p.shape = Shape{x[0], x[1], HD / D, KD / D, D};
  for (int f = 1; f < kFiles; ++f) {
    if (f == kDy && !p.have_dy) continue;
    const std::vector<Index> want = p.file_shape(f);
    if (p.headers[f].shape != want)
      throw InputError(fmt::format("{}.npy: shape {} does not match x.npy {} and wq.npy {} (expected {})", kFileNames[f],
                                   shape_str(p.headers[f].shape), shape_str(x), shape_str(p.headers[kWq].shape),
                                   shape_str(want)));
  }
  agree_opt(c.seq, p.shape.S, "--seq");
  agree_opt(c.batch, p.shape.B, "--batch");
  agree_opt(c.heads, p.shape.H, "--heads");
  agree_opt(c.kv_heads, p.shape.HKV, "--kv-heads");
  agree_opt(lc.model_dim, p.M, "--model-dim");
  if (!c.dtype.empty() && c.dtype != core::dtype_name(p.dtype))
    throw InputError(fmt::format("--dtype {} contradicts the input files, which are {}", c.dtype,
                                 core::dtype_name(p.dtype)));
}

LayerPlan make_plan(const comm::Comm& comm, const LayerConfig& lc) {
  const JobConfig& c = lc.job;
  LayerPlan p;
  if (!c.inputs.empty()) {
    shape_from_files(lc, p);
  } else {
    if (!lc.model_dim) throw InputError("--layer: needs --model-dim M (or --inputs with x.npy)");
    p.M = *lc.model_dim;
    shape_from_options(c, p.shape, p.dtype);
  }
  if (p.M < 1) throw InputError(fmt::format("--model-dim: {} is not >= 1", p.M));
  p.shape.validate();
  const Shape& s = p.shape;
  const double per_rank = double(s.B) * double(s.S) / comm.size() * double(2 * s.H + s.HKV + 4 * p.M) * s.D * 8.0;
  const double weights = double(p.M) * double(2 * s.H + 2 * s.HKV) * s.D * 8.0 * 3;
  if (double(s.B) * s.S * s.H * s.D > 9e15 || per_rank + weights > 1e15 || double(p.M) * s.H * s.D > 2e9)
    throw InputError(fmt::format("shape {} M={} is too large to hold", s.str(), p.M));
  if (lc.job.rope) core::validate_rope(*lc.job.rope, s.D);
  static_cast<RingOptions&>(p) = ring_options(c, s, comm.size());
  return p;
}

// A generated weight, whole: the seed's N(0, 1) values times 1/sqrt(fan_in), rounded once to T.
template <class T>
std::vector<T> generate_weight(std::uint64_t seed, const LayerPlan& p, int f) {
  const std::vector<Index> sh = p.file_shape(f);
  std::vector<double> g(sh[0] * sh[1]);
  const core::Run all{0, 0, sh[0]};
  core::generate_positions<double>(seed, kFileIds[f], 1, sh[0], sh[1], {&all, 1}, sh[0], g.data());
  const double scale = p.weight_scale(f);
  std::vector<T> w(g.size());
  for (std::size_t n = 0; n < g.size(); ++n) w[n] = static_cast<T>(g[n] * scale);
  return w;
}

template <class T>
void check_finite(const std::vector<T>& x, const std::string& file) {
  for (std::size_t n = 0; n < x.size(); ++n)
    if (!std::isfinite(x[n]))
      throw InputError(fmt::format("{}: non-finite value {} (expected finite inputs)", file, double(x[n])));
}

// This rank's inputs: x, dy [B, L, M] and the weights whole.
template <class T>
struct LayerInputs {
  std::vector<T> t[kFiles];
};

template <class T>
LayerInputs<T> load_inputs(const comm::Comm& comm, const LayerConfig& lc, const LayerPlan& p) {
  const JobConfig& c = lc.job;
  LayerInputs<T> in;
  const int r = comm.rank();
  const Index L = p.layout.size(r);
  const auto runs = p.layout.runs(r);
  const Shape& s = p.shape;
  for (int f = 0; f < kFiles; ++f) {
    std::vector<T>& dst = in.t[f];
    const std::string path = path_in(c.inputs, std::string(kFileNames[f]) + ".npy");
    if (LayerPlan::positional(f)) {
      dst.assign(s.B * L * p.M, T(0));
      if (f == kDy && !p.have_dy) continue;  // zeros
      if (!c.inputs.empty()) io::read_npy_positions<T>(path, p.headers[f], 1, runs, L, dst.data());
      else core::generate_positions<T>(c.seed, kFileIds[f], s.B, s.S, p.M, runs, L, dst.data());
    } else {
      dst = c.inputs.empty() ? generate_weight<T>(c.seed, p, f) : io::read_npy<T>(path, p.headers[f]);
    }
    if (!c.inputs.empty()) check_finite(dst, path);
  }
  return in;
}

// The global tensors in float64, as the ranks saw them (generated f32 inputs rounded to float).
core::LayerTensors global_inputs(const LayerConfig& lc, const LayerPlan& p) {
  const JobConfig& c = lc.job;
  std::vector<double> g[kFiles];
  for (int f = 0; f < kFiles; ++f) {
    const std::vector<Index> sh = p.file_shape(f);
    Index n = 1;
    for (Index d : sh) n *= d;
    if (!c.inputs.empty()) {
      if (f == kDy && !p.have_dy) g[f].assign(n, 0.0);
      else g[f] = io::read_npy<double>(path_in(c.inputs, std::string(kFileNames[f]) + ".npy"), p.headers[f]);
      continue;
    }
    if (LayerPlan::positional(f)) {
      g[f].resize(n);
      const core::Run all{0, 0, p.shape.S};
      core::generate_positions<double>(c.seed, kFileIds[f], p.shape.B, p.shape.S, p.M, {&all, 1}, p.shape.S,
                                       g[f].data());
      if (p.dtype == DType::f32)
        for (double& x : g[f]) x = static_cast<double>(static_cast<float>(x));
    } else if (p.dtype == DType::f32) {
      const std::vector<float> w = generate_weight<float>(c.seed, p, f);
      g[f].assign(w.begin(), w.end());
    } else {
      g[f] = generate_weight<double>(c.seed, p, f);
    }
  }
  return core::LayerTensors{g[kX], g[kWq], g[kWk], g[kWv], g[kWo], g[kDy]};
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// max |x - ref| over this rank's positions of a global [B, S, M] tensor; NaN/inf never pass.
template <class T>
double local_max_diff(std::span<const T> x, const std::vector<double>& ref, Index B, Index M,
                      const core::Layout& layout, int rank) {
  const Index L = layout.size(rank), S = layout.seq();
  auto pos = layout.positions(rank);
  double diff = 0;
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < L; ++i)
      for (Index e = 0; e < M; ++e) {
        const double d = std::abs(double(x[(b * L + i) * M + e]) - ref[(b * S + pos[i]) * M + e]);
        if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
        diff = std::max(diff, d);
      }
  return diff;
}

template <class T>
double whole_max_diff(std::span<const T> x, const std::vector<double>& ref) {
  double diff = 0;
  for (std::size_t n = 0; n < ref.size(); ++n) {
    const double d = std::abs(double(x[n]) - ref[n]);
    if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, d);
  }
  return diff;
}

struct LayerCheck {
  bool passed = false;
  double tolerance = 0;
  double err[6] = {0, 0, 0, 0, 0, 0};  // y, dx, dwq, dwk, dwv, dwo (NaN when not computed)
};
constexpr const char* kOutputNames[6] = {"y", "dx", "dwq", "dwk", "dwv", "dwo"};

template <class T>
LayerCheck run_check(const comm::Comm& comm, const LayerConfig& lc, const LayerPlan& p, const Layer<T>& layer) {
  const bool bwd = lc.job.backward;
  core::LayerTensors g;
  agreed(comm, [&] { g = global_inputs(lc, p); });
  const core::LayerResult ref = core::reference_layer(p.shape, p.M, p.mask, p.scale, lc.job.rope, g, bwd);
  const int r = comm.rank();
  // Every rank checks its own positions of y and dx and its own copy of every weight gradient,
  // so a rank whose copy differs fails the check too.
  std::vector<double> diff(6, 0.0);
  diff[0] = local_max_diff(layer.y(), ref.y, p.shape.B, p.M, p.layout, r);
  if (bwd) {
    diff[1] = local_max_diff(layer.dx(), ref.dx, p.shape.B, p.M, p.layout, r);
    diff[2] = whole_max_diff(layer.dwq(), ref.dwq);
    diff[3] = whole_max_diff(layer.dwk(), ref.dwk);
    diff[4] = whole_max_diff(layer.dwv(), ref.dwv);
    diff[5] = whole_max_diff(layer.dwo(), ref.dwo);
  }
  comm.max_inplace(diff);
  const std::vector<double>* refs[6] = {&ref.y, &ref.dx, &ref.dwq, &ref.dwk, &ref.dwv, &ref.dwo};
  LayerCheck ck;
  ck.tolerance = check_tolerance(p.dtype);
  ck.passed = true;
  for (int t = 0; t < 6; ++t) {
    if (t > 0 && !bwd) {
      ck.err[t] = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    const double scale = max_abs(*refs[t]);
    ck.err[t] = scale < 1e-300 ? diff[t] : diff[t] / scale;
    ck.passed = ck.passed && ck.err[t] <= ck.tolerance;  // NaN or inf never passes
  }
  return ck;
}

// What `run --layer --out` writes: y, dx by position from every rank; the weight gradients whole
// by rank 0 (every rank holds the same bits); and the inputs when they came from --seed.
template <class T>
std::vector<typename StagedOutputs<T>::File> output_files(const LayerConfig& lc, const LayerPlan& p,
                                                          const LayerInputs<T>& in, const Layer<T>& layer) {
  using File = typename StagedOutputs<T>::File;
  constexpr int kWhole = StagedOutputs<T>::kWhole;
  const JobConfig& c = lc.job;
  const std::vector<Index> bsm = p.file_shape(kX);
  std::vector<File> files = {{"y", bsm, 1, layer.y()}};
  if (c.backward) {
    files.push_back({"dx", bsm, 1, layer.dx()});
    files.push_back({"dwq", p.file_shape(kWq), kWhole, layer.dwq()});
    files.push_back({"dwk", p.file_shape(kWk), kWhole, layer.dwk()});
    files.push_back({"dwv", p.file_shape(kWv), kWhole, layer.dwv()});
    files.push_back({"dwo", p.file_shape(kWo), kWhole, layer.dwo()});
  }
  if (c.inputs.empty())
    for (int f = 0; f < kFiles; ++f)
      files.push_back({kFileNames[f], p.file_shape(f), LayerPlan::positional(f) ? 1 : kWhole, in.t[f]});
  return files;
}

io::Json config_json(const LayerConfig& lc, const LayerPlan& p, int N) {
  io::Json j = run_config_json(lc.job, p.shape, p.dtype, p.mask, p.layout, p.scale, N);
  j["layer"] = true;
  j["model_dim"] = static_cast<std::int64_t>(p.M);
  return j;
}

// Per-rank figures of the reductions, medians over --iters.
struct ReduceFigures {
  double send_elems = 0, recv_elems = 0, elapsed_s = 0, exposed_s = 0, hidden_iters = 0;
};

ReduceFigures reduce_figures(const std::vector<comm::ReduceStats>& v) {
  ReduceFigures f;
  if (v.empty()) return f;
  std::vector<double> el, ex;
  for (const comm::ReduceStats& s : v) {
    el.push_back(s.elapsed_s);
    ex.push_back(s.exposed_s);
    f.hidden_iters += s.hidden ? 1 : 0;
  }
  f.send_elems = double(v.back().send_elems);
  f.recv_elems = double(v.back().recv_elems);
  f.elapsed_s = median(el);
  f.exposed_s = median(ex);
  return f;
}

std::string ms(double s) { return fmt::format("{:.3f} ms", s * 1e3); }

template <class T>
int run_typed(const comm::Comm& comm, const LayerConfig& lc, const LayerPlan& p) {
  const JobConfig& c = lc.job;
  const int r = comm.rank(), N = comm.size();
  LayerInputs<T> in;
  agreed(comm, [&] { in = load_inputs<T>(comm, lc, p); });

  LayerSetup setup;
  setup.ring = ring_setup(c, p.shape, p);
  setup.M = p.M;
  setup.rope = lc.job.rope;
  setup.backward = c.backward;
  setup.average_weight_grads = lc.average_weight_grads;
  setup.rope_local_positions = lc.rope_local_positions;
  Layer<T> layer(comm, setup);
  layer.load(in.t[kX].data(), in.t[kWq].data(), in.t[kWk].data(), in.t[kWv].data(), in.t[kWo].data(),
             in.t[kDy].data());

  // Per-iteration figures of this rank; medians (and counts) go into the report.
  std::vector<double> fwd, bwd, comp, wait, gemm, rope, ring_bwd, fwd_slow, bwd_slow;
  std::vector<comm::ReduceStats> dwo_stats, dw_stats;
  int dwo_by_ring_end = 0;
  LayerStats sf, sb;
  for (int it = 0; it < c.warmup + c.iters; ++it) {
    comm.barrier();
    sf = layer.forward();
    sb = c.backward ? layer.backward() : LayerStats{};
    const double slow_f = comm.max(sf.total_s), slow_b = comm.max(sb.total_s);
    if (it < c.warmup) continue;
    fwd.push_back(sf.total_s);
    bwd.push_back(sb.total_s);
    // compute: ring kernels, GEMMs and RoPE; wait: exposed ring transfers and exposed reductions
    comp.push_back(sf.ring.compute_s + sb.ring.compute_s + sf.gemm_s + sb.gemm_s + sf.rope_s + sb.rope_s);
    wait.push_back(sf.ring.wait_s + sb.ring.wait_s + sb.dwo.exposed_s + sb.dwqkv.exposed_s);
    gemm.push_back(sf.gemm_s + sb.gemm_s);
    rope.push_back(sf.rope_s + sb.rope_s);
    ring_bwd.push_back(sb.ring.total_s);
    fwd_slow.push_back(slow_f);
    bwd_slow.push_back(slow_b);
    if (c.backward) {
      dwo_stats.push_back(sb.dwo);
      dw_stats.push_back(sb.dwqkv);
      dwo_by_ring_end += sb.dwo_done_by_ring_end ? 1 : 0;
    }
  }

  double loss = 0;  // sum dY . Y, accumulated in double
  const auto y = layer.y();
  for (std::size_t n = 0; n < y.size(); ++n) loss += double(in.t[kDy][n]) * double(y[n]);
  loss = comm.sum(loss);

  io::Report rep;
  rep.config = config_json(lc, p, N);
  rep.loss = loss;
  rep.forward_s = median(fwd_slow);
  rep.backward_s = median(bwd_slow);
  rep.elem_size = sizeof(T);
  std::optional<LayerCheck> check;
  if (c.check) check = run_check(comm, lc, p, layer);

  // Per-rank figures travel to rank 0 as doubles (integers below 2^53 are exact).
  const ReduceFigures fo = reduce_figures(dwo_stats), fw = reduce_figures(dw_stats);
  const core::Ledger& lg = layer.ring().ledger();
  core::Work work = sf.ring.work;
  work += sb.ring.work;
  // The rank's report row (io::to_row), then the layer's own figures.
  enum Fig : int {
    kGemm = io::kRankReportFields, kRope, kRingBwd, kDwo, kDw = kDwo + 5, kDwoByRingEnd = kDw + 5, kFigs
  };
  io::RankReport me{r,         layer.local_size(), lg,   median(fwd), median(bwd), median(comp), median(wait),
                    work,      layer.ring().resident_bytes(), peak_rss_bytes()};
  me.allreduce_send_elems = Index(fo.send_elems + fw.send_elems);
  me.allreduce_recv_elems = Index(fo.recv_elems + fw.recv_elems);
  std::vector<double> mine = io::to_row(me);
  mine.resize(kFigs);
  mine[kGemm] = median(gemm);
  mine[kRope] = median(rope);
  mine[kRingBwd] = median(ring_bwd);
  for (int w = 0; w < 2; ++w) {
    const ReduceFigures& f = w == 0 ? fo : fw;
    const double v[5] = {f.send_elems, f.recv_elems, f.elapsed_s, f.exposed_s, f.hidden_iters};
    std::copy_n(v, 5, &mine[w == 0 ? kDwo : kDw]);
  }
  mine[kDwoByRingEnd] = dwo_by_ring_end;
  const std::vector<double> all = comm.gather(mine);
  auto fig = [&](int q, int f) { return all[q * kFigs + f]; };
  io::Json allreduce = io::Json::object(), layer_json = io::Json::object();
  if (r == 0) {
    io::Json red_ranks = io::Json::array(), layer_ranks = io::Json::array();
    for (int q = 0; q < N; ++q) {
      const io::RankReport rr = io::from_row(&all[q * kFigs], q);
      rep.ranks.push_back(rr);
      io::Json lr = io::Json::object();
      lr["rank"] = q;
      lr["gemm_s"] = fig(q, kGemm);
      lr["rope_s"] = fig(q, kRope);
      lr["ring_backward_s"] = fig(q, kRingBwd);
      layer_ranks.push_back(lr);
      io::Json red = io::Json::object();
      red["rank"] = q;
      for (int w = 0; w < 2; ++w) {
        const int at = w == 0 ? kDwo : kDw;
        io::Json o = io::Json::object();
        o["send_elems"] = static_cast<std::int64_t>(fig(q, at));
        o["recv_elems"] = static_cast<std::int64_t>(fig(q, at + 1));
        o["send_bytes"] = static_cast<std::int64_t>(fig(q, at) * sizeof(T));
        o["recv_bytes"] = static_cast<std::int64_t>(fig(q, at + 1) * sizeof(T));
        o["elapsed_s"] = fig(q, at + 2);
        o["exposed_s"] = fig(q, at + 3);
        o["hidden"] = c.backward && fig(q, at + 4) == c.iters;
        if (w == 0) {
          o["ring_backward_s"] = fig(q, kRingBwd);
          o["done_by_ring_backward_end"] = c.backward && fig(q, kDwoByRingEnd) == c.iters;
        }
        red[w == 0 ? "dwo" : "dwqkv"] = o;
      }
      red_ranks.push_back(red);
    }
    allreduce["algorithm"] =
        "fixed order: reduce-scatter (MPI_Ialltoallv, each segment summed in rank order) + MPI_Iallgatherv";
    const Index HD = p.shape.H * p.shape.D, KD = p.shape.HKV * p.shape.D;
    for (int w = 0; w < 2; ++w) {
      const int at = w == 0 ? kDwo : kDw;
      io::Json o = io::Json::object();
      o["elems"] = static_cast<std::int64_t>(w == 0 ? HD * p.M : p.M * (HD + 2 * KD));
      o["started"] = w == 0 ? "before the ring backward" : "after the weight-gradient GEMMs";
      o["overlapped_with"] = w == 0 ? "ring backward, RoPE backward, weight and dX GEMMs" : "dX GEMMs";
      double exposed = 0, elapsed = 0, sent = 0;
      bool hidden = c.backward, by_ring_end = c.backward;
      for (int q = 0; q < N; ++q) {
        sent += fig(q, at);
        elapsed = std::max(elapsed, fig(q, at + 2));
        exposed = std::max(exposed, fig(q, at + 3));
        hidden = hidden && fig(q, at + 4) == c.iters;
        by_ring_end = by_ring_end && fig(q, kDwoByRingEnd) == c.iters;
      }
      o["total_send_bytes"] = static_cast<std::int64_t>(sent * sizeof(T));
      o["max_elapsed_s"] = elapsed;
      o["max_exposed_s"] = exposed;  // slowest rank, median over --iters
      // complete before it was waited for, on every rank in every timed iteration
      o["hidden"] = hidden;
      if (w == 0) o["done_by_ring_backward_end"] = by_ring_end;
      allreduce[w == 0 ? "dwo" : "dwqkv"] = o;
    }
    allreduce["ranks"] = red_ranks;
    layer_json["model_dim"] = static_cast<std::int64_t>(p.M);
    layer_json["rope"] = lc.job.rope ? io::Json(*lc.job.rope) : io::Json();
    layer_json["weight_init"] = c.inputs.empty() ? "N(0,1)/sqrt(fan_in) from --seed" : "--inputs";
    layer_json["ranks"] = layer_ranks;
  }

  // Outputs become visible last, only when the report was written too.
  StagedOutputs<T> staged(comm, c.out, p.dtype, p.layout);
  if (!c.out.empty()) staged.stage(output_files(lc, p, in, layer));
  io::Json j = io::to_json(rep);
  if (check) {
    io::Json cj = io::Json::object();
    cj["passed"] = check->passed;
    cj["tolerance"] = check->tolerance;
    io::Json e = io::Json::object();
    for (int t = 0; t < 6; ++t) e[kOutputNames[t]] = check->err[t];
    cj["max_rel_err"] = e;
    j["check"] = cj;
  }
  j["allreduce"] = allreduce;
  j["layer"] = layer_json;
  if (!c.report.empty())
    agreed_runtime(comm, [&] {
      if (r == 0) io::write_text_atomically(c.report, j.dump(2) + "\n");
    });
  staged.commit();

  if (r == 0) {
    const Shape& s = p.shape;
    fmt::print("ringattn run --layer: {} M={} {}{}, mask {}, layout {} over N={} ranks\n", s.str(), p.M,
               core::dtype_name(p.dtype), lc.job.rope ? fmt::format(", rope {:g}", *lc.job.rope) : std::string(),
               p.mask.describe(), core::layout_name(p.layout.kind()), N);
    fmt::print("  time (slowest rank, median of {}): forward {}  backward {}; loss {:.10g}\n", c.iters,
               ms(rep.forward_s), c.backward ? ms(rep.backward_s) : std::string("-"), loss);
    // The ring backward and dWo's reduction side by side: the reduction started before the ring
    // backward; "exposed" is what remained to wait for after all the backward work.
    fmt::print("  {:>4} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>13} {:>6}\n", "rank", "positions",
               "forward", "backward", "gemm", "ring bwd", "ring wait", "dWo done at", "dWo exposed", "dWqkv exposed",
               "hidden");
    for (int q = 0; q < N; ++q) {
      const io::RankReport& rr = rep.ranks[q];
      fmt::print("  {:>4} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>13} {:>6}\n", q, rr.positions,
                 ms(rr.forward_s), ms(rr.backward_s), ms(fig(q, kGemm)), ms(fig(q, kRingBwd)),
                 ms(rr.wait_s - fig(q, kDwo + 3) - fig(q, kDw + 3)), ms(fig(q, kDwo + 2)), ms(fig(q, kDwo + 3)),
                 ms(fig(q, kDw + 3)), c.backward && fig(q, kDwo + 4) == c.iters ? "yes" : "no");
    }
    if (c.backward) {
      double sent = 0;
      for (int q = 0; q < N; ++q) sent += fig(q, kDwo) + fig(q, kDw);
      fmt::print("  weight gradients summed over ranks in rank order: {:.0f} elements sent (all ranks, dWo + dWq|dWk|dWv)\n",
                 sent);
    }
    if (check) {
      auto e = [](double x) { return std::isnan(x) ? std::string("-") : fmt::format("{:.2e}", x); };
      fmt::print("  check vs float64 layer reference (max rel err, tol {:.0e}): y {} dx {} dwq {} dwk {} dwv {} dwo {} "
                 "-> {}\n",
                 check->tolerance, e(check->err[0]), e(check->err[1]), e(check->err[2]), e(check->err[3]),
                 e(check->err[4]), e(check->err[5]), check->passed ? "PASSED" : "FAILED");
    }
  }
  return check && !check->passed ? kExitCheckFailed : kExitOk;
}

}  // namespace

int run_layer_job(const comm::Comm& comm, const LayerConfig& lc) {
  const JobConfig& c = lc.job;
  check_run_options(c);
  if (!c.trace.empty()) throw InputError("--trace: not supported with --layer (use --report)");
  LayerPlan p;
  agreed(comm, [&] { p = make_plan(comm, lc); });
  if (!c.out.empty()) ensure_out_dir(comm, c.out);
  check_writable_file(comm, c.report, "--report");
  return p.dtype == DType::f32 ? run_typed<float>(comm, lc, p) : run_typed<double>(comm, lc, p);
}

}  // namespace ringattn::runtime
