#include "ringattn/runtime/probe.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "ringattn/core/cost_model.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/core/inputs.hpp"
#include "ringattn/core/median.hpp"
#include "ringattn/core/simd.hpp"
#include "ringattn/runtime/agreement.hpp"
#include "ringattn/runtime/job_config.hpp"
#include "ringattn/runtime/plan.hpp"
#include "ringattn/runtime/ring_attention.hpp"
#include "ringattn/runtime/strategy.hpp"

namespace ringattn::runtime {

namespace {

using core::median;

// Repetitions every rank agrees on: as many as fit `budget_s` after one warm-up (slowest rank),
// at least 3, at most `iters`.
int repetitions(const comm::Comm& comm, double warm_s, double budget_s, int iters) {
  const double slowest = comm.max(warm_s);
  if (iters <= 3 || slowest <= 0) return iters;
  return std::clamp(static_cast<int>(budget_s / slowest), 3, iters);
}

// Step 2: block_forward of L queries (all H heads) against one block of L keys, unmasked: the full
// block pair most ring steps compute (a mask changes how many pairs, not the rate).
template <class T>
void measure_kernel(const comm::Comm& comm, const ProbeConfig& c, Probe& p) {
  const core::Shape& s = p.shape;
  const Index L = std::max<Index>(p.L, 1);
  const core::Packing pq{s.B, s.HKV, s.G(), L, s.D}, pk{s.B, s.HKV, 1, L, s.D};
  std::vector<Index> pos(L);
  for (Index i = 0; i < L; ++i) pos[i] = i;
  const core::Run all{0, 0, L};
  std::vector<T> file(s.B * L * s.H * s.D), q(pq.q_elems()), kv(2 * pk.kv_elems());
  core::generate_positions<T>(1, core::InputTensor::q, s.B, L, s.H * s.D, {&all, 1}, L, file.data());
  core::pack_heads(pq, file.data(), q.data());
  file.resize(s.B * L * s.HKV * s.D);
  core::generate_positions<T>(1, core::InputTensor::k, s.B, L, s.HKV * s.D, {&all, 1}, L, file.data());
  core::pack_heads(pk, file.data(), kv.data());
  core::generate_positions<T>(1, core::InputTensor::v, s.B, L, s.HKV * s.D, {&all, 1}, L, file.data());
  core::pack_heads(pk, file.data(), kv.data() + pk.kv_elems());
  using A = core::accum_t<T>;  // bf16 and f16 are stored, f32 computes
  std::vector<A> m(pq.row_elems()), l(pq.row_elems()), acc(pq.q_elems());
  core::Workspace<A> ws(core::resolve_tiling({}, s.D, L, s.G()), s.D, p.precision);  // the run's tiling and kernels
  const core::Mask none = core::Mask::none();
  const core::QueryShard<T> qs{pq, pos, q.data()};
  const core::KVBlock<T> blk{pk, pos, kv.data(), kv.data() + pk.kv_elems()};
  const A scale = static_cast<A>(1.0 / std::sqrt(double(s.D)));
  core::Work work;
  auto once = [&] {
    const core::OnlineState<A> st{m.data(), l.data(), acc.data()};
    core::init_online_state(pq, st);
    comm.barrier();  // every rank computes at once, as in the ring (they share the machine)
    const double t0 = comm::wtime();
    work = core::block_forward(qs, blk, none, scale, st, ws);
    return comm::wtime() - t0;
  };
  const int reps = repetitions(comm, once(), c.budget_s, c.bw.iters);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(once());
  p.kernel_iters = reps;
  p.kernel_s = comm.max(median(t));  // slowest rank
  p.kernel_flops = work.flops;       // 4 L L H D B, as the kernel counts it
  p.compute_flops = p.kernel_s > 0 ? work.flops / p.kernel_s : 0;
}

// One rank's generated shard of q, k, v (and dout for a backward) for the layout (what `run`
// generates at its default --seed 0).
template <class T>
struct Shard {
  std::vector<T> q, k, v, dout;
  Shard(const core::Shape& s, const core::Layout& layout, int rank, bool with_dout) {
    const Index Lr = layout.size(rank);
    const auto runs = layout.runs(rank);
    auto make = [&](std::vector<T>& x, core::InputTensor t, Index heads) {
      x.resize(s.B * Lr * heads * s.D);
      core::generate_positions<T>(0, t, s.B, s.S, heads * s.D, runs, Lr, x.data());
    };
    make(q, core::InputTensor::q, s.H);
    make(k, core::InputTensor::k, s.HKV);
    make(v, core::InputTensor::v, s.HKV);
    if (with_dout) make(dout, core::InputTensor::dout, s.H);
  }
};

// The command line's names, but a strategy is one item of --strategies here.
const OptionNames& probe_names() {
  static const OptionNames names = [] {
    OptionNames n = cli_names();
    n.name[static_cast<std::size_t>(Option::strategy)] = "--strategies";
    return n;
  }();
  return names;
}

// The options of `strategy` (with Ulysses degree U, 0: none) for the probe's options, as `run`
// takes them.
PlanOptions options_for(const ProbeConfig& c, const core::Shape& s, const std::string& strategy, int U) {
  PlanOptions o;
  o.shape = s;
  o.dtype = c.dtype;
  o.precision = c.precision;
  o.causal = c.causal;
  o.layout = c.layout;
  o.strategy = strategy;
  if (U > 0) o.ulysses_degree = U;
  return o;
}

// Their plan, as `run` makes it; OptionError when the strategy's rules forbid it.
AttentionPlan plan_for(const ProbeConfig& c, const core::Shape& s, int N, const std::string& strategy, int U) {
  return make_attention_plan(options_for(c, s, strategy, U), N, probe_names());
}

// Step 3's measurement: the real ring forward for this shape, a few times.
template <class T>
void measure_ring(const comm::Comm& comm, const ProbeConfig& c, const AttentionPlan& plan, Probe& p) {
  const core::Shape& s = p.shape;
  const int N = comm.size();
  const Shard<T> in(s, plan.layout, comm.rank(), false);  // forward only
  RingAttention<T> ring(comm, strategy_setup(plan));
  ring.load(in.q.data(), in.k.data(), in.v.data());
  struct Sample {
    double total, compute, wait;
  };
  auto once = [&] {
    comm.barrier();
    const PassStats ps = ring.forward();
    return Sample{comm.max(ps.total_s), comm.sum(ps.compute_s), comm.sum(ps.wait_s)};
  };
  const int reps = repetitions(comm, once().total, c.budget_s, c.bw.iters);
  std::vector<double> total, step_compute, exposed;
  for (int i = 0; i < reps; ++i) {
    const Sample x = once();
    total.push_back(x.total);
    // Mean compute per (rank, step) slot of the N x N ring: with a causal mask this is the mean
    // useful work of a step, the model's "half a block pair" (skipped blocks count as zero).
    step_compute.push_back(x.compute / (double(N) * N));
    exposed.push_back(x.compute > 0 ? x.wait / x.compute : 0);
  }
  p.ring_iters = reps;
  p.ring_forward_s = median(total);
  p.measured_step_compute_s = median(step_compute);
  p.exposed_wait_ratio = median(exposed);
}

// The strategies named, in order; usp once per U (the one given, or every U with 1 < U < N dividing
// N). Those the rules forbid keep the reason.
std::vector<StrategyProbe> strategy_list(const ProbeConfig& c, const core::Shape& s, int N) {
  std::vector<StrategyProbe> out;
  for (const std::string& name : c.strategies) {
    const StrategyKind k = parse_strategy(name, probe_names());
    std::vector<int> degrees;
    if (k != StrategyKind::usp) degrees = {ulysses_degree(k, 0, N)};
    else if (c.ulysses_degree) degrees = {*c.ulysses_degree};
    else
      for (int U = 2; U < N; ++U)
        if (N % U == 0) degrees.push_back(U);
    if (degrees.empty()) {
      StrategyProbe x;
      x.strategy = name;
      x.ulysses_degree = 0;
      x.forbidden = fmt::format("no Ulysses degree U with 1 < U < N divides N={} (U = 1 is ring, U = N ulysses)", N);
      out.push_back(x);
    }
    for (int U : degrees) {
      StrategyProbe x;
      x.strategy = name;
      x.ulysses_degree = U;
      try {
        plan_for(c, s, N, name, k == StrategyKind::usp ? U : 0);
      } catch (const OptionError& e) {
        x.forbidden = e.what();
      }
      out.push_back(x);
    }
  }
  return out;
}

// Forward and backward of one strategy for this shape on the live ranks, a few times.
template <class T>
void measure_strategy(const comm::Comm& comm, const ProbeConfig& c, const core::Shape& s, StrategyProbe& x) {
  const StrategyKind k = parse_strategy(x.strategy, probe_names());
  const AttentionPlan plan = plan_for(c, s, comm.size(), x.strategy, k == StrategyKind::usp ? x.ulysses_degree : 0);
  const Shard<T> in(s, plan.layout, comm.rank(), true);
  auto st = make_strategy<T>(comm, strategy_setup(plan));
  st->load(in.q.data(), in.k.data(), in.v.data());
  st->load_dout(in.dout.data());
  struct Sample {
    double fwd, bwd, wait, a2a;
  };
  auto once = [&] {
    comm.barrier();
    const PassStats f = st->forward();
    const PassStats b = st->backward();
    double v4[4] = {f.total_s, b.total_s, f.wait_s + b.wait_s, f.a2a_wait_s + b.a2a_wait_s};
    comm.allreduce_max(v4);
    return Sample{v4[0], v4[1], v4[2], v4[3]};
  };
  const Sample warm = once();
  const int reps = repetitions(comm, warm.fwd + warm.bwd, c.budget_s, c.bw.iters);
  std::vector<double> fwd, bwd, wait, a2a;
  for (int i = 0; i < reps; ++i) {
    const Sample y = once();
    fwd.push_back(y.fwd);
    bwd.push_back(y.bwd);
    wait.push_back(y.wait);
    a2a.push_back(y.a2a);
  }
  x.iters = reps;
  x.forward_s = median(fwd);
  x.backward_s = median(bwd);
  x.exposed_wait_s = median(wait);
  x.a2a_wait_s = median(a2a);
  std::int64_t recv = st->ledger().recv_bytes;
  comm.allreduce_max(std::span<std::int64_t>(&recv, 1));
  x.recv_bytes = recv;
}

template <class T>
Probe probe_typed(const comm::Comm& comm, const ProbeConfig& c, const AttentionPlan& plan) {
  Probe p;
  const core::Shape& shape = plan.shape;
  p.shape = shape;
  p.dtype = plan.dtype;
  p.precision = plan.precision;
  p.layout = core::layout_name(plan.layout.kind());
  p.N = comm.size();
  p.L = plan.layout.max_size();
  const double elem = double(sizeof(T));
  p.block_bytes = 2.0 * double(shape.B) * double(p.L) * double(shape.HKV) * double(shape.D) * elem;

  // step 1
  p.bandwidth = comm::ring_bandwidth(comm, c.bw);
  // step 2
  measure_kernel<T>(comm, c, p);
  // step 3: the model with this machine's figures ...
  const double useful = c.causal ? 0.5 : 1.0;
  p.step_intensity = core::step_intensity(double(p.L), shape.H, shape.HKV, elem, c.causal);
  p.predicted_step_compute_s = useful * p.kernel_s;
  if (p.N > 1) {
    p.block_gbps = comm::interpolate_gbps(p.bandwidth, p.block_bytes);
    p.beta = p.compute_flops / (p.block_gbps * 1e9);
    p.predicted_step_comm_s = p.block_bytes / (p.block_gbps * 1e9);
    p.predicted_comm_ratio = p.beta / p.step_intensity;  // = predicted step comm / step compute
  }
  // ... against the real ring: the step's compute inside the ring, and one block's transfer
  // between neighbours timed alone at its exact size, one message in flight as in a ring step.
  measure_ring<T>(comm, c, plan, p);
  if (p.N > 1 && p.block_bytes > 0) {
    const comm::BandwidthSample one = comm::ring_transfer(comm, static_cast<std::size_t>(p.block_bytes), 1, c.bw);
    p.measured_step_comm_s = one.time_s;
    p.measured_comm_ratio = p.measured_step_compute_s > 0 ? p.measured_step_comm_s / p.measured_step_compute_s : 0;
  }
  // The strategies, timed; and what the cost model predicts with this machine's figures.
  p.strategies = strategy_list(c, shape, p.N);
  double best = 0;
  for (std::size_t i = 0; i < p.strategies.size(); ++i) {
    StrategyProbe& x = p.strategies[i];
    if (!x.forbidden.empty()) continue;
    measure_strategy<T>(comm, c, shape, x);
    if (p.recommended < 0 || x.forward_s + x.backward_s < best) {
      p.recommended = static_cast<int>(i);
      best = x.forward_s + x.backward_s;
    }
  }
  if (!p.strategies.empty()) {
    core::CostInputs in;
    in.S = shape.S;
    in.N = p.N;
    in.H = shape.H;
    in.HKV = shape.HKV;
    in.D = shape.D;
    in.B = shape.B;
    in.bytes = elem;
    in.flops = p.compute_flops > 0 ? p.compute_flops : 1e9;
    in.bandwidth = p.N > 1 && p.block_gbps > 0 ? p.block_gbps * 1e9 : 1e9;
    in.causal = c.causal;
    const std::vector<core::StrategyEstimate> est = core::estimate_strategies(in);
    // The prediction among the strategies that were run.
    const core::StrategyEstimate* pick = nullptr;
    for (const core::StrategyEstimate& e : est) {
      if (!e.impossible.empty()) continue;
      bool measured = false;
      for (const StrategyProbe& x : p.strategies)
        measured = measured || (x.forbidden.empty() && x.strategy == e.strategy && x.ulysses_degree == e.U);
      if (measured && (!pick || e.predicted_s < pick->predicted_s)) pick = &e;
    }
    if (pick) {
      p.plan_recommended = pick->strategy;
      p.plan_recommended_degree = static_cast<int>(pick->U);
    }
  }
  return p;
}

}  // namespace

Probe run_probe(comm::Comm& comm, const ProbeConfig& c) {
  // Every rank validates its options; the ranks agree on the verdict before any message.
  AttentionPlan plan;
  core::Shape shape;
  agreed(comm, [&] {
    if (c.bw.iters < 1) throw InputError(fmt::format("--iters: {} is not >= 1 (expected a number of repetitions >= 1)", c.bw.iters));
    if (!(c.budget_s > 0))
      throw InputError(fmt::format("--budget: {} is not a positive time (expected seconds > 0)", c.budget_s));
    core::Shape s{c.batch.value_or(kDefaultBatch), c.seq.value_or(kDefaultSeq), c.heads.value_or(kDefaultHeads), 0,
                  c.head_dim.value_or(kDefaultHeadDim)};
    s.HKV = c.kv_heads.value_or(s.H);
    plan = plan_for(c, s, comm.size(), "ring", 0);
    shape = s;
    bool usp = false;
    for (const std::string& name : c.strategies) usp = usp || parse_strategy(name, probe_names()) == StrategyKind::usp;
    if (c.ulysses_degree && *c.ulysses_degree < 1)
      throw InputError(fmt::format("--ulysses-degree: {} is not >= 1 (expected a group size U >= 1)", *c.ulysses_degree));
    if (c.ulysses_degree && !usp) throw InputError("--ulysses-degree: only applies when --strategies names usp");
    // A U the user chose is an option, as run's is: one that does not fit these ranks and heads is
    // refused before anything is measured.
    if (c.ulysses_degree) plan_for(c, s, comm.size(), "usp", *c.ulysses_degree);
  });
  // Every rank measures the same thing: the ranks agree on every option before the first message
  // whose size depends on them (ranks that differ would wait for each other's messages forever).
  std::vector<PlanField> fields = plan_fields(plan, options_for(c, shape, "ring", 0), probe_names());
  const std::vector<PlanField> own = {
      {"--min-bytes", std::to_string(c.bw.min_bytes)},
      {"--max-bytes", std::to_string(c.bw.max_bytes)},
      {"--iters", std::to_string(c.bw.iters)},
      {"--budget", fmt::format("{}", c.budget_s)},
      {"--json", c.json ? "on" : "off"},
      {"--strategies", fmt::format("{}", fmt::join(c.strategies, ","))},
      {"--ulysses-degree", c.ulysses_degree ? std::to_string(*c.ulysses_degree) : "(every U)"}};
  fields.insert(fields.end(), own.begin(), own.end());
  agree_on_plan(comm, fields);
  comm.set_timeout(plan.timeout_s);  // the watchdog of a run of this shape: no wait is longer than that
  return core::with_storage(plan.dtype, [&]<class T>() { return probe_typed<T>(comm, c, plan); });
}

io::Json probe_json(const ProbeConfig& c, const Probe& p) {
  const bool comms = p.N > 1;
  io::Json j = io::Json::object();
  io::Json cfg = io::Json::object();
  cfg["ranks"] = p.N;
  cfg["seq"] = static_cast<std::int64_t>(p.shape.S);
  cfg["batch"] = static_cast<std::int64_t>(p.shape.B);
  cfg["heads"] = static_cast<std::int64_t>(p.shape.H);
  cfg["kv_heads"] = static_cast<std::int64_t>(p.shape.HKV);
  cfg["head_dim"] = static_cast<std::int64_t>(p.shape.D);
  cfg["dtype"] = core::dtype_name(p.dtype);
  cfg["precision"] = precision_name(p.precision);
  cfg["causal"] = c.causal;
  cfg["layout"] = p.layout;
  cfg["min_bytes"] = c.bw.min_bytes;
  cfg["max_bytes"] = c.bw.max_bytes;
  cfg["iters"] = c.bw.iters;
  if (!c.strategies.empty()) {
    io::Json names = io::Json::array();
    for (const std::string& n : c.strategies) names.push_back(n);
    cfg["strategies"] = names;
  }
  j["config"] = cfg;
  io::Json bw = io::Json::array();
  for (const comm::BandwidthSample& b : p.bandwidth) {
    io::Json x = io::Json::object();
    x["bytes"] = b.bytes;
    x["time_s"] = b.time_s;
    x["gbps"] = b.gbps;
    x["window"] = b.window;
    x["iters"] = b.iters;
    x["wrong"] = b.wrong;
    bw.push_back(x);
  }
  j["bandwidth"] = bw;
  j["compute_flops"] = p.compute_flops;
  j["block_bytes"] = p.block_bytes;
  j["block_gbps"] = comms ? io::Json(p.block_gbps) : io::Json();
  j["beta"] = comms ? io::Json(p.beta) : io::Json();
  j["step_intensity"] = p.step_intensity;
  j["predicted_step_compute_s"] = p.predicted_step_compute_s;
  j["predicted_step_comm_s"] = p.predicted_step_comm_s;
  j["predicted_comm_ratio"] = p.predicted_comm_ratio;
  j["predicted_verdict"] = core::verdict_text(core::verdict_for(p.predicted_comm_ratio, comms));
  j["ring_forward_s"] = p.ring_forward_s;
  j["measured_step_compute_s"] = p.measured_step_compute_s;
  j["measured_step_comm_s"] = p.measured_step_comm_s;
  j["measured_comm_ratio"] = p.measured_comm_ratio;
  j["exposed_wait_ratio"] = p.exposed_wait_ratio;
  j["verdict"] = core::verdict_text(core::verdict_for(p.measured_comm_ratio, comms));
  if (c.strategies.empty()) return j;
  io::Json st = io::Json::array();
  for (const StrategyProbe& x : p.strategies) {
    io::Json o = io::Json::object();
    o["strategy"] = x.strategy;
    o["ulysses_degree"] = x.ulysses_degree;
    if (!x.forbidden.empty()) {
      o["run"] = false;
      o["reason"] = x.forbidden;
    } else {
      o["run"] = true;
      o["forward_s"] = x.forward_s;
      o["backward_s"] = x.backward_s;
      o["recv_bytes"] = x.recv_bytes;
      o["exposed_wait_s"] = x.exposed_wait_s;
      o["a2a_wait_s"] = x.a2a_wait_s;
      o["iters"] = x.iters;
    }
    st.push_back(o);
  }
  j["strategies"] = st;
  const bool any = p.recommended >= 0;
  j["recommended"] = any ? io::Json(p.strategies[p.recommended].strategy) : io::Json();
  j["recommended_ulysses_degree"] = any ? io::Json(p.strategies[p.recommended].ulysses_degree) : io::Json();
  j["plan_recommended"] = p.plan_recommended.empty() ? io::Json() : io::Json(p.plan_recommended);
  j["plan_recommended_ulysses_degree"] = p.plan_recommended.empty() ? io::Json() : io::Json(p.plan_recommended_degree);
  return j;
}


}  // namespace ringattn::runtime
