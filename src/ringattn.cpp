// The library API (ringattn/ringattn.hpp) over the strategy seam: options checked and agreed on by
// every rank, the layout and mask built once, one Strategy<S> per dtype, RoPE around it.
#include "ringattn/ringattn.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <variant>

#include "ringattn/core/rope.hpp"
#include "ringattn/core/storage.hpp"
#include "ringattn/runtime/agreement.hpp"
#include "ringattn/runtime/plan.hpp"
#include "ringattn/runtime/strategy.hpp"

namespace ringattn {

namespace {

// Runs `fn` on every rank; an exception on any rank becomes the same error on every rank (the
// lowest failing rank's): InputError for bad input, AgreedFailure for anything else (out of
// memory, a system error), so one rank's failure never leaves its peers waiting in the next
// collective. The same collectives as runtime::agreed (Group::agree), so refuse() can join them.
// The first character of the agreed text carries the kind.
constexpr char kInputKind = 'I', kFailureKind = 'F';

[[noreturn]] void throw_agreed(const std::string& e) {
  if (e[0] == kInputKind) throw InputError(e.substr(1));
  throw AgreedFailure(e.substr(1));
}

template <class Fn>
void agreed_setup(const comm::Group& group, const std::string& what, Fn&& fn) {
  std::string err;
  try {
    fn();
  } catch (const InputError& e) {
    err = kInputKind + std::string(e.what());
  } catch (const std::bad_alloc&) {
    err = kFailureKind + fmt::format("rank {}: out of memory while {} (std::bad_alloc)", group.rank(), what);
  } catch (const std::exception& e) {
    err = kFailureKind + fmt::format("rank {}: {} while {}", group.rank(), e.what(), what);
  }
  if (auto e = group.agree(err)) throw_agreed(*e);
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
  runtime::AttentionPlan plan;
  const runtime::OptionNames* names = &runtime::cpp_names();
  std::variant<Engine<float>, Engine<double>, Engine<core::bf16>, Engine<core::f16>> engine;
  bool loaded = false, forward_done = false, backward_done = false;
  std::vector<double> dsinks;  // [H] after a backward with sinks
  runtime::PassStats fwd, bwd;

  explicit Impl(comm::Comm c) : comm(std::move(c)) {}

  Index L() const { return plan.layout.size(comm.rank()); }
  std::string rank_shape(Index heads) const {
    return fmt::format("[B, L, {}, D] = [{}, {}, {}, {}]: L = {} positions of rank {} under the {} layout of S = {} "
                       "over {} ranks", heads == opt.shape.H ? "H" : "HKV", opt.shape.B, L(), heads, opt.shape.D, L(),
                       comm.rank(), core::layout_name(plan.layout.kind()), opt.shape.S, comm.size());
  }

  template <class S>
  void load(std::span<const S> q, std::span<const S> k, std::span<const S> v) {
    const core::Shape& s = opt.shape;
    agreed_setup(comm, "loading the shard", [&] {
      if (!std::holds_alternative<Engine<S>>(engine))
        throw InputError(fmt::format("load: {} data given to a plan of dtype {}", core::dtype_name(core::dtype_of<S>()),
                                     core::dtype_name(plan.dtype)));
      check_size("q", q, s.B * L() * s.H * s.D, rank_shape(s.H));
      check_size("k", k, s.B * L() * s.HKV * s.D, rank_shape(s.HKV));
      check_size("v", v, s.B * L() * s.HKV * s.D, rank_shape(s.HKV));
      Engine<S>& e = std::get<Engine<S>>(engine);
      if (e.rope) {  // allocated here, where running out of memory is agreed
        e.q_rot.resize(q.size());
        e.k_rot.resize(k.size());
      }
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

  template <class S, class A = core::accum_t<S>>
  void backward(std::span<const S> dout, std::span<const A> dlse) {
    const core::Shape& s = opt.shape;
    std::vector<A> zeros;
    agreed_setup(comm, "loading dout", [&] {
      if (!forward_done) throw InputError("backward: called before forward()");
      if (!std::holds_alternative<Engine<S>>(engine))
        throw InputError(fmt::format("backward: {} dout given to a plan of dtype {}",
                                     core::dtype_name(core::dtype_of<S>()), core::dtype_name(plan.dtype)));
      check_size("dout", dout, s.B * L() * s.H * s.D, rank_shape(s.H));
      if (!dlse.empty())
        check_size("dlse", dlse, s.B * s.H * L(), fmt::format("[B, H, L] = [{}, {}, {}]", s.B, s.H, L()));
    });
    // A head-parallel strategy moves dL/dLSE through an all-to-all: every rank gives one (zeros for
    // a rank without) when any rank does. The agreed flag decides, not the span: a rank that holds
    // no positions has an empty dL/dLSE even when it gave one, and must still join.
    bool give_dlse = !dlse.empty();
    if (plan.strategy == runtime::StrategyKind::ulysses || plan.strategy == runtime::StrategyKind::usp) {
      std::int64_t any = give_dlse ? 1 : 0;
      comm.allreduce_max(std::span<std::int64_t>(&any, 1));
      give_dlse = any != 0;
    }
    if (give_dlse && dlse.empty()) {  // zeros, never an empty buffer: load_dlse takes null as "none"
      zeros.assign(std::max<Index>(1, s.B * s.H * L()), A(0));
      dlse = zeros;
    }
    Engine<S>& e = std::get<Engine<S>>(engine);
    e.strategy->load_dout(dout.data());
    if (give_dlse) e.strategy->load_dlse(dlse.data());
    bwd = e.strategy->backward();
    if (!plan.sinks.empty()) dsinks = runtime::sink_gradient(comm, *e.strategy, s.H);
    backward_done = true;
  }

  void set_sinks(std::span<const double> sinks) {
    agreed_setup(comm, "setting the sinks", [&] {
      if (plan.sinks.empty())
        throw InputError(names->render("set_sinks: the plan has no @sinks (expected them in the options)"));
      runtime::check_sinks(sinks, opt.shape.H, plan.dtype, *names);
    });
    const std::vector<double> given(sinks.begin(), sinks.end());
    runtime::agree_on_plan(comm, {{names->render("@sinks"), fmt::format("{}", fmt::join(given, ","))}});
    std::copy(given.begin(), given.end(), plan.sinks.begin());  // in place: the strategy reads them there
    opt.sinks = given;
  }

  template <class A>
  void outputs(const Outputs<A>& out) const {
    const core::Shape& s = opt.shape;
    std::visit(
        [&](const auto& e) {
          using E = std::decay_t<decltype(e)>;
          if constexpr (!std::is_same_v<typename E::A, A>) {
            throw InputError(fmt::format("outputs: {} spans given, but a plan of dtype {} outputs {}",
                                         core::dtype_name(core::dtype_of<A>()), core::dtype_name(plan.dtype),
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
            if (!out.dsinks.empty()) {
              if (plan.sinks.empty()) throw InputError(names->render("outputs: dsinks asked for without @sinks"));
              if (!backward_done) throw InputError("outputs: dsinks asked for before backward()");
              check_size("dsinks", out.dsinks, s.H, fmt::format("[H] = [{}]", s.H));
              std::transform(dsinks.begin(), dsinks.end(), out.dsinks.begin(), [](double x) { return A(x); });
            }
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
    : Attention(std::move(comm), options, runtime::cpp_names()) {}

Attention::Attention(comm::Comm comm, const AttentionOptions& options, const runtime::OptionNames& names,
                     core::FunctionRef<void(const Attention&)> check)
    : impl_(std::make_unique<Impl>(std::move(comm))) {
  Impl& m = *impl_;
  m.opt = options;
  m.names = &names;
  agreed_setup(m.comm, "checking the options",
               [&] { m.plan = runtime::make_attention_plan(m.opt, m.comm.size(), names); });
  runtime::agree_on_plan(m.comm, runtime::plan_fields(m.plan, m.opt, names));
  m.comm.set_timeout(m.plan.timeout_s);
  // The front end's checks against the plan come before anything of the shard's size (an agreement
  // on every rank, with or without a check, so the ranks' collectives match).
  agreed_setup(m.comm, "checking the inputs against the plan", [&] {
    if (check) check(*this);
  });
  auto build = [&](auto& e) {
    using S = typename std::decay_t<decltype(e)>::Storage;
    e.strategy = runtime::make_strategy<S>(m.comm, runtime::strategy_setup(m.plan));
    if (m.plan.rope_theta) e.rope.emplace(*m.plan.rope_theta, m.plan.shape.D, m.plan.layout.positions(m.comm.rank()));
  };
  // A strategy that refuses the setup (a shape it cannot split), or a rank without the memory for
  // its buffers, says so on every rank.
  agreed_setup(m.comm, fmt::format("allocating the {} strategy's buffers for {} ({})",
                                   runtime::strategy_name(m.plan.strategy), m.plan.shape.str(),
                                   core::dtype_name(m.plan.dtype)), [&] {
    core::with_storage(m.plan.dtype, [&]<class S>() { m.engine.emplace<Engine<S>>(); });
    std::visit(build, m.engine);
  });
}

Attention::~Attention() = default;
Attention::Attention(Attention&&) noexcept = default;
Attention& Attention::operator=(Attention&&) noexcept = default;

Attention::Impl& Attention::self() const {
  if (!impl_) throw InputError("ringattn::Attention: used after it was moved from (it holds no plan; use the object "
                               "it was moved to)");
  return *impl_;
}

int Attention::rank() const { return self().comm.rank(); }
int Attention::ranks() const { return self().comm.size(); }
const comm::Comm& Attention::comm() const { return self().comm; }
const core::Shape& Attention::shape() const { return self().opt.shape; }
core::DType Attention::dtype() const { return self().plan.dtype; }
double Attention::scale() const { return self().plan.scale; }
const core::Layout& Attention::layout() const { return self().plan.layout; }
const core::Mask& Attention::mask() const { return self().plan.mask; }
Index Attention::local_size() const { return self().L(); }
std::span<const Index> Attention::positions() const { return self().plan.layout.positions(self().comm.rank()); }
bool Attention::has_backward() const { return self().backward_done; }

void Attention::refuse(const std::string& why) {
  const Impl& m = self();
  if (auto e = m.comm.agree(kFailureKind + why)) throw_agreed(*e);
  throw AgreedFailure(why);  // not reached: this rank's error is at least one
}

void Attention::load(std::span<const float> q, std::span<const float> k, std::span<const float> v) {
  self().load(q, k, v);
}
void Attention::load(std::span<const double> q, std::span<const double> k, std::span<const double> v) {
  self().load(q, k, v);
}
void Attention::load(std::span<const core::bf16> q, std::span<const core::bf16> k, std::span<const core::bf16> v) {
  self().load(q, k, v);
}
void Attention::load(std::span<const core::f16> q, std::span<const core::f16> k, std::span<const core::f16> v) {
  self().load(q, k, v);
}

void Attention::forward() {
  Impl& m = self();
  agreed_setup(m.comm, "starting the forward", [&] {
    if (!m.loaded) throw InputError("forward: called before load()");
  });
  m.fwd = std::visit([](auto& e) { return e.strategy->forward(); }, m.engine);
  m.forward_done = true;
  m.backward_done = false;
  m.bwd = {};
}

void Attention::backward(std::span<const float> dout, std::span<const float> dlse) { self().backward(dout, dlse); }
void Attention::backward(std::span<const double> dout, std::span<const double> dlse) {
  self().backward(dout, dlse);
}
void Attention::backward(std::span<const core::bf16> dout, std::span<const float> dlse) {
  self().backward(dout, dlse);
}
void Attention::backward(std::span<const core::f16> dout, std::span<const float> dlse) {
  self().backward(dout, dlse);
}
void Attention::set_sinks(std::span<const double> sinks) { self().set_sinks(sinks); }

void Attention::outputs(const Outputs<float>& out) const { self().outputs(out); }
void Attention::outputs(const Outputs<double>& out) const { self().outputs(out); }

AttentionReport Attention::report() const {
  const Impl& m = self();
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

// ---- KVCache ----------------------------------------------------------------------------------------

namespace {

// The prompt shard's K and V against this rank's L of prompt_len positions (InputError otherwise).
template <class S>
void check_prompt_kv(const KVCacheOptions& c, Index L, Index prompt_len, std::span<const S> k, std::span<const S> v) {
  const std::string what = fmt::format("this rank's {} of {} prompt positions", L, prompt_len);
  check_size("k", k, c.batch * L * c.kv_heads * c.head_dim, what);
  check_size("v", v, c.batch * L * c.kv_heads * c.head_dim, what);
}

}  // namespace

template <class S>
KVCache<S>::KVCache(comm::Comm comm, const KVCacheOptions& options)
    : comm_(std::make_unique<comm::Comm>(std::move(comm))) {
  const auto& names = runtime::cpp_cache_names();
  // The shard's constructor checks the options on this rank alone: built inside the agreement, so
  // that one rank's bad option raises on every rank.
  agreed_setup(*comm_, "building the KV cache", [&] {
    const core::DType t = runtime::parse_dtype(options.dtype, names);
    if (t != core::dtype_of<S>())
      throw InputError(fmt::format("dtype: '{}' is not this KVCache's storage ({})", options.dtype,
                                   core::dtype_name(core::dtype_of<S>())));
    shard_ = std::make_unique<runtime::KVCacheShard<S>>(*comm_, options, names);
  });
  comm_->set_timeout(runtime::prompt_timeout(options, 1, comm_->size()));
}

template <class S>
KVCache<S>::~KVCache() = default;
template <class S>
KVCache<S>::KVCache(KVCache&&) noexcept = default;
template <class S>
KVCache<S>& KVCache<S>::operator=(KVCache&&) noexcept = default;

template <class S>
std::vector<Index> KVCache<S>::positions(Index prompt_len) const {
  return shard_->prompt_positions(prompt_len);
}

template <class S>
void KVCache<S>::prefill(Index prompt_len, std::span<const S> q, std::span<const S> k, std::span<const S> v,
                         std::span<A> o, std::span<A> lse) {
  const runtime::KVCacheOptions& c = shard_->options();
  agreed_setup(*comm_, "checking the prompt", [&] {
    const Index L = static_cast<Index>(shard_->prompt_positions(prompt_len).size());
    const std::string what = fmt::format("this rank's {} of {} prompt positions", L, prompt_len);
    check_size("q", q, c.batch * L * c.heads * c.head_dim, what);
    check_prompt_kv(c, L, prompt_len, k, v);
    if (!o.empty()) check_size("o", o, c.batch * L * c.heads * c.head_dim, what);
    if (!lse.empty()) check_size("lse", lse, c.batch * c.heads * L, what);
  });
  comm_->set_timeout(runtime::prompt_timeout(c, prompt_len, comm_->size()));
  shard_->prefill(prompt_len, q.data(), k.data(), v.data(), o.empty() ? nullptr : o.data(),
                  lse.empty() ? nullptr : lse.data());
}

template <class S>
void KVCache<S>::load(Index prompt_len, std::span<const S> k, std::span<const S> v) {
  const runtime::KVCacheOptions& c = shard_->options();
  agreed_setup(*comm_, "checking the prompt", [&] {
    check_prompt_kv(c, static_cast<Index>(shard_->prompt_positions(prompt_len).size()), prompt_len, k, v);
  });
  comm_->set_timeout(runtime::prompt_timeout(c, prompt_len, comm_->size()));
  shard_->load(prompt_len, k.data(), v.data());
}

template <class S>
DecodeStats KVCache<S>::decode(std::span<const S> q, std::span<const S> k, std::span<const S> v, std::span<A> o,
                               std::span<A> lse) {
  const runtime::KVCacheOptions& c = shard_->options();
  const Index row = c.batch * c.heads * c.head_dim;  // q's elements per new token
  Index T = 0;
  agreed_setup(*comm_, "checking the new tokens", [&] {
    if (static_cast<Index>(q.size()) % row != 0)
      throw InputError(fmt::format("q: {} elements is not a whole number of tokens of B H D = {}", q.size(), row));
    T = static_cast<Index>(q.size()) / row;
    const std::string what = fmt::format("T = {} new tokens", T);
    check_size("k", k, c.batch * T * c.kv_heads * c.head_dim, what);
    check_size("v", v, c.batch * T * c.kv_heads * c.head_dim, what);
    check_size("o", o, T * row, what);
    if (!lse.empty()) check_size("lse", lse, c.batch * c.heads * T, what);
  });
  return shard_->decode(T, q.data(), k.data(), v.data(), o.data(), lse.empty() ? nullptr : lse.data());
}

template <class S>
Index KVCache<S>::length() const {
  return shard_->length();
}
template <class S>
Index KVCache<S>::local_positions() const {
  return shard_->local_positions();
}
template <class S>
Index KVCache<S>::resident_bytes() const {
  return shard_->resident_bytes();
}

template class KVCache<float>;
template class KVCache<double>;
template class KVCache<core::bf16>;
template class KVCache<core::f16>;

}  // namespace ringattn
