#include "ringattn/runtime/lab.hpp"

#include "ringattn/runtime/common.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <tuple>

#include "ringattn/core/errors.hpp"
#include "ringattn/core/ledger.hpp"
#include "ringattn/core/packed.hpp"
#include "ringattn/io/json.hpp"
#include "ringattn/io/npy.hpp"
#include "ringattn/runtime/job.hpp"
#include "ringattn/runtime/layer.hpp"
#include "ringattn/runtime/ring_attention.hpp"

namespace ringattn::runtime {

namespace {

using core::Shape;

// The lab prints every value, so it takes small examples only.
constexpr Index kMaxSeq = 64, kMaxRowValues = 64;  // S, and B*H*D per position
// The seed's tensors are O(1) and every output sums at most five terms: a few ulps of f64 at
// most. User inputs may carry large logits, where exp amplifies score rounding: `run`'s f64 bound.
constexpr double kSeedTolerance = 1e-14;

std::string join(std::span<const Index> v, const char* sep = ",") {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

LabInputs read_inputs(const std::string& dir) {
  auto path = [&](const char* name) { return path_in(dir, name); };
  const char* names[] = {"q.npy", "k.npy", "v.npy", "dout.npy"};
  io::NpyHeader h[4];
  for (int t = 0; t < 4; ++t) {
    h[t] = io::read_npy_header(path(names[t]));
    if (h[t].shape.size() != 4)
      throw InputError(fmt::format("{}: has shape {} (expected 4 dimensions: [B, S, heads, D])", path(names[t]),
                                   shape_str(h[t].shape)));
  }
  const auto& q = h[0].shape;
  LabInputs in;
  in.shape = Shape{q[0], q[1], q[2], h[1].shape[2], q[3]};
  const std::vector<Index> kv = {q[0], q[1], in.shape.HKV, q[3]};
  for (int t = 1; t < 4; ++t) {
    const std::vector<Index>& want = t == 3 ? q : kv;
    if (h[t].shape != want)
      throw InputError(fmt::format("{}: shape {} does not match q.npy {} (expected {})", path(names[t]),
                                   shape_str(h[t].shape), shape_str(q), shape_str(want)));
  }
  in.shape.validate();
  std::vector<double>* dst[] = {&in.q, &in.k, &in.v, &in.dout};
  for (int t = 0; t < 4; ++t) {
    *dst[t] = io::read_npy<double>(path(names[t]), h[t]);  // f4 widens to f64 exactly
    for (double x : *dst[t])
      if (!std::isfinite(x))
        throw InputError(fmt::format("{}: non-finite value {} (expected finite inputs)", path(names[t]), x));
  }
  return in;
}

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
            LabRow r{b, g * G + t, pos[i], {m[row], l[row]}};
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

// Events travel as doubles: [kind, rank, step, peer, elems, dropped, rows, width, rows x (b, head, pos, x...)].
void serialize(const LabEvent& e, std::vector<double>& out) {
  const std::size_t width = e.rows.empty() ? 0 : e.rows.front().x.size();
  out.insert(out.end(), {double(e.kind), double(e.rank), double(e.step), double(e.peer), double(e.elems),
                         double(e.dropped), double(e.rows.size()), double(width)});
  for (const LabRow& r : e.rows) {
    out.insert(out.end(), {double(r.b), double(r.head), double(r.pos)});
    out.insert(out.end(), r.x.begin(), r.x.end());
  }
}

std::vector<LabEvent> deserialize(const std::vector<double>& in) {
  std::vector<LabEvent> events;
  std::size_t p = 0;
  while (p < in.size()) {
    LabEvent e;
    e.kind = static_cast<LabEventKind>(int(in[p]));
    e.rank = int(in[p + 1]);
    e.step = int(in[p + 2]);
    e.peer = int(in[p + 3]);
    e.elems = Index(in[p + 4]);
    e.dropped = in[p + 5] != 0;
    const std::size_t rows = std::size_t(in[p + 6]), width = std::size_t(in[p + 7]);
    p += 8;
    for (std::size_t k = 0; k < rows; ++k, p += 3 + width)
      e.rows.push_back(LabRow{Index(in[p]), Index(in[p + 1]), Index(in[p + 2]),
                              {in.begin() + p + 3, in.begin() + p + 3 + width}});
    events.push_back(std::move(e));
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

constexpr double kTimeout = 60;  // watchdog on every wait: the lab's messages are tiny
const core::Tiling kTiling{};

// The report's config carries every key `run` writes, with the lab's values.
io::Json config_json(const LabConfig& c, const LabResult& res, int N) {
  JobConfig run;
  run.causal = res.mask.causal();
  run.inputs = c.inputs;
  run.report = c.report;
  run.check = true;
  run.timeout = kTimeout;
  run.tiling = kTiling;
  run.traffic = traffic_name(res.traffic);
  io::Json j = run_config_json(run, res.in.shape, core::DType::f64, res.mask, res.layout, res.scale, N);
  j["command"] = "lab";
  j["layer"] = res.layer.has_value();
  if (res.layer) j["model_dim"] = static_cast<std::int64_t>(res.layer->M);
  return j;
}

// `lab --layer`: the seed's shape with a model dimension M = 2. X takes the seed's q values and
// dY = G/5 takes dout's place; the weights are small fixed matrices. q, k, v and dout of the
// walkthrough become X Wq, X Wk, X Wv and dY Wo^T (row-vector convention: [1, M] x [M, H*D]).
LabLayer seed_layer(LabInputs& in) {
  const Shape& s = in.shape;
  LabLayer L;
  L.M = 2;
  const Index M = L.M, HD = s.H * s.D, KD = s.HKV * s.D, rows = s.B * s.S;
  L.in.x = in.q;
  L.in.dy = in.dout;
  L.in.wq = {0.8, -0.2, 0.3, 0.9};
  L.in.wk = {0.5, 0.4, -0.6, 0.7};
  L.in.wv = {1.0, 0.2, -0.3, 0.8};
  L.in.wo = {0.6, -0.4, 0.5, 0.9};
  auto times = [&](const std::vector<double>& a, Index ac, const std::vector<double>& w, Index wc, bool w_t) {
    std::vector<double> out(rows * wc, 0.0);  // a [rows, ac] x (w [ac, wc], or w^T with w [wc, ac])
    for (Index r = 0; r < rows; ++r)
      for (Index j = 0; j < wc; ++j)
        for (Index m = 0; m < ac; ++m) out[r * wc + j] += a[r * ac + m] * (w_t ? w[j * ac + m] : w[m * wc + j]);
    return out;
  };
  in.q = times(L.in.x, M, L.in.wq, HD, false);
  in.k = times(L.in.x, M, L.in.wk, KD, false);
  in.v = times(L.in.x, M, L.in.wv, KD, false);
  in.dout = times(L.in.dy, M, L.in.wo, HD, true);
  in.g.clear();  // dout is derived now, not G / 5
  return L;
}

}  // namespace

LabInputs seed_inputs() {
  // Small, distinct values so that every block's exp mass differs and every output is visibly
  // different from any single block's softmax.
  LabInputs in;
  in.shape = Shape{1, 5, 1, 1, 2};
  in.q = {0.9, -0.3, 0.2, 0.8, -0.5, 0.4, 0.7, 0.6, -0.1, -0.9};
  in.k = {0.5, 0.1, -0.4, 0.7, 0.3, -0.6, 0.8, 0.2, -0.2, -0.5};
  in.v = {1.0, 0.0, 0.0, 1.0, 0.5, -0.5, -1.0, 0.5, 0.2, 0.8};
  in.g = {1.0, -0.5, 0.3, 0.8, -0.7, 0.2, 0.4, -1.0, 0.6, 0.1};
  // The seeds' global mean: every query carries the same weight, dout = G / (B S).
  for (double x : in.g) in.dout.push_back(x / double(in.shape.B * in.shape.S));
  return in;
}

LabResult run_lab(const comm::Comm& comm, const LabConfig& cfg) {
  const int N = comm.size(), rank = comm.rank();
  LabResult res;
  agreed(comm, [&] {
    if (cfg.layer && !cfg.inputs.empty())
      throw InputError("--inputs: not with --layer (the lab's layer uses its fixed X, weights and dY)");
    res.in = cfg.inputs.empty() ? seed_inputs() : read_inputs(cfg.inputs);
    if (cfg.layer) res.layer = seed_layer(res.in);
    const Shape& s = res.in.shape;
    if (s.S > kMaxSeq || s.B * s.H * s.D > kMaxRowValues)
      throw InputError(fmt::format("lab prints every value: {} is too large (expected S <= {} and B*H*D <= {})",
                                   s.str(), kMaxSeq, kMaxRowValues));
    const std::vector<Index> part = cfg.partition.empty() ? std::vector<Index>{s.S / 2, s.S - s.S / 2} : cfg.partition;
    if (static_cast<int>(part.size()) != N)
      throw InputError(fmt::format("lab: the partition {} has {} entries but the job has N={} ranks (expected "
                                   "mpirun -np {}, or --partition with one size per rank)",
                                   join(part), part.size(), N, part.size()));
    Index sum = 0;
    for (Index n : part) sum += n;
    res.layout = core::Layout::partitioned(part);  // rejects negative sizes
    if (sum != s.S)
      throw InputError(fmt::format("--partition: sizes {} sum to {} but S is {} (expected sum == S)", join(part), sum,
                                   s.S));
  });
  const Shape& s = res.in.shape;
  res.mask = core::Mask::make(s.S, cfg.causal, 0, {});
  res.scale = 1.0 / std::sqrt(double(s.D));
  res.traffic = cfg.skip_empty ? core::Traffic::skip_empty_grads : core::Traffic::full;
  res.tolerance = cfg.inputs.empty() ? kSeedTolerance : check_tolerance(core::DType::f64);

  // The ring, with every event recorded on the rank that performs it.
  const Index qi = s.H * s.D, ki = s.HKV * s.D, L = res.layout.size(rank);
  RingSetup setup{.shape = s,
                  .layout = &res.layout,
                  .mask = &res.mask,
                  .scale = res.scale,
                  .tiling = kTiling,
                  .timeout_s = kTimeout,
                  .traffic = res.traffic,
                  .drop_grad_step = cfg.drop_grad_step};
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
    ring.load(lq.data(), lk.data(), lv.data(), ld.data());
    comm.barrier();
    pf = ring.forward();
    pb = ring.backward();
    ring.outputs(o.data(), lse.data(), dq.data(), dk.data(), dv.data());
    ledger = ring.ledger();
    resident = ring.resident_bytes();
  } else {
    LabLayer& ly = *res.layer;
    const Index M = ly.M;
    Layer<double> layer(comm, LayerSetup{.ring = setup, .M = M, .rope = std::nullopt});
    layer.set_observer(&rec);
    const auto lx = local_slice(ly.in.x, s.B, M, res.layout, rank), ldy = local_slice(ly.in.dy, s.B, M, res.layout, rank);
    layer.load(lx.data(), ly.in.wq.data(), ly.in.wk.data(), ly.in.wv.data(), ly.in.wo.data(), ldy.data());
    comm.barrier();
    pf = layer.forward().ring;
    const LayerStats lb = layer.backward();
    pb = lb.ring;
    layer.ring().outputs(o.data(), lse.data(), dq.data(), dk.data(), dv.data());
    ledger = layer.ring().ledger();
    resident = layer.ring().resident_bytes();
    allreduce_send = lb.dwo.send_elems + lb.dwqkv.send_elems;
    allreduce_recv = lb.dwo.recv_elems + lb.dwqkv.recv_elems;
    ly.y = gather_positions(comm, std::vector<double>(layer.y().begin(), layer.y().end()), s.B, M, res.layout);
    ly.dx = gather_positions(comm, std::vector<double>(layer.dx().begin(), layer.dx().end()), s.B, M, res.layout);
    const std::span<const double> dw[4] = {layer.dwq(), layer.dwk(), layer.dwv(), layer.dwo()};
    std::vector<double> mine;
    for (int w = 0; w < 4; ++w) {
      ly.dw[w].assign(dw[w].begin(), dw[w].end());
      mine.insert(mine.end(), dw[w].begin(), dw[w].end());
    }
    // The sums must be the same bits on every rank (a fixed-order reduction, not an average).
    const auto every = all_gather(comm, mine);
    ly.same_bits_on_every_rank = true;
    for (const auto& theirs : every)
      ly.same_bits_on_every_rank = ly.same_bits_on_every_rank && theirs.size() == mine.size() &&
                                   std::memcmp(theirs.data(), every[0].data(), mine.size() * sizeof(double)) == 0;
  }

  // Outputs, events and per-rank figures to every rank.
  res.o = gather_positions(comm, o, s.B, qi, res.layout);
  res.lse = gather_positions(comm, lse, s.B * s.H, 1, res.layout);
  res.dq = gather_positions(comm, dq, s.B, qi, res.layout);
  res.dk = gather_positions(comm, dk, s.B, ki, res.layout);
  res.dv = gather_positions(comm, dv, s.B, ki, res.layout);
  std::vector<double> mine;
  for (const LabEvent& e : rec.events) serialize(e, mine);
  for (const auto& part : all_gather(comm, mine)) {
    auto evs = deserialize(part);
    res.events.insert(res.events.end(), evs.begin(), evs.end());
  }
  order_events(res.events);

  core::Work work = pf.work;
  work += pb.work;
  io::RankReport mine_report{rank,   L,    ledger, pf.total_s, pb.total_s, pf.compute_s + pb.compute_s,
                             pf.wait_s + pb.wait_s, work, resident, peak_rss_bytes()};
  mine_report.allreduce_send_elems = allreduce_send;
  mine_report.allreduce_recv_elems = allreduce_recv;
  const auto all = all_gather(comm, io::to_row(mine_report));

  // The dense float64 reference, on every rank (five positions: nothing to save by splitting it).
  res.ref = core::reference_attention(s, res.mask, res.scale, res.in.q, res.in.k, res.in.v, res.in.dout);
  res.diff = LabDiffs{max_abs_diff(res.o, res.ref.o), max_abs_diff(res.lse, res.ref.lse),
                      max_abs_diff(res.dq, res.ref.dq), max_abs_diff(res.dk, res.ref.dk),
                      max_abs_diff(res.dv, res.ref.dv)};
  for (std::size_t n = 0; n < res.o.size(); ++n) res.loss += res.in.dout[n] * res.o[n];

  io::Report& rep = res.report;
  rep.config = config_json(cfg, res, N);
  rep.loss = res.loss;
  rep.elem_size = sizeof(double);
  io::CheckReport ck;
  ck.tolerance = res.tolerance;
  ck.o = core::max_rel_error(res.o, res.ref.o);
  ck.lse = core::max_rel_error(res.lse, res.ref.lse);
  ck.dq = core::max_rel_error(res.dq, res.ref.dq);
  ck.dk = core::max_rel_error(res.dk, res.ref.dk);
  ck.dv = core::max_rel_error(res.dv, res.ref.dv);
  ck.passed = ck.o <= ck.tolerance && ck.lse <= ck.tolerance && ck.dq <= ck.tolerance && ck.dk <= ck.tolerance &&
              ck.dv <= ck.tolerance;  // NaN never passes
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
    const io::RankReport rr = io::from_row(all[q].data(), q);
    rep.forward_s = std::max(rep.forward_s, rr.forward_s);
    rep.backward_s = std::max(rep.backward_s, rr.backward_s);
    rep.ranks.push_back(rr);
    res.full_send_bytes +=
        core::expected_ledger(res.layout, s, q, true, core::Traffic::full, res.mask).send_elems() * Index(sizeof(double));
  }
  return res;
}

namespace {

// Columns sized to their widest cell, as the seed's tables are read: left-aligned text.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) : rows_{std::move(header)} {}
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  void append(std::string cell) { rows_.back().push_back(std::move(cell)); }  // one more cell on the last row
  void print(const char* indent = "  ") const {
    std::vector<std::size_t> w(rows_.front().size(), 0);
    for (const auto& r : rows_)
      for (std::size_t c = 0; c < r.size(); ++c) w[c] = std::max(w[c], r[c].size());
    for (std::size_t k = 0; k < rows_.size(); ++k) {
      std::string line = indent;
      for (std::size_t c = 0; c < rows_[k].size(); ++c)
        line += fmt::format("{:<{}}", rows_[k][c], c + 1 < rows_[k].size() ? w[c] + 2 : 0);
      while (!line.empty() && line.back() == ' ') line.pop_back();
      fmt::print("{}\n", line);
      if (k == 0) {
        std::size_t total = 0;
        for (std::size_t c = 0; c < w.size(); ++c) total += w[c] + (c + 1 < w.size() ? 2 : 0);
        fmt::print("{}{}\n", indent, std::string(total, '-'));
      }
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string num(double x) { return fmt::format("{:+.6f}", x); }

std::string vec(const double* x, Index n) {
  std::string s = "[";
  for (Index d = 0; d < n; ++d) s += (d ? ", " : "") + num(x[d]);
  return s + "]";
}

std::string positions_of(const core::Layout& l, int r) {
  const auto pos = l.positions(r);
  return pos.empty() ? std::string("none") : join(pos);
}

std::string block_of(const core::Layout& l, int owner) {
  return fmt::format("K/V of r{} (keys {})", owner, positions_of(l, owner));
}

void print_summary(const LabResult& res) {
  const Shape& s = res.in.shape;
  const core::Layout& l = res.layout;
  const int N = l.ranks();
  const io::CheckReport& ck = *res.report.check;
  fmt::print("ringattn lab: the seed-000 walkthrough, {} float64 on N={} ranks, dout = {}\n", s.str(), N,
             res.layer ? fmt::format("dY Wo^T with dY = G/{}", s.B * s.S)
             : res.in.g.empty() ? std::string("dout.npy") : fmt::format("G/{}", s.B * s.S));
  std::string owners;
  for (int r = 0; r < N; ++r) owners += fmt::format("{}rank {}: positions {}", r ? "; " : "", r, positions_of(l, r));
  auto item = [](const char* what, const std::string& text) { fmt::print("  {:<24}{}\n", what, text); };
  item("partition", fmt::format("{} ({})", join(l.sizes()), owners));
  item("largest block", fmt::format("{} positions = {} elements of K and V", l.max_size(),
                                    2 * s.B * s.HKV * s.D * l.max_size()));
  item("visibility", fmt::format("{} on global positions (local indices only address storage)", res.mask.describe()));
  item("compute path", "ring over MPI: online-softmax forward, K/V replay backward, dK/dV returned to the owner");
  item("", res.traffic == core::Traffic::full
               ? "traffic full: every block is sent, the causally empty ones too (the seed's protocol)"
               : "traffic skip-empty: every K/V block is sent, all-zero dK/dV contributions are not");
  item("output vs reference", fmt::format("max |O - O_ref| {:.2e}   max |LSE - LSE_ref| {:.2e}", res.diff.o,
                                          res.diff.lse));
  item("gradients vs reference", fmt::format("max |dQ - ref| {:.2e}   max |dK - ref| {:.2e}   max |dV - ref| {:.2e}",
                                             res.diff.dq, res.diff.dk, res.diff.dv));
  item("loss / reference loss", fmt::format("{:.17g} / {:.17g} (sum dout . O)", res.loss, res.ref.loss));
  if (res.layer) {
    const LabLayer& ly = *res.layer;
    item("layer", fmt::format("M={}: q,k,v = X Wq, X Wk, X Wv; Y = O Wo; dout = dY Wo^T; weight gradients summed "
                              "over ranks in rank order", ly.M));
    item("layer vs reference", fmt::format("max rel err y {:.2e} dx {:.2e} dWq {:.2e} dWk {:.2e} dWv {:.2e} dWo {:.2e}",
                                           ly.err[0], ly.err[1], ly.err[2], ly.err[3], ly.err[4], ly.err[5]));
    item("", fmt::format("summed weight gradients bitwise identical on every rank: {}",
                         ly.same_bits_on_every_rank ? "yes" : "NO"));
  }
  double worst = std::max({ck.o, ck.lse, ck.dq, ck.dk, ck.dv});
  if (res.layer)
    for (double e : res.layer->err) worst = std::max(worst, e);
  item("check", fmt::format("max relative error {:.2e} (tolerance {:.0e}): {}", worst, ck.tolerance,
                            ck.passed ? "PASSED" : "FAILED"));
}

// Label of a row: the position, with batch and head when there is more than one.
std::string row_label(const Shape& s, char kind, const LabRow& r, Index heads) {
  std::string lab;
  if (s.B > 1) lab += fmt::format("b{} ", r.b);
  if (heads > 1) lab += fmt::format("h{} ", r.head);
  return lab + fmt::format("{}{}", kind, r.pos);
}

void print_inputs(const LabResult& res) {
  const Shape& s = res.in.shape;
  const Index qi = s.H * s.D, ki = s.HKV * s.D;
  const bool g = !res.in.g.empty();
  fmt::print("\ninputs (global positions; every value the reference recomputes from){}\n",
             res.layer ? std::string(" of the attention: q, k, v = X Wq, X Wk, X Wv and dout = dY Wo^T")
             : g       ? fmt::format(", dout = G/{}", s.B * s.S)
                       : std::string());
  std::vector<std::string> head = {"position", "rank", "q", "k", "v"};
  if (g) head.push_back("G");
  head.push_back("dout");
  TextTable t(head);
  for (Index b = 0; b < s.B; ++b)
    for (Index p = 0; p < s.S; ++p) {
      const Index qo = (b * s.S + p) * qi, ko = (b * s.S + p) * ki;
      std::vector<std::string> row = {s.B > 1 ? fmt::format("b{} {}", b, p) : std::to_string(p),
                                      fmt::format("r{}", res.layout.owner(p)), vec(&res.in.q[qo], qi),
                                      vec(&res.in.k[ko], ki), vec(&res.in.v[ko], ki)};
      if (g) row.push_back(vec(&res.in.g[qo], qi));
      row.push_back(vec(&res.in.dout[qo], qi));
      t.row(row);
    }
  t.print();
}

void print_events(const LabResult& res) {
  const Shape& s = res.in.shape;
  const core::Layout& l = res.layout;
  const Index D = s.D;
  fmt::print("\nevents (in step order; each on the rank that performed it; forward rows show the state after "
             "the block)\n");
  TextTable t({"#", "rank", "pass", "step", "event", "object", "row", "visible keys / target", "running max m / dK",
               "exp-sum l", "prefix output a/l / dV"});
  int n = 0;
  for (const LabEvent& e : res.events) {
    const std::vector<std::string> lead = {std::to_string(++n), fmt::format("r{}", e.rank),
                                           e.kind == LabEventKind::forward_block ? "fwd" : "bwd",
                                           std::to_string(e.step)};
    auto line = [&](bool first, std::vector<std::string> rest) {
      std::vector<std::string> row = first ? lead : std::vector<std::string>(lead.size());
      row.insert(row.end(), rest.begin(), rest.end());
      t.row(row);
    };
    switch (e.kind) {
      case LabEventKind::forward_block: {
        if (e.rows.empty()) line(true, {"attend block", block_of(l, e.peer), "(no query rows)"});
        for (std::size_t k = 0; k < e.rows.size(); ++k) {
          const LabRow& r = e.rows[k];
          std::vector<Index> vis;
          for (Index j : l.positions(e.peer))
            if (res.mask.visible(r.pos, j)) vis.push_back(j);
          const double m = r.x[0], lsum = r.x[1];
          std::vector<double> prefix(D, 0.0);  // a / l, once some key has been seen
          if (lsum > 0)
            for (Index d = 0; d < D; ++d) prefix[d] = r.x[2 + d] / lsum;
          line(k == 0, {k == 0 ? "attend block" : "", k == 0 ? block_of(l, e.peer) : "",
                        row_label(s, 'q', r, s.H), vis.empty() ? "none: state kept" : "k" + join(vis, " k"),
                        num(m), num(lsum), lsum > 0 ? vec(prefix.data(), D) : "(no key yet)"});
        }
        break;
      }
      case LabEventKind::replay_block: {
        const auto qpos = l.positions(e.rank);
        if (e.rows.empty()) line(true, {"replay block", block_of(l, e.peer), "(no keys)"});
        for (std::size_t k = 0; k < e.rows.size(); ++k) {
          const LabRow& r = e.rows[k];
          std::vector<Index> seen;
          for (Index i : qpos)
            if (res.mask.visible(i, r.pos)) seen.push_back(i);
          line(k == 0, {k == 0 ? "replay block" : "", k == 0 ? block_of(l, e.peer) : "",
                        row_label(s, 'k', r, s.HKV), seen.empty() ? "seen by no query" : "seen by q" + join(seen, " q"),
                        vec(r.x.data(), D), "", vec(r.x.data() + D, D)});
        }
        break;
      }
      case LabEventKind::grad_sent:
        line(true, {"return dK/dV", fmt::format("contribution to r{}'s block", e.peer), "",
                    fmt::format("to r{}: {} elems = {} B", e.peer, e.elems, 8 * e.elems)});
        break;
      case LabEventKind::grad_received:
        line(true, {"receive dK/dV", fmt::format("contribution to r{}'s block", e.rank), "",
                    fmt::format("from r{}: {} elems = {} B, {}", e.peer, e.elems, 8 * e.elems,
                                e.dropped ? "DROPPED (test hook)" : "added")});
        break;
    }
  }
  t.print();
}

void print_final(const LabResult& res) {
  const Shape& s = res.in.shape;
  const Index qi = s.H * s.D, ki = s.HKV * s.D;
  fmt::print("\nfinal outputs and gradients per position, with the dense float64 reference\n");
  TextTable t({"position", "rank", "output O", "reference O", "dQ", "dK", "dV"});
  for (Index b = 0; b < s.B; ++b)
    for (Index p = 0; p < s.S; ++p) {
      const Index qo = (b * s.S + p) * qi, ko = (b * s.S + p) * ki;
      t.row({s.B > 1 ? fmt::format("b{} {}", b, p) : std::to_string(p), fmt::format("r{}", res.layout.owner(p)),
             vec(&res.o[qo], qi), vec(&res.ref.o[qo], qi), vec(&res.dq[qo], qi), vec(&res.dk[ko], ki),
             vec(&res.dv[ko], ki)});
    }
  t.print();
}

std::string matrix(const std::vector<double>& w, Index rows, Index cols) {
  std::string out;
  for (Index i = 0; i < rows; ++i) {
    if (i) out += ' ';
    out += vec(&w[i * cols], cols);
  }
  return out;
}

// --layer: the weights, the layer's outputs per position and the weight gradients: each rank's
// partial over its own positions, their sum as every rank holds it, and the reference.
void print_layer(const LabResult& res) {
  const LabLayer& ly = *res.layer;
  const Shape& s = res.in.shape;
  const Index M = ly.M, HD = s.H * s.D, KD = s.HKV * s.D;
  fmt::print("\nlayer weights (rows of each matrix; every rank holds them whole)\n");
  TextTable w({"Wq [M, H*D]", "Wk [M, HKV*D]", "Wv [M, HKV*D]", "Wo [H*D, M]"});
  w.row({matrix(ly.in.wq, M, HD), matrix(ly.in.wk, M, KD), matrix(ly.in.wv, M, KD), matrix(ly.in.wo, HD, M)});
  w.print();
  fmt::print("\nlayer per position: x and dY in, Y = O Wo and dX = dQ Wq^T + dK Wk^T + dV Wv^T out, with the dense "
             "float64 layer\n");
  TextTable t({"position", "rank", "x", "dY", "Y", "reference Y", "dX", "reference dX"});
  for (Index b = 0; b < s.B; ++b)
    for (Index p = 0; p < s.S; ++p) {
      const Index o = (b * s.S + p) * M;
      t.row({s.B > 1 ? fmt::format("b{} {}", b, p) : std::to_string(p), fmt::format("r{}", res.layout.owner(p)),
             vec(&ly.in.x[o], M), vec(&ly.in.dy[o], M), vec(&ly.y[o], M), vec(&ly.ref.y[o], M), vec(&ly.dx[o], M),
             vec(&ly.ref.dx[o], M)});
    }
  t.print();
  fmt::print("\nweight gradients: each rank's partial over its own positions, summed (not averaged: the ranks\n"
             "split one sequence) in rank order by the all-reduce, and the reference\n");
  const char* names[4] = {"dWq = X^T dQ", "dWk = X^T dK", "dWv = X^T dV", "dWo = O^T dY"};
  const std::vector<double>* ref[4] = {&ly.ref.dwq, &ly.ref.dwk, &ly.ref.dwv, &ly.ref.dwo};
  const Index rows[4] = {M, M, M, HD}, cols[4] = {HD, KD, KD, M};
  std::vector<std::string> head = {"gradient"};
  for (int q = 0; q < res.layout.ranks(); ++q) head.push_back(fmt::format("rank {} partial", q));
  head.insert(head.end(), {"sum (every rank)", "reference"});
  TextTable g(head);
  for (int k = 0; k < 4; ++k) {
    std::vector<std::string> row = {names[k]};
    for (const auto& part : ly.partial[k]) row.push_back(matrix(part, rows[k], cols[k]));
    row.push_back(matrix(ly.dw[k], rows[k], cols[k]));
    row.push_back(matrix(*ref[k], rows[k], cols[k]));
    g.row(row);
  }
  g.print();
}

void print_ledger(const LabResult& res) {
  fmt::print("\nledger per rank (elements that moved; 8 B each in float64)\n");
  std::vector<std::string> head = {"rank", "positions", "send fwd KV / replay KV / grad",
                                   "recv fwd KV / replay KV / grad", "send / recv B",
                                   "resident QKV / remote block / online state"};
  if (res.layer) head.push_back("all-reduce send / recv");
  TextTable t(head);
  Index sent = 0;
  for (const io::RankReport& r : res.report.ranks) {
    const core::Ledger& g = r.ledger;
    sent += 8 * g.send_elems();
    t.row({std::to_string(r.rank), positions_of(res.layout, r.rank),
           fmt::format("{} / {} / {}", g.fwd_kv_send_elems, g.replay_kv_send_elems, g.grad_send_elems),
           fmt::format("{} / {} / {}", g.fwd_kv_recv_elems, g.replay_kv_recv_elems, g.grad_recv_elems),
           fmt::format("{} / {}", 8 * g.send_elems(), 8 * g.recv_elems()),
           fmt::format("{} / {} / {}", g.resident_qkv_elems, g.remote_block_elems, g.online_state_elems)});
    if (res.layer) t.append(fmt::format("{} / {} elems", r.allreduce_send_elems, r.allreduce_recv_elems));
  }
  t.print();
  if (res.layer)
    fmt::print("  all-reduce: dWo and [dWq | dWk | dWv] as reduce-scatter (each segment summed in rank order) then\n"
               "  all-gather; its elements are not in send / recv B, which count the ring.\n");
  fmt::print("  resident Q/K/V, the temporary remote K/V block and m/l/a are counted apart; O, LSE, gradients,\n"
             "  the compute workspace and communication buffers come on top.\n");
  if (res.traffic == core::Traffic::skip_empty_grads)
    fmt::print("  --skip-empty: {} B sent in all instead of {} B under the full protocol: {} B saved by not "
               "returning all-zero dK/dV contributions\n",
               sent, res.full_send_bytes, res.full_send_bytes - sent);
}

io::Json numbers(const std::vector<double>& v) {
  io::Json a = io::Json::array();
  for (double x : v) a.push_back(x);
  return a;
}

// The `run` report; with --layer also a "layer" object: the inputs, the outputs, the errors.
io::Json report_json(const LabResult& res) {
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

}  // namespace

int lab_job(const comm::Comm& comm, const LabConfig& cfg) {
  if (!cfg.report.empty())
    agreed(comm, [&] {
      if (comm.rank() != 0) return;
      const auto parent = std::filesystem::path(cfg.report).parent_path();
      if (!parent.empty() && !std::filesystem::is_directory(parent))
        throw InputError(fmt::format("--report {}: directory {} does not exist", cfg.report, parent.string()));
    });
  const LabResult res = run_lab(comm, cfg);
  if (!cfg.report.empty())
    agreed_runtime(comm, [&] {
      if (comm.rank() == 0) io::write_text_atomically(cfg.report, report_json(res).dump(2) + "\n");
    });
  if (comm.rank() == 0) {
    print_summary(res);
    print_inputs(res);
    print_events(res);
    print_final(res);
    if (res.layer) print_layer(res);
    print_ledger(res);
  }
  return res.report.check->passed ? kExitOk : kExitCheckFailed;
}

}  // namespace ringattn::runtime
