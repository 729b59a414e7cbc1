// `run --layer`: a whole attention layer through the harness.
#include <algorithm>
#include <cmath>
#include <optional>

#include "jobs.hpp"
#include "ringattn/core/layer_reference.hpp"
#include "ringattn/core/median.hpp"
#include "ringattn/runtime/agreement.hpp"
#include "ringattn/runtime/layer.hpp"

namespace ringattn::runtime {

namespace {

using core::median;

enum LayerFile { kX, kWq, kWk, kWv, kWo, kDy };

// One rank's layer figures, medians over the timed iterations; gathered to rank 0 as is.
struct LayerRow {
  double gemm_s = 0, rope_s = 0, ring_backward_s = 0, ring_wait_s = 0;
  double reduce[2][4] = {};  // dWo, dWqkv: send elems, recv elems, elapsed, exposed
  int hidden[2] = {0, 0};    // iterations in which the reduction was complete before it was waited for
  int dwo_by_end = 0;        // iterations in which dWo was done when the attention backward ended
};

template <class S>
class LayerJob final : public LayerJobBase {
 public:
  using A = core::accum_t<S>;

  LayerJob(const comm::Comm& comm, const JobConfig& c, const JobPlan& p) : comm_(comm), c_(c), p_(p) {
    agreed(comm, [&] { in_ = load_inputs<A>(p.inputs, p.layout, comm.rank()); });
    LayerSetup setup;
    setup.attention = strategy_setup(c, p);
    setup.M = p.model_dim;
    setup.rope = c.rope_theta;
    setup.backward = c.backward;
    setup.average_weight_grads = c.average_weight_grads;
    setup.rope_local_positions = c.rope_local_positions;
    layer_.emplace(comm, setup);
    layer_->load(in_[kX].data(), in_[kWq].data(), in_[kWk].data(), in_[kWv].data(), in_[kWo].data(),
                 in_[kDy].data());
  }

  IterationTimes iterate(bool timed) override {
    sf_ = layer_->forward();
    sb_ = c_.backward ? layer_->backward() : LayerStats{};
    if (timed) record();
    // compute: attention kernels, GEMMs and RoPE; wait: exposed transfers and exposed reductions
    return {sf_.total_s, sb_.total_s,
            sf_.attention.compute_s + sb_.attention.compute_s + sf_.gemm_s + sb_.gemm_s + sf_.rope_s + sb_.rope_s,
            sf_.attention.wait_s + sb_.attention.wait_s + sb_.dwo.exposed_s + sb_.dwqkv.exposed_s,
            sf_.attention.a2a_wait_s + sb_.attention.a2a_wait_s};
  }

  void record() {
    gemm_.push_back(sf_.gemm_s + sb_.gemm_s);
    rope_.push_back(sf_.rope_s + sb_.rope_s);
    ring_bwd_.push_back(sb_.attention.total_s);
    ring_wait_.push_back(sf_.attention.wait_s + sb_.attention.wait_s);
    if (c_.backward) {
      dwo_.push_back(sb_.dwo);
      dw_.push_back(sb_.dwqkv);
      dwo_by_end_ += sb_.dwo_done_by_attention_end ? 1 : 0;
    }
  }

  std::vector<OutputTensor> outputs() const override {
    const core::Shape& s = p_.shape;
    y_.assign(layer_->y().begin(), layer_->y().end());
    std::vector<OutputTensor> out = {output("y", {s.B, s.S, p_.model_dim}, 1, y_, true)};
    if (c_.backward) {
      dx_.assign(layer_->dx().begin(), layer_->dx().end());
      const std::span<const A> dw[4] = {layer_->dwq(), layer_->dwk(), layer_->dwv(), layer_->dwo()};
      const char* names[4] = {"dwq", "dwk", "dwv", "dwo"};
      out.push_back(output("dx", {s.B, s.S, p_.model_dim}, 1, dx_, true));
      for (int w = 0; w < 4; ++w) {
        dw_copy_[w].assign(dw[w].begin(), dw[w].end());
        out.push_back(output(names[w], p_.inputs.specs[kWq + w].shape, kWhole, dw_copy_[w], true));
      }
    }
    if (!p_.inputs.from_files())
      for (std::size_t f = 0; f < p_.inputs.specs.size(); ++f)
        out.push_back(output(p_.inputs.specs[f].name, p_.inputs.specs[f].shape, p_.inputs.specs[f].pos_axis, in_[f],
                             false));
    return out;
  }

  std::optional<double> local_loss() const override {
    if (p_.inputs.from_files() && !p_.inputs.headers[kDy]) return std::nullopt;
    double loss = 0;  // sum dY . Y, accumulated in double
    const auto y = layer_->y();
    for (std::size_t n = 0; n < y.size(); ++n) loss += double(in_[kDy][n]) * double(y[n]);
    return loss;
  }

  io::RankRow rank_row() const override {
    io::RankRow r;
    r.positions = layer_->local_size();
    r.ledger = layer_->attention().ledger();
    r.work = sf_.attention.work;
    r.work += sb_.attention.work;
    r.budget_bytes = layer_->attention().resident_bytes();
    r.peak_rss_bytes = peak_rss_bytes();
    return r;
  }

  std::vector<StepRecord> steps() const override {
    std::vector<StepRecord> all = sf_.attention.steps;
    all.insert(all.end(), sb_.attention.steps.begin(), sb_.attention.steps.end());
    return all;
  }

  std::vector<ReferenceTensor> reference() const override {
    core::LayerTensors g;
    std::vector<double>* dst[6] = {&g.x, &g.wq, &g.wk, &g.wv, &g.wo, &g.dy};
    for (int f = 0; f < 6; ++f) *dst[f] = global_input<A>(p_.inputs, p_.inputs.specs[f]);
    const core::LayerResult ref = core::reference_layer(p_.shape, p_.model_dim, p_.mask, p_.scale, c_.rope_theta, g,
                                                        c_.backward);
    std::vector<ReferenceTensor> out = {{"y", ref.y, 0}};
    if (c_.backward) {
      out.push_back({"dx", ref.dx, 0});
      out.push_back({"dwq", ref.dwq, 0});
      out.push_back({"dwk", ref.dwk, 0});
      out.push_back({"dwv", ref.dwv, 0});
      out.push_back({"dwo", ref.dwo, 0});
    }
    return out;
  }

  void finish_report(const comm::Group& g, io::Report& rep) override {
    LayerRow mine;
    mine.gemm_s = median(gemm_);
    mine.rope_s = median(rope_);
    mine.ring_backward_s = median(ring_bwd_);
    mine.ring_wait_s = median(ring_wait_);
    const std::vector<comm::ReduceStats>* stats[2] = {&dwo_, &dw_};
    for (int w = 0; w < 2; ++w) {
      if (stats[w]->empty()) continue;
      std::vector<double> el, ex;
      for (const comm::ReduceStats& s : *stats[w]) {
        el.push_back(s.elapsed_s);
        ex.push_back(s.exposed_s);
        mine.hidden[w] += s.hidden ? 1 : 0;
      }
      mine.reduce[w][0] = double(stats[w]->back().send_elems);
      mine.reduce[w][1] = double(stats[w]->back().recv_elems);
      mine.reduce[w][2] = median(el);
      mine.reduce[w][3] = median(ex);
    }
    mine.dwo_by_end = dwo_by_end_;
    const std::vector<LayerRow> rows = g.gather(mine, 0);
    if (g.rank() != 0) return;
    const int N = g.size();
    const bool b = c_.backward;
    const int iters = c_.iters;
    io::Json red_ranks = io::Json::array(), layer_ranks = io::Json::array();
    figures_.clear();
    rep.ledger_extras.assign(N, io::Json::object());
    for (int q = 0; q < N; ++q) {
      const LayerRow& x = rows[q];
      LayerRankFigures f;
      f.gemm_s = x.gemm_s;
      f.rope_s = x.rope_s;
      f.ring_backward_s = x.ring_backward_s;
      f.ring_wait_s = x.ring_wait_s;
      f.dwo_elapsed_s = x.reduce[0][2];
      f.dwo_exposed_s = x.reduce[0][3];
      f.dwqkv_exposed_s = x.reduce[1][3];
      f.dwo_hidden = b && x.hidden[0] == iters;
      f.allreduce_send_elems = Index(x.reduce[0][0] + x.reduce[1][0]);
      f.allreduce_recv_elems = Index(x.reduce[0][1] + x.reduce[1][1]);
      figures_.push_back(f);
      io::Json& lx = rep.ledger_extras[q];  // not ring traffic: send_bytes and recv_bytes leave it out
      lx["allreduce_send_elems"] = f.allreduce_send_elems;
      lx["allreduce_recv_elems"] = f.allreduce_recv_elems;
      lx["allreduce_send_bytes"] = f.allreduce_send_elems * Index(sizeof(A));
      lx["allreduce_recv_bytes"] = f.allreduce_recv_elems * Index(sizeof(A));
      io::Json lr = io::Json::object();
      lr["rank"] = q;
      lr["gemm_s"] = x.gemm_s;
      lr["rope_s"] = x.rope_s;
      lr["ring_backward_s"] = x.ring_backward_s;
      layer_ranks.push_back(lr);
      io::Json red = io::Json::object();
      red["rank"] = q;
      for (int w = 0; w < 2; ++w) {
        io::Json o = io::Json::object();
        o["send_elems"] = Index(x.reduce[w][0]);
        o["recv_elems"] = Index(x.reduce[w][1]);
        o["send_bytes"] = Index(x.reduce[w][0]) * Index(sizeof(A));
        o["recv_bytes"] = Index(x.reduce[w][1]) * Index(sizeof(A));
        o["elapsed_s"] = x.reduce[w][2];
        o["exposed_s"] = x.reduce[w][3];
        o["hidden"] = b && x.hidden[w] == iters;
        if (w == 0) {
          o["ring_backward_s"] = x.ring_backward_s;
          o["done_by_ring_backward_end"] = b && x.dwo_by_end == iters;
        }
        red[w == 0 ? "dwo" : "dwqkv"] = o;
      }
      red_ranks.push_back(red);
    }
    io::Json allreduce = io::Json::object();
    allreduce["algorithm"] =
        "fixed order: reduce-scatter (MPI_Ialltoallv, each segment summed in rank order) + MPI_Iallgatherv";
    const Index HD = p_.shape.H * p_.shape.D, KD = p_.shape.HKV * p_.shape.D, M = p_.model_dim;
    for (int w = 0; w < 2; ++w) {
      io::Json o = io::Json::object();
      o["elems"] = w == 0 ? HD * M : M * (HD + 2 * KD);
      o["started"] = w == 0 ? "before the ring backward" : "after the weight-gradient GEMMs";
      o["overlapped_with"] = w == 0 ? "ring backward, RoPE backward, weight and dX GEMMs" : "dX GEMMs";
      double exposed = 0, elapsed = 0, sent = 0;
      bool hidden = b, by_end = b;
      for (const LayerRow& x : rows) {
        sent += x.reduce[w][0];
        elapsed = std::max(elapsed, x.reduce[w][2]);
        exposed = std::max(exposed, x.reduce[w][3]);
        hidden = hidden && x.hidden[w] == iters;
        by_end = by_end && x.dwo_by_end == iters;
      }
      o["total_send_bytes"] = Index(sent) * Index(sizeof(A));
      o["max_elapsed_s"] = elapsed;
      o["max_exposed_s"] = exposed;  // slowest rank, median over --iters
      o["hidden"] = hidden;          // complete before it was waited for, on every rank, every iteration
      if (w == 0) o["done_by_ring_backward_end"] = by_end;
      allreduce[w == 0 ? "dwo" : "dwqkv"] = o;
    }
    allreduce["ranks"] = red_ranks;
    io::Json layer = io::Json::object();
    layer["model_dim"] = M;
    layer["rope"] = c_.rope_theta ? io::Json(*c_.rope_theta) : io::Json();
    layer["weight_init"] = c_.inputs.empty() ? "N(0,1)/sqrt(fan_in) from --seed" : "--inputs";
    layer["ranks"] = layer_ranks;
    rep.extras["allreduce"] = allreduce;
    rep.extras["layer"] = layer;
  }

  const std::vector<LayerRankFigures>& figures() const override { return figures_; }

 private:
  const comm::Comm& comm_;
  const JobConfig& c_;
  const JobPlan& p_;
  std::vector<std::vector<A>> in_;  // x, wq, wk, wv, wo, dy
  std::optional<Layer<S>> layer_;
  LayerStats sf_, sb_;
  std::vector<double> gemm_, rope_, ring_bwd_, ring_wait_;
  std::vector<comm::ReduceStats> dwo_, dw_;
  int dwo_by_end_ = 0;
  std::vector<LayerRankFigures> figures_;
  mutable std::vector<A> y_, dx_, dw_copy_[4];
};

}  // namespace

template <class S>
std::unique_ptr<LayerJobBase> make_layer_job(const comm::Comm& comm, const JobConfig& c, const JobPlan& p) {
  return std::make_unique<LayerJob<S>>(comm, c, p);
}

template std::unique_ptr<LayerJobBase> make_layer_job<float>(const comm::Comm&, const JobConfig&, const JobPlan&);
template std::unique_ptr<LayerJobBase> make_layer_job<double>(const comm::Comm&, const JobConfig&, const JobPlan&);
template std::unique_ptr<LayerJobBase> make_layer_job<core::bf16>(const comm::Comm&, const JobConfig&, const JobPlan&);
template std::unique_ptr<LayerJobBase> make_layer_job<core::f16>(const comm::Comm&, const JobConfig&, const JobPlan&);

}  // namespace ringattn::runtime
