// The library API (ringattn/ringattn.hpp) over the strategy seam: options checked and agreed on by
// every rank, the layout and mask built once, one Strategy<S> per dtype, RoPE around it.
#include "ringattn/ringattn.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <optional>
#include <variant>

#include "ringattn/core/rope.hpp"
#include "ringattn/core/storage.hpp"
#include "ringattn/runtime/agreement.hpp"
#include "ringattn/runtime/strategy.hpp"

namespace ringattn {

namespace {

std::string join(std::span<const Index> v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

// Library messages name the API's fields; the strategy parser is shared with the command line.
std::string without_dashes(const std::string& m) { return m.rfind("--", 0) == 0 ? m.substr(2) : m; }

core::DType parse_dtype(const std::string& name) {
  if (const auto t = core::dtype_from_name(name)) return *t;
  throw InputError(fmt::format("dtype: unknown dtype '{}' (expected f32, f64, bf16 or f16)", name));
}

core::LayoutKind parse_layout(const std::string& name) {
  if (name == "contiguous") return core::LayoutKind::contiguous;
  if (name == "striped") return core::LayoutKind::striped;
  if (name == "zigzag") return core::LayoutKind::zigzag;
  throw InputError(fmt::format("layout: unknown layout '{}' (expected contiguous, striped or zigzag)", name));
}

void check_shape(const core::Shape& s) {
  const std::pair<const char*, Index> sizes[] = {{"B", s.B}, {"S", s.S}, {"H", s.H}, {"HKV", s.HKV}, {"D", s.D}};
  for (const auto& [name, v] : sizes)
    if (v < 1) throw InputError(fmt::format("shape: {} = {} is not a positive size (expected >= 1)", name, v));
  if (s.H % s.HKV != 0)
    throw InputError(fmt::format("shape: H = {} query heads is not a multiple of HKV = {} key/value heads "
                                 "(expected H % HKV == 0)", s.H, s.HKV));
}

void check_partition(const std::vector<Index>& partition, core::LayoutKind kind, int N, Index S) {
  if (partition.empty()) return;
  if (kind != core::LayoutKind::contiguous)
    throw InputError(fmt::format("partition: only applies to the contiguous layout, not {}", core::layout_name(kind)));
  if (static_cast<int>(partition.size()) != N)
    throw InputError(fmt::format("partition: has {} sizes for {} ranks (expected one per rank)", partition.size(), N));
  Index sum = 0;
  for (Index n : partition) {
    if (n < 0) throw InputError(fmt::format("partition: size {} is negative (expected sizes >= 0)", n));
    sum += n;
  }
  if (sum != S) throw InputError(fmt::format("partition: sizes sum to {} but S is {} (expected sum == S)", sum, S));
}

void check_mask(const AttentionOptions& o) {
  if (o.window < 0) throw InputError(fmt::format("window: {} is negative (expected W >= 1, or none)", o.window));
  if (o.doc_lens.empty()) return;
  Index sum = 0;
  for (Index n : o.doc_lens) {
    if (n < 0) throw InputError(fmt::format("doc_lens: length {} is negative (expected lengths >= 0)", n));
    sum += n;
  }
  if (sum != o.shape.S)
    throw InputError(fmt::format("doc_lens: lengths sum to {} but S is {} (expected sum == S)", sum, o.shape.S));
}

double checked_scale(const AttentionOptions& o, core::DType dtype) {
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(o.shape.D));
  if (!std::isfinite(scale)) throw InputError(fmt::format("scale: {} is not a finite number", scale));
  // The scores are computed in the accumulation type: the scale must be finite there too.
  if (dtype != core::DType::f64 && !std::isfinite(static_cast<float>(scale)))
    throw InputError(fmt::format("scale: {:g} overflows float32 arithmetic (expected |scale| <= {:g})", scale,
                                 double(std::numeric_limits<float>::max())));
  return scale;
}

void check_rope(const AttentionOptions& o) {
  if (!o.rope_theta) return;
  if (!(std::isfinite(*o.rope_theta) && *o.rope_theta > 0))
    throw InputError(fmt::format("rope: theta {} is not a positive finite base (expected e.g. 10000)", *o.rope_theta));
  if (o.shape.D % 2 != 0)
    throw InputError(fmt::format("rope: head dim D = {} is odd (rotate-half RoPE pairs i with i + D/2; expected D "
                                 "even)", o.shape.D));
}

// The strategy's rules (runtime::check_strategy), its messages in the API's names.
int ulysses_degree(const AttentionOptions& o, runtime::StrategyKind kind, int N) {
  const int given = o.ulysses_degree.value_or(0);
  try {
    runtime::check_strategy(kind, given, o.shape.H, N);
  } catch (const InputError& e) {
    std::string m = e.what();
    for (const auto& [cli, api] : {std::pair<std::string, std::string>{"--ulysses-degree", "ulysses_degree"},
                                   {"--strategy", "strategy"}})
      for (std::size_t at = m.find(cli); at != std::string::npos; at = m.find(cli, at)) m.replace(at, cli.size(), api);
    throw InputError(m);
  }
  return runtime::ulysses_degree(kind, given, N);
}

// Every field the ranks must hold the same, named as the API names it.
std::vector<runtime::PlanField> plan_fields(const AttentionOptions& o, const core::Layout& layout, double scale,
                                            int U) {
  auto num = [](double v) { return fmt::format("{:.17g}", v); };
  const core::Shape& s = o.shape;
  return {{"S (the sequence length)", std::to_string(s.S)},
          {"B (the batch)", std::to_string(s.B)},
          {"H (query heads)", std::to_string(s.H)},
          {"HKV (key/value heads)", std::to_string(s.HKV)},
          {"D (the head dim)", std::to_string(s.D)},
          {"dtype", o.dtype},
          {"causal", o.causal ? "on" : "off"},
          {"window", std::to_string(o.window)},
          {"doc_lens", join(o.doc_lens)},
          {"layout", o.layout},
          {"the shard sizes (partition and layout)", join(layout.sizes())},
          {"scale", num(scale)},
          {"rope", o.rope_theta ? num(*o.rope_theta) : "off"},
          {"strategy", o.strategy},
          {"ulysses_degree", std::to_string(U)},
          {"timeout_s", num(o.timeout_s)},
          {"tiling", fmt::format("{} {} {} {}", o.tiling.q_rows, o.tiling.k_cols, o.tiling.strip_rows,
                                 o.tiling.chunk_rows)}};
}

template <class T>
void check_size(const char* name, std::span<T> x, Index want, const std::string& what) {
  if (static_cast<Index>(x.size()) != want)
    throw InputError(fmt::format("{}: {} elements on this rank, expected {} ({})", name, x.size(), want, what));
}

}  // namespace

// One dtype's strategy and what the API keeps around it.
template <class S>
struct Engine {
  using Storage = S;
  using A = core::accum_t<S>;
  std::unique_ptr<runtime::Strategy<S>> strategy;
  std::optional<core::Rope> rope;
  std::vector<S> q_rot, k_rot;  // RoPE only: q and k rotated at their global positions
};

struct Attention::Impl {
  comm::Comm comm;
  AttentionOptions opt;
  core::DType dtype = core::DType::f32;
  double scale = 1;
  core::Layout layout = core::Layout::contiguous(1, 1);
  core::Mask mask;
  runtime::StrategySetup setup;
  std::variant<Engine<float>, Engine<double>, Engine<core::bf16>, Engine<core::f16>> engine;
  bool loaded = false, forward_done = false, backward_done = false;
  runtime::PassStats fwd, bwd;

  explicit Impl(comm::Comm c) : comm(std::move(c)) {}

  Index L() const { return layout.size(comm.rank()); }
  std::string rank_shape(Index heads) const {
    return fmt::format("[B, L, {}, D] = [{}, {}, {}, {}]: L = {} positions of rank {} under the {} layout of S = {} "
                       "over {} ranks", heads == opt.shape.H ? "H" : "HKV", opt.shape.B, L(), heads, opt.shape.D, L(),
                       comm.rank(), core::layout_name(layout.kind()), opt.shape.S, comm.size());
  }

  template <class S>
  void load(std::span<const S> q, std::span<const S> k, std::span<const S> v) {
    const core::Shape& s = opt.shape;
    runtime::agreed(comm, [&] {
      if (!std::holds_alternative<Engine<S>>(engine))
        throw InputError(fmt::format("load: {} data given to a plan of dtype {}", core::dtype_name(core::dtype_of<S>()),
                                     opt.dtype));
      check_size("q", q, s.B * L() * s.H * s.D, rank_shape(s.H));
      check_size("k", k, s.B * L() * s.HKV * s.D, rank_shape(s.HKV));
      check_size("v", v, s.B * L() * s.HKV * s.D, rank_shape(s.HKV));
    });
    Engine<S>& e = std::get<Engine<S>>(engine);
    const S* qp = q.data();
    const S* kp = k.data();
    if (e.rope) {  // the strategy attends q and k rotated at their global positions
      e.q_rot.assign(q.begin(), q.end());
      e.k_rot.assign(k.begin(), k.end());
      e.rope->forward(s.B, s.H, e.q_rot.data());
      e.rope->forward(s.B, s.HKV, e.k_rot.data());
      qp = e.q_rot.data();
      kp = e.k_rot.data();
    }
    e.strategy->load(qp, kp, v.data());
    loaded = true;
    forward_done = backward_done = false;
  }

  template <class S>
  void backward(std::span<const S> dout) {
    const core::Shape& s = opt.shape;
    runtime::agreed(comm, [&] {
      if (!forward_done) throw InputError("backward: called before forward()");
      if (!std::holds_alternative<Engine<S>>(engine))
        throw InputError(fmt::format("backward: {} dout given to a plan of dtype {}",
                                     core::dtype_name(core::dtype_of<S>()), opt.dtype));
      check_size("dout", dout, s.B * L() * s.H * s.D, rank_shape(s.H));
    });
    Engine<S>& e = std::get<Engine<S>>(engine);
    e.strategy->load_dout(dout.data());
    bwd = e.strategy->backward();
    backward_done = true;
  }

  template <class A>
  void outputs(const Outputs<A>& out) const {
    const core::Shape& s = opt.shape;
    std::visit(
        [&](const auto& e) {
          using E = std::decay_t<decltype(e)>;
          if constexpr (!std::is_same_v<typename E::A, A>) {
            throw InputError(fmt::format("outputs: {} spans given, but a plan of dtype {} outputs {}",
                                         core::dtype_name(core::dtype_of<A>()), opt.dtype,
                                         core::dtype_name(core::dtype_of<typename E::A>())));
          } else {
            if (!forward_done) throw InputError("outputs: called before forward()");
            const bool grads = !out.dq.empty() || !out.dk.empty() || !out.dv.empty();
            if (grads && !backward_done) throw InputError("outputs: dq, dk, dv asked for before backward()");
            const Index q = s.B * L() * s.H * s.D, kv = s.B * L() * s.HKV * s.D;
            auto want = [](const char* name, std::span<A> x, Index n, const std::string& what) {
              if (!x.empty()) check_size(name, x, n, what);
              return x.empty() ? nullptr : x.data();
            };
            const std::string lse_shape = fmt::format("[B, H, L] = [{}, {}, {}]", s.B, s.H, L());
            A* o = want("o", out.o, q, rank_shape(s.H));
            A* lse = want("lse", out.lse, s.B * s.H * L(), lse_shape);
            A* dq = want("dq", out.dq, q, rank_shape(s.H));
            A* dk = want("dk", out.dk, kv, rank_shape(s.HKV));
            A* dv = want("dv", out.dv, kv, rank_shape(s.HKV));
            e.strategy->outputs(o, lse, dq, dk, dv);
            // in the forward pass this was: q' = R q, k' = R k, so now: dq = R^T dq', dk = R^T dk'
            if (e.rope && dq) e.rope->backward(s.B, s.H, dq);
            if (e.rope && dk) e.rope->backward(s.B, s.HKV, dk);
          }
        },
        engine);
  }
};

Attention::Attention(comm::Comm comm, const AttentionOptions& options)
    : impl_(std::make_unique<Impl>(std::move(comm))) {
  Impl& m = *impl_;
  m.opt = options;
  const int N = m.comm.size();
  runtime::StrategyKind kind = runtime::StrategyKind::ring;
  int U = 1;
  runtime::agreed(m.comm, [&] {
    const AttentionOptions& o = m.opt;
    check_shape(o.shape);
    m.dtype = parse_dtype(o.dtype);
    const core::LayoutKind lk = parse_layout(o.layout);
    check_partition(o.partition, lk, N, o.shape.S);
    check_mask(o);
    m.scale = checked_scale(o, m.dtype);
    check_rope(o);
    if (!(std::isfinite(o.timeout_s) && o.timeout_s >= 0))
      throw InputError(fmt::format("timeout_s: {} is not a time (expected seconds >= 0; 0: no watchdog)", o.timeout_s));
    try {
      kind = runtime::parse_strategy(o.strategy);
    } catch (const InputError& e) {
      throw InputError(without_dashes(e.what()));
    }
    U = ulysses_degree(o, kind, N);
    m.layout = core::Layout::make(lk, o.shape.S, N, o.partition);
    m.mask = core::Mask::make(o.shape.S, o.causal, o.window, o.doc_lens);
  });
  runtime::agree_on_plan(m.comm, plan_fields(m.opt, m.layout, m.scale, U));
  m.comm.set_timeout(m.opt.timeout_s);

  runtime::StrategySetup& s = m.setup;
  s.shape = m.opt.shape;
  s.layout = &m.layout;
  s.mask = &m.mask;
  s.scale = m.scale;
  s.tiling = core::resolve_tiling(m.opt.tiling, s.shape.D, m.layout.max_size(), s.shape.G());
  s.traffic = core::Traffic::aware;
  s.kind = kind;
  s.ulysses_degree = U;
  auto build = [&](auto& e) {
    using S = typename std::decay_t<decltype(e)>::Storage;
    e.strategy = runtime::make_strategy<S>(m.comm, s);
    if (m.opt.rope_theta) e.rope.emplace(*m.opt.rope_theta, s.shape.D, m.layout.positions(m.comm.rank()));
  };
  core::with_storage(m.dtype, [&]<class S>() { m.engine.emplace<Engine<S>>(); });
  // A strategy that refuses the setup (a shape it cannot split) says so on every rank.
  runtime::agreed(m.comm, [&] { std::visit(build, m.engine); });
}

Attention::~Attention() = default;
Attention::Attention(Attention&&) noexcept = default;
Attention& Attention::operator=(Attention&&) noexcept = default;

int Attention::rank() const { return impl_->comm.rank(); }
int Attention::ranks() const { return impl_->comm.size(); }
const comm::Comm& Attention::comm() const { return impl_->comm; }
const core::Shape& Attention::shape() const { return impl_->opt.shape; }
core::DType Attention::dtype() const { return impl_->dtype; }
double Attention::scale() const { return impl_->scale; }
const core::Layout& Attention::layout() const { return impl_->layout; }
const core::Mask& Attention::mask() const { return impl_->mask; }
Index Attention::local_size() const { return impl_->L(); }
std::span<const Index> Attention::positions() const { return impl_->layout.positions(impl_->comm.rank()); }
bool Attention::has_backward() const { return impl_->backward_done; }

void Attention::load(std::span<const float> q, std::span<const float> k, std::span<const float> v) {
  impl_->load(q, k, v);
}
void Attention::load(std::span<const double> q, std::span<const double> k, std::span<const double> v) {
  impl_->load(q, k, v);
}
void Attention::load(std::span<const core::bf16> q, std::span<const core::bf16> k, std::span<const core::bf16> v) {
  impl_->load(q, k, v);
}
void Attention::load(std::span<const core::f16> q, std::span<const core::f16> k, std::span<const core::f16> v) {
  impl_->load(q, k, v);
}

void Attention::forward() {
  Impl& m = *impl_;
  runtime::agreed(m.comm, [&] {
    if (!m.loaded) throw InputError("forward: called before load()");
  });
  m.fwd = std::visit([](auto& e) { return e.strategy->forward(); }, m.engine);
  m.forward_done = true;
  m.backward_done = false;
  m.bwd = {};
}

void Attention::backward(std::span<const float> dout) { impl_->backward(dout); }
void Attention::backward(std::span<const double> dout) { impl_->backward(dout); }
void Attention::backward(std::span<const core::bf16> dout) { impl_->backward(dout); }
void Attention::backward(std::span<const core::f16> dout) { impl_->backward(dout); }

void Attention::outputs(const Outputs<float>& out) const { impl_->outputs(out); }
void Attention::outputs(const Outputs<double>& out) const { impl_->outputs(out); }

AttentionReport Attention::report() const {
  const Impl& m = *impl_;
  auto pass = [](const runtime::PassStats& p) { return PassReport{p.total_s, p.compute_s, p.wait_s, p.work.flops}; };
  AttentionReport r;
  r.forward = pass(m.fwd);
  r.backward = pass(m.bwd);
  std::visit(
      [&](const auto& e) {
        r.ledger = e.strategy->ledger();
        r.resident_bytes = e.strategy->resident_bytes();
      },
      m.engine);
  return r;
}

}  // namespace ringattn
