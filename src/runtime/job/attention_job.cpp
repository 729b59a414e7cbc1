// `run` in attention mode: this rank's shard of q, k, v and dout through the strategy.
#include <algorithm>
#include <cmath>
#include <optional>

#include "jobs.hpp"
#include "ringattn/core/layer_reference.hpp"
#include "ringattn/core/reference.hpp"
#include "ringattn/core/rope.hpp"
#include "ringattn/runtime/agreement.hpp"

namespace ringattn::runtime {

namespace {

template <class S>
class AttentionJob final : public Job {
 public:
  using A = core::accum_t<S>;

  AttentionJob(const comm::Comm& comm, const JobConfig& c, const JobPlan& p) : comm_(comm), c_(c), p_(p) {
    if (c.timing_only) {  // no values: the strategy's buffers only give the transfers their sizes
      strategy_ = make_strategy<S>(comm, strategy_setup(c, p));
      strategy_->load(nullptr, nullptr, nullptr);
      if (c.backward) strategy_->load_dout(nullptr);
      return;
    }
    agreed(comm, [&] { in_ = load_inputs<S>(p.inputs, p.layout, comm.rank()); });
    strategy_ = make_strategy<S>(comm, strategy_setup(c, p));
    // --rope: the strategy attends q and k rotated at their global positions; in_ keeps them as given.
    const S* q = in_[0].data();
    const S* k = in_[1].data();
    if (c.rope_theta) {
      rope_.emplace(*c.rope_theta, p.shape, p.layout.positions(comm.rank()), q, k);
      q = rope_->q();
      k = rope_->k();
    }
    strategy_->load(q, k, in_[2].data());
    if (c.backward) strategy_->load_dout(in_[3].data());
  }

  IterationTimes iterate(bool) override {
    pf_ = strategy_->forward();
    pb_ = c_.backward ? strategy_->backward() : PassStats{};
    if (c_.backward && !p_.sinks.empty() && !c_.timing_only) {  // part of the backward: timed with it
      const double t0 = comm::wtime();
      dsinks_ = sink_gradient(comm_, *strategy_, p_.shape.H);
      pb_.total_s += comm::wtime() - t0;
    }
    return {pf_.total_s, pb_.total_s, pf_.compute_s + pb_.compute_s, pf_.wait_s + pb_.wait_s,
            pf_.a2a_wait_s + pb_.a2a_wait_s};
  }

  std::vector<OutputTensor> outputs() const override {
    if (c_.timing_only) return {};
    const core::Shape& s = p_.shape;
    const Index L = strategy_->local_size();
    o_.resize(s.B * L * s.H * s.D);
    lse_.resize(s.B * s.H * L);
    if (c_.backward) {
      dq_.resize(s.B * L * s.H * s.D);
      dk_.resize(s.B * L * s.HKV * s.D);
      dv_.resize(s.B * L * s.HKV * s.D);
    }
    const bool b = c_.backward;
    strategy_->outputs(o_.data(), lse_.data(), b ? dq_.data() : nullptr, b ? dk_.data() : nullptr,
                       b ? dv_.data() : nullptr);
    if (rope_ && b) rope_->backward(dq_.data(), dk_.data());  // gradients of q, k as given
    const std::vector<Index> query{s.B, s.S, s.H, s.D}, kv{s.B, s.S, s.HKV, s.D};
    std::vector<OutputTensor> out = {output("o", query, 1, o_, true), output("lse", {s.B, s.H, s.S}, 2, lse_, true)};
    if (b) {
      out.push_back(output("dq", query, 1, dq_, true));
      out.push_back(output("dk", kv, 1, dk_, true));
      out.push_back(output("dv", kv, 1, dv_, true));
      if (!p_.sinks.empty()) {  // [H], the same on every rank
        dsinks_out_.assign(dsinks_.begin(), dsinks_.end());
        out.push_back(output("dsinks", {s.H}, kWhole, dsinks_out_, true));
      }
    }
    // The inputs as used (16-bit ones as f32 files), so anyone can recompute the reference.
    if (!p_.inputs.from_files() || p_.inputs.rounded)
      for (std::size_t t = 0; t < p_.inputs.specs.size(); ++t) {
        if constexpr (core::is_half_v<S>) {
          used_[t].resize(in_[t].size());
          std::transform(in_[t].begin(), in_[t].end(), used_[t].begin(), [](S x) { return core::to_float(x); });
          out.push_back(output(p_.inputs.specs[t].name, p_.inputs.specs[t].shape, 1, used_[t], false));
        } else {
          out.push_back(output(p_.inputs.specs[t].name, p_.inputs.specs[t].shape, 1, in_[t], false));
        }
      }
    return out;
  }

  std::optional<double> local_loss() const override {
    if (c_.timing_only) return std::nullopt;
    if (p_.inputs.from_files() && !p_.inputs.headers[3]) return std::nullopt;  // no dout given
    const Index L = strategy_->local_size();
    const core::Shape& s = p_.shape;
    std::vector<A> o(s.B * L * s.H * s.D);
    strategy_->outputs(o.data(), nullptr, nullptr, nullptr, nullptr);
    double loss = 0;  // sum dout . O, accumulated in double
    for (std::size_t n = 0; n < o.size(); ++n) loss += core::value_cast<double>(in_[3][n]) * double(o[n]);
    return loss;
  }

  io::RankRow rank_row() const override {
    io::RankRow r;
    r.positions = strategy_->local_size();
    r.ledger = strategy_->ledger();
    r.work = pf_.work;
    r.work += pb_.work;
    r.budget_bytes = strategy_->resident_bytes();
    r.peak_rss_bytes = peak_rss_bytes();
    return r;
  }

  std::vector<StepRecord> steps() const override {
    std::vector<StepRecord> all = pf_.steps;
    all.insert(all.end(), pb_.steps.begin(), pb_.steps.end());
    return all;
  }

  std::vector<ReferenceTensor> reference() const override {
    const core::Shape& s = p_.shape;
    std::vector<double> g[4];
    for (int t = 0; t < 4; ++t) g[t] = global_input<S>(p_.inputs, p_.inputs.specs[t]);
    core::AttentionExtras extras;
    extras.softcap = p_.softcap;
    extras.sinks = p_.sinks;
    const core::DenseResult ref =
        c_.rope_theta ? core::reference_attention_rope(s, p_.mask, p_.scale, *c_.rope_theta, g[0], g[1], g[2], g[3],
                                                        c_.backward, extras)
                      : core::reference_attention(s, p_.mask, p_.scale, g[0], g[1], g[2], g[3], c_.backward, extras);
    auto peak = [](const std::vector<double>& v) {
      double m = 0;
      for (double x : v) m = std::max(m, std::abs(x));
      return m;
    };
    // Natural magnitudes, for outputs whose reference vanishes: |O| <= max|v|; a gradient is of
    // the order of the operands it multiplies.
    const double q = peak(g[0]), k = peak(g[1]), v = peak(g[2]), d = peak(g[3]), sc = std::abs(p_.scale);
    std::vector<ReferenceTensor> out = {{"o", ref.o, v}, {"lse", ref.lse, 1.0}};
    if (c_.backward) {
      out.push_back({"dq", ref.dq, sc * k * v * d});
      out.push_back({"dk", ref.dk, sc * q * v * d});
      out.push_back({"dv", ref.dv, d});
      // a sink's gradient sums e^(sink - LSE_i) (dO_i . O_i) over the rows: of the order of |dO| |v|
      if (!p_.sinks.empty()) out.push_back({"dsinks", ref.dsinks, d * v});
    }
    return out;
  }

  void finish_report(const comm::Group&, io::Report&) override {}

 private:
  const comm::Comm& comm_;
  const JobConfig& c_;
  const JobPlan& p_;
  std::vector<std::vector<S>> in_;  // q, k, v, dout as given
  std::optional<core::ShardRope<S>> rope_;
  std::unique_ptr<Strategy<S>> strategy_;
  PassStats pf_, pb_;
  mutable std::vector<A> o_, lse_, dq_, dk_, dv_, dsinks_out_;
  std::vector<double> dsinks_;  // [H] after a backward with sinks
  mutable std::vector<float> used_[4];  // 16-bit inputs widened for their files
};

}  // namespace

template <class S>
std::unique_ptr<Job> make_attention_job(const comm::Comm& comm, const JobConfig& c, const JobPlan& p) {
  return std::make_unique<AttentionJob<S>>(comm, c, p);
}

template std::unique_ptr<Job> make_attention_job<float>(const comm::Comm&, const JobConfig&, const JobPlan&);
template std::unique_ptr<Job> make_attention_job<double>(const comm::Comm&, const JobConfig&, const JobPlan&);
template std::unique_ptr<Job> make_attention_job<core::bf16>(const comm::Comm&, const JobConfig&, const JobPlan&);
template std::unique_ptr<Job> make_attention_job<core::f16>(const comm::Comm&, const JobConfig&, const JobPlan&);

}  // namespace ringattn::runtime
