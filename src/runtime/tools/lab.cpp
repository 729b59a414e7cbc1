#include "ringattn/runtime/lab.hpp"

#include "lab_detail.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <tuple>

#include "ringattn/core/errors.hpp"
#include "ringattn/core/ledger.hpp"
#include "ringattn/core/packed.hpp"
#include "ringattn/io/json.hpp"
#include "ringattn/io/npy.hpp"
#include "ringattn/runtime/agreement.hpp"
#include "ringattn/runtime/job_config.hpp"
#include "ringattn/runtime/layer.hpp"
#include "ringattn/runtime/paths.hpp"
#include "ringattn/runtime/ring_attention.hpp"
#include "ringattn/runtime/run_job.hpp"
#include "ringattn/runtime/staged_outputs.hpp"

namespace ringattn::runtime {

namespace {

using core::Shape;

// The lab prints every value, so it takes small examples only.
constexpr Index kMaxSeq = 64, kMaxRowValues = 64;  // S, and B*H*D per position
// The example's tensors are O(1) and every output sums at most five terms: a few ulps of f64 at
// most. User inputs may carry large logits, where exp amplifies score rounding: `run`'s f64 bound.
constexpr double kExampleTolerance = 1e-14;


// [outer, S, inner] global -> [outer, L, inner] at the positions of rank r.
std::vector<double> local_slice(const std::vector<double>& g, Index outer, Index inner, const core::Layout& l,
                                int r) {
  const Index L = l.size(r), S = l.seq();
  const auto pos = l.positions(r);
  std::vector<double> x(outer * L * inner);
  for (Index a = 0; a < outer; ++a)
    for (Index i = 0; i < L; ++i)
      std::copy_n(&g[(a * S + pos[i]) * inner], inner, &x[(a * L + i) * inner]);
  return x;
}

// The kernels keep the running max in log2 units for every accumulation type (log2 e is folded
// into the scale: m2 = max_j S_ij log2 e); the worked example shows m = max_j S_ij, the softmax's
// own natural units, so m = m2 ln 2. l and a need nothing: 2^(S log2 e - m2) = e^(S - m) term by term.
constexpr double kLn2 = 0.6931471805599453;

double natural_max(double m_log2) { return m_log2 * kLn2; }  // -inf (no key yet) stays -inf

// Records each event of this rank as a LabEvent, copying the state out of the packed layout.
class Recorder final : public RingObserver<double> {
 public:
  Recorder(const core::Layout& l, int rank, int drop_step) : layout_(l), rank_(rank), drop_step_(drop_step) {}

  void forward_block(int step, int owner, const core::Packing& pq, const double* m, const double* l,
                     const double* acc) override {
    LabEvent e = make(LabEventKind::forward_block, step, owner);
    const auto pos = layout_.positions(rank_);
    const Index G = pq.G, D = pq.D;
    for (Index b = 0; b < pq.B; ++b)
      for (Index g = 0; g < pq.HKV; ++g)
        for (Index i = 0; i < pq.L; ++i)
          for (Index t = 0; t < G; ++t) {
            const Index row = pq.row_group(b, g) + i * G + t;
            const double* a = acc + pq.q_group(b, g) + (i * G + t) * D;
            LabRow r{b, g * G + t, pos[i], {natural_max(m[row]), l[row]}};
            r.x.insert(r.x.end(), a, a + D);
            e.rows.push_back(std::move(r));
          }
    sort_rows(e);
    events.push_back(std::move(e));
  }

  void replay_block(int step, int owner, const core::Packing& pk, const double* dk, const double* dv) override {
    LabEvent e = make(LabEventKind::replay_block, step, owner);
    const auto pos = layout_.positions(owner);
    for (Index b = 0; b < pk.B; ++b)
      for (Index g = 0; g < pk.HKV; ++g)
        for (Index i = 0; i < pk.L; ++i) {
          const Index off = pk.kv_group(b, g) + i * pk.D;
          LabRow r{b, g, pos[i], {dk + off, dk + off + pk.D}};
          r.x.insert(r.x.end(), dv + off, dv + off + pk.D);
          e.rows.push_back(std::move(r));
        }
    sort_rows(e);
    events.push_back(std::move(e));
  }

  void grad_sent(int step, int to, Index elems) override {
    LabEvent e = make(LabEventKind::grad_sent, step, to);
    e.elems = elems;
    events.push_back(std::move(e));
  }

  void grad_received(int step, int from, Index elems) override {
    LabEvent e = make(LabEventKind::grad_received, step, from);
    e.elems = elems;
    e.dropped = step == drop_step_;
    events.push_back(std::move(e));
  }

  std::vector<LabEvent> events;

 private:
  LabEvent make(LabEventKind kind, int step, int peer) const {
    LabEvent e;
    e.kind = kind;
    e.rank = rank_;
    e.step = step;
    e.peer = peer;
    return e;
  }
  // Rows in reading order: batch, position, head.
  static void sort_rows(LabEvent& e) {
    std::stable_sort(e.rows.begin(), e.rows.end(), [](const LabRow& a, const LabRow& b) {
      return std::tie(a.b, a.pos, a.head) < std::tie(b.b, b.pos, b.head);
    });
  }
  const core::Layout& layout_;
  int rank_, drop_step_;
};

// Every rank's events on every rank: the fixed part of each event as one struct, its rows' values
// as one array of doubles (b, head, pos, x... per row).
struct EventHead {
  LabEventKind kind;
  int rank, step, peer;
  Index elems;
  bool dropped;
  Index rows, width;
};

std::vector<LabEvent> all_events(const comm::Group& g, const std::vector<LabEvent>& mine) {
  std::vector<EventHead> heads;
  std::vector<double> values;
  for (const LabEvent& e : mine) {
    const Index width = e.rows.empty() ? 0 : Index(e.rows.front().x.size());
    heads.push_back({e.kind, e.rank, e.step, e.peer, e.elems, e.dropped, Index(e.rows.size()), width});
    for (const LabRow& r : e.rows) {
      values.insert(values.end(), {double(r.b), double(r.head), double(r.pos)});
      values.insert(values.end(), r.x.begin(), r.x.end());
    }
  }
  const auto all_heads = g.all_gatherv(std::span<const EventHead>(heads));
  const auto all_values = g.all_gatherv(std::span<const double>(values));
  std::vector<LabEvent> events;
  for (std::size_t q = 0; q < all_heads.size(); ++q) {
    std::size_t at = 0;
    for (const EventHead& h : all_heads[q]) {
      LabEvent e{h.kind, h.rank, h.step, h.peer, h.elems, h.dropped, {}};
      const double* v = all_values[q].data();
      for (Index k = 0; k < h.rows; ++k, at += 3 + std::size_t(h.width))
        e.rows.push_back(LabRow{Index(v[at]), Index(v[at + 1]), Index(v[at + 2]),
                                {v + at + 3, v + at + 3 + h.width}});
      events.push_back(std::move(e));
    }
  }
  return events;
}

// Table order: the forward, then the backward; within a step each rank's own work (in rank
// order, each rank's events in the order they happened), then the receipts of that step.
void order_events(std::vector<LabEvent>& events) {
  auto key = [](const LabEvent& e) {
    const int pass = e.kind == LabEventKind::forward_block ? 0 : 1;
    const int phase = e.kind == LabEventKind::grad_received ? 1 : 0;
    return std::tuple{pass, e.step, phase, e.rank};
  };
  std::stable_sort(events.begin(), events.end(), [&](const LabEvent& a, const LabEvent& b) { return key(a) < key(b); });
}

double max_abs_diff(const std::vector<double>& x, const std::vector<double>& ref) {
  double d = 0;
  for (std::size_t n = 0; n < x.size(); ++n) {
    if (std::isnan(x[n]) || ((std::isinf(x[n]) || std::isinf(ref[n])) && x[n] != ref[n]))
      return std::numeric_limits<double>::infinity();
    if (std::isfinite(x[n])) d = std::max(d, std::abs(x[n] - ref[n]));
  }
  return d;
}

const char* traffic_name(core::Traffic t) {
  switch (t) {
    case core::Traffic::full: return "full";
    case core::Traffic::aware: return "aware";
    case core::Traffic::skip_empty_grads: return "skip-empty";
  }
  return "?";
}

constexpr double kTimeout = 60;  // the watchdog the command line sets: the lab's messages are tiny
const core::Tiling kTiling{};

// The report's config carries every key `run` writes, with the lab's values.
io::Json config_json(const LabConfig& c, const LabResult& res, int N) {
  JobConfig run;
  run.causal = res.mask.causal();
  run.inputs = c.inputs;
  run.report = c.report;
  run.check = true;
  run.timeout_s = kTimeout;
  run.tiling = kTiling;
  run.traffic = traffic_name(res.traffic);
  JobPlan plan;
  plan.shape = res.in.shape;
  plan.dtype = core::DType::f64;
  plan.layout = res.layout;
  plan.mask = res.mask;
  plan.scale = res.scale;
  io::Json j = runtime::config_json(run, plan, N);
  j["command"] = "lab";
  j["layer"] = res.layer.has_value();
  if (res.layer) j["model_dim"] = static_cast<std::int64_t>(res.layer->M);
  return j;
}

// A digest of the example's values: ranks that read different files of the same shape do not
// agree on it.
std::string values_digest(const LabInputs& in) {
  std::uint64_t h = kDigestSeed;
  for (const std::vector<double>* t : {&in.q, &in.k, &in.v, &in.dout})
    h = digest_bytes(t->data(), t->size() * sizeof(double), h);
  return fmt::format("{:016x}", h);
}

}  // namespace


LabResult run_lab(const comm::Comm& comm, const LabConfig& cfg) {
  const int N = comm.size(), rank = comm.rank();
  LabResult res;
  PlanOptions opts;
  AttentionPlan plan;
  agreed(comm, [&] {
    if (cfg.layer && !cfg.inputs.empty())
      throw InputError("--inputs: not with --layer (the lab's layer uses its fixed X, weights and dY)");
    res.in = cfg.inputs.empty() ? example_inputs() : detail::read_inputs(cfg.inputs);
    if (cfg.layer) res.layer = detail::example_layer(res.in);
    const Shape& s = res.in.shape;
    if (s.S > kMaxSeq || s.B * s.H * s.D > kMaxRowValues)
      throw InputError(fmt::format("lab prints every value: {} is too large (expected S <= {} and B*H*D <= {})",
                                   s.str(), kMaxSeq, kMaxRowValues));
    const std::vector<Index> part = cfg.partition.empty() ? std::vector<Index>{s.S / 2, s.S - s.S / 2} : cfg.partition;
    if (cfg.partition.empty() && N != 2)
      throw InputError(fmt::format("lab: the worked example has two owners ({}) but the job has N={} ranks "
                                   "(expected mpirun -np 2, or --partition with one size per rank)", join(part), N));
    // The example's plan, by the rules every job follows: f64, contiguous shards, the full
    // protocol unless --skip-empty.
    opts.shape = s;
    opts.dtype = "f64";
    opts.causal = cfg.causal;
    opts.layout = "contiguous";
    opts.partition = part;
    opts.traffic = cfg.skip_empty ? "skip-empty" : "full";
    opts.tiling = kTiling;
    opts.timeout_s = kTimeout;
    plan = make_attention_plan(opts, N, cli_names());
    res.layout = plan.layout;
    res.mask = plan.mask;
    res.scale = plan.scale;
    res.traffic = plan.traffic;
  });
  // Every rank runs the same example: the ranks agree on it before the ring's first message. The
  // lab's own options come first, so that a difference is named by the option that makes it.
  std::vector<PlanField> fields = {{"--inputs", cfg.inputs},
                                   {"the inputs' values (a digest)", values_digest(res.in)},
                                   {"--layer", cfg.layer ? "on" : "off"},
                                   {"--no-causal", cfg.causal ? "off" : "on"},
                                   {"--skip-empty", cfg.skip_empty ? "on" : "off"},
                                   {"--report", cfg.report},
                                   {"the test hooks", std::to_string(cfg.drop_grad_step)}};
  const std::vector<PlanField> plan_part = plan_fields(plan, opts, cli_names());
  fields.insert(fields.end(), plan_part.begin(), plan_part.end());
  agree_on_plan(comm, fields);
  const Shape& s = res.in.shape;
  res.tolerance = cfg.inputs.empty() ? kExampleTolerance : check_tolerance(core::DType::f64);

  // The ring, with every event recorded on the rank that performs it.
  const Index qi = s.H * s.D, ki = s.HKV * s.D, L = res.layout.size(rank);
  StrategySetup setup;
  setup.shape = s;
  setup.layout = &res.layout;
  setup.mask = &res.mask;
  setup.scale = res.scale;
  setup.tiling = kTiling;
  setup.traffic = res.traffic;
  setup.hooks.drop_grad_step = cfg.drop_grad_step;
  Recorder rec(res.layout, rank, cfg.drop_grad_step);
  const auto lq = local_slice(res.in.q, s.B, qi, res.layout, rank), lk = local_slice(res.in.k, s.B, ki, res.layout, rank),
             lv = local_slice(res.in.v, s.B, ki, res.layout, rank),
             ld = local_slice(res.in.dout, s.B, qi, res.layout, rank);
  std::vector<double> o(s.B * L * qi), lse(s.B * s.H * L), dq(s.B * L * qi), dk(s.B * L * ki), dv(s.B * L * ki);
  PassStats pf, pb;
  core::Ledger ledger;
  Index resident = 0;
  Index allreduce_send = -1, allreduce_recv = -1;
  if (!res.layer) {
    RingAttention<double> ring(comm, setup);
    ring.set_observer(&rec);
    ring.load(lq.data(), lk.data(), lv.data());
    ring.load_dout(ld.data());
    comm.barrier();
    pf = ring.forward();
    pb = ring.backward();
    ring.outputs(o.data(), lse.data(), dq.data(), dk.data(), dv.data());
    ledger = ring.ledger();
    resident = ring.resident_bytes();
  } else {
    LabLayer& ly = *res.layer;
    const Index M = ly.M;
    Layer<double> layer(comm, LayerSetup{.attention = setup, .M = M, .rope = std::nullopt});
    layer.set_observer(&rec);
    const auto lx = local_slice(ly.in.x, s.B, M, res.layout, rank), ldy = local_slice(ly.in.dy, s.B, M, res.layout, rank);
    layer.load(lx.data(), ly.in.wq.data(), ly.in.wk.data(), ly.in.wv.data(), ly.in.wo.data(), ldy.data());
    comm.barrier();
    pf = layer.forward().attention;
    const LayerStats lb = layer.backward();
    pb = lb.attention;
    layer.attention_outputs(o.data(), lse.data(), dq.data(), dk.data(), dv.data());
    ledger = layer.attention().ledger();
    resident = layer.attention().resident_bytes();
    allreduce_send = lb.dwo.send_elems + lb.dwqkv.send_elems;
    allreduce_recv = lb.dwo.recv_elems + lb.dwqkv.recv_elems;
    ly.y = gather_positions(comm, std::vector<double>(layer.y().begin(), layer.y().end()), s.B, M, res.layout, -1);
    ly.dx = gather_positions(comm, std::vector<double>(layer.dx().begin(), layer.dx().end()), s.B, M, res.layout, -1);
    const std::span<const double> dw[4] = {layer.dwq(), layer.dwk(), layer.dwv(), layer.dwo()};
    std::vector<double> mine;
    for (int w = 0; w < 4; ++w) {
      ly.dw[w].assign(dw[w].begin(), dw[w].end());
      mine.insert(mine.end(), dw[w].begin(), dw[w].end());
    }
    // The sums must be the same bits on every rank (a fixed-order reduction, not an average).
    const auto every = comm.all_gatherv(std::span<const double>(mine));
    ly.same_bits_on_every_rank = true;
    for (const auto& theirs : every)
      ly.same_bits_on_every_rank = ly.same_bits_on_every_rank && theirs.size() == mine.size() &&
                                   std::memcmp(theirs.data(), every[0].data(), mine.size() * sizeof(double)) == 0;
  }

  // Outputs, events and per-rank figures to every rank.
  res.o = gather_positions(comm, o, s.B, qi, res.layout, -1);
  res.lse = gather_positions(comm, lse, s.B * s.H, 1, res.layout, -1);
  res.dq = gather_positions(comm, dq, s.B, qi, res.layout, -1);
  res.dk = gather_positions(comm, dk, s.B, ki, res.layout, -1);
  res.dv = gather_positions(comm, dv, s.B, ki, res.layout, -1);
  res.events = all_events(comm, rec.events);
  order_events(res.events);

  core::Work work = pf.work;
  work += pb.work;
  io::RankRow mine_row{rank,   L,    ledger, pf.total_s, pb.total_s, pf.compute_s + pb.compute_s,
                       pf.wait_s + pb.wait_s, work, resident, peak_rss_bytes()};
  const auto rows = comm.all_gather(mine_row);
  struct Allreduce {
    Index send, recv;
  };
  const auto allreduce_all = comm.all_gather(Allreduce{allreduce_send, allreduce_recv});

  // The dense float64 reference, on every rank (five positions: nothing to save by splitting it).
  res.ref = core::reference_attention(s, res.mask, res.scale, res.in.q, res.in.k, res.in.v, res.in.dout);
  res.diff = LabDiffs{max_abs_diff(res.o, res.ref.o), max_abs_diff(res.lse, res.ref.lse),
                      max_abs_diff(res.dq, res.ref.dq), max_abs_diff(res.dk, res.ref.dk),
                      max_abs_diff(res.dv, res.ref.dv)};
  for (std::size_t n = 0; n < res.o.size(); ++n) res.loss += res.in.dout[n] * res.o[n];

  io::Report& rep = res.report;
  rep.config = config_json(cfg, res, N);
  rep.loss = res.loss;
  io::CheckReport ck;
  ck.tolerance = res.tolerance;
  ck.errors = {{"o", core::max_rel_error(res.o, res.ref.o)},
               {"lse", core::max_rel_error(res.lse, res.ref.lse)},
               {"dq", core::max_rel_error(res.dq, res.ref.dq)},
               {"dk", core::max_rel_error(res.dk, res.ref.dk)},
               {"dv", core::max_rel_error(res.dv, res.ref.dv)}};
  ck.passed = true;
  for (const auto& [name, e] : ck.errors) ck.passed = ck.passed && e <= ck.tolerance;  // NaN never passes
  if (res.layer) {
    LabLayer& ly = *res.layer;
    ly.ref = core::reference_layer(s, ly.M, res.mask, res.scale, std::nullopt, ly.in);
    const std::vector<double>* got[6] = {&ly.y, &ly.dx, &ly.dw[0], &ly.dw[1], &ly.dw[2], &ly.dw[3]};
    const std::vector<double>* want[6] = {&ly.ref.y, &ly.ref.dx, &ly.ref.dwq, &ly.ref.dwk, &ly.ref.dwv, &ly.ref.dwo};
    for (int t = 0; t < 6; ++t) {
      ly.err[t] = core::max_rel_error(*got[t], *want[t]);
      ck.passed = ck.passed && ly.err[t] <= ck.tolerance;
    }
    ck.passed = ck.passed && ly.same_bits_on_every_rank;
    // Each rank's partials, for the table: X_r^T dQ_r, X_r^T dK_r, X_r^T dV_r and O_r^T dY_r over
    // its own positions (what it holds before the reduction).
    const Index M = ly.M, HD = s.H * s.D, KD = s.HKV * s.D;
    const std::vector<double>* left[4] = {&ly.in.x, &ly.in.x, &ly.in.x, &res.o};
    const std::vector<double>* right[4] = {&res.dq, &res.dk, &res.dv, &ly.in.dy};
    const Index lc[4] = {M, M, M, HD}, rc[4] = {HD, KD, KD, M};
    for (int w = 0; w < 4; ++w)
      for (int q = 0; q < N; ++q) {
        std::vector<double> part(lc[w] * rc[w], 0.0);
        for (Index b = 0; b < s.B; ++b)
          for (Index p : res.layout.positions(q))
            for (Index i = 0; i < lc[w]; ++i)
              for (Index j = 0; j < rc[w]; ++j)
                part[i * rc[w] + j] += (*left[w])[(b * s.S + p) * lc[w] + i] * (*right[w])[(b * s.S + p) * rc[w] + j];
        ly.partial[w].push_back(std::move(part));
      }
  }
  rep.check = ck;
  for (int q = 0; q < N; ++q) {
    const io::RankRow& rr = rows[q];
    rep.forward_s = std::max(rep.forward_s, rr.forward_s);
    rep.backward_s = std::max(rep.backward_s, rr.backward_s);
    rep.ranks.push_back(rr);
    if (res.layer) {
      io::Json x = io::Json::object();  // not ring traffic: send_bytes and recv_bytes leave it out
      x["allreduce_send_elems"] = allreduce_all[q].send;
      x["allreduce_recv_elems"] = allreduce_all[q].recv;
      x["allreduce_send_bytes"] = allreduce_all[q].send * Index(sizeof(double));
      x["allreduce_recv_bytes"] = allreduce_all[q].recv * Index(sizeof(double));
      rep.ledger_extras.push_back(x);
      res.allreduce_elems.emplace_back(allreduce_all[q].send, allreduce_all[q].recv);
    }
    res.full_send_bytes +=
        core::expected_ledger(res.layout, s, q, true, core::Traffic::full, res.mask).send_elems() * Index(sizeof(double));
  }
  return res;
}

namespace {

io::Json numbers(const std::vector<double>& v) {
  io::Json a = io::Json::array();
  for (double x : v) a.push_back(x);
  return a;
}

}  // namespace

io::Json lab_report_json(const LabResult& res) {
  io::Json j = io::to_json(res.report);
  if (!res.layer) return j;
  const LabLayer& ly = *res.layer;
  io::Json l = io::Json::object();
  l["model_dim"] = static_cast<std::int64_t>(ly.M);
  io::Json in = io::Json::object();
  in["x"] = numbers(ly.in.x);
  in["wq"] = numbers(ly.in.wq);
  in["wk"] = numbers(ly.in.wk);
  in["wv"] = numbers(ly.in.wv);
  in["wo"] = numbers(ly.in.wo);
  in["dy"] = numbers(ly.in.dy);
  l["inputs"] = in;
  const char* names[6] = {"y", "dx", "dwq", "dwk", "dwv", "dwo"};
  const std::vector<double>* got[6] = {&ly.y, &ly.dx, &ly.dw[0], &ly.dw[1], &ly.dw[2], &ly.dw[3]};
  io::Json out = io::Json::object(), err = io::Json::object();
  for (int t = 0; t < 6; ++t) {
    out[names[t]] = numbers(*got[t]);
    err[names[t]] = ly.err[t];
  }
  l["outputs"] = out;
  l["max_rel_err"] = err;
  l["same_bits_on_every_rank"] = ly.same_bits_on_every_rank;
  j["layer"] = l;
  return j;
}

LabResult lab_job(const comm::Comm& comm, const LabConfig& cfg) {
  StagedOutputs staged(comm, OutputPaths{"", cfg.report, "", {}, {}});  // --report checked before anything runs
  LabResult res = run_lab(comm, cfg);
  agreed_runtime(comm, [&] {
    if (comm.rank() == 0 && !cfg.report.empty()) staged.set_report(lab_report_json(res).dump(2) + "\n");
  });
  staged.commit();
  return res;
}


}  // namespace ringattn::runtime
