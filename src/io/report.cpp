#include "ringattn/io/report.hpp"

#include <algorithm>

namespace ringattn::io {

std::vector<double> to_row(const RankReport& r) {
  const core::Ledger& l = r.ledger;
  return {double(r.positions),       double(l.fwd_kv_send_elems),    double(l.fwd_kv_recv_elems),
          double(l.replay_kv_send_elems), double(l.replay_kv_recv_elems), double(l.grad_send_elems),
          double(l.grad_recv_elems),     double(l.resident_qkv_elems),   double(l.remote_block_elems),
          double(l.online_state_elems),  r.forward_s,                    r.backward_s,
          r.compute_s,                   r.wait_s,                       double(r.work.tile_pairs),
          r.work.flops,                  double(r.budget_bytes),         double(r.peak_rss_bytes),
          double(r.allreduce_send_elems), double(r.allreduce_recv_elems)};
}

RankReport from_row(const double* x, int rank) {
  using core::Index;
  RankReport r;
  r.rank = rank;
  r.positions = Index(x[0]);
  r.ledger = core::Ledger{Index(x[1]), Index(x[2]), Index(x[3]), Index(x[4]), Index(x[5]),
                          Index(x[6]), Index(x[7]), Index(x[8]), Index(x[9])};
  r.forward_s = x[10];
  r.backward_s = x[11];
  r.compute_s = x[12];
  r.wait_s = x[13];
  r.work = core::Work{Index(x[14]), x[15]};
  r.budget_bytes = Index(x[16]);
  r.peak_rss_bytes = Index(x[17]);
  r.allreduce_send_elems = Index(x[18]);
  r.allreduce_recv_elems = Index(x[19]);
  return r;
}

Json to_json(const Report& r) {
  Json j = Json::object();
  j["config"] = r.config;
  j["loss"] = r.loss;
  Json t = Json::object();
  t["forward_s"] = r.forward_s;
  t["backward_s"] = r.backward_s;
  j["time"] = t;
  if (r.check) {
    Json c = Json::object();
    c["passed"] = r.check->passed;
    c["tolerance"] = r.check->tolerance;
    Json e = Json::object();
    e["o"] = r.check->o;
    e["lse"] = r.check->lse;
    e["dq"] = r.check->dq;
    e["dk"] = r.check->dk;
    e["dv"] = r.check->dv;
    c["max_rel_err"] = e;
    j["check"] = c;
  }
  Json ranks = Json::array();
  const auto es = static_cast<std::int64_t>(r.elem_size);
  for (const RankReport& rr : r.ranks) {
    const core::Ledger& l = rr.ledger;
    Json x = Json::object();
    x["rank"] = rr.rank;
    x["positions"] = static_cast<std::int64_t>(rr.positions);
    Json lj = Json::object();
    lj["fwd_kv_send_elems"] = static_cast<std::int64_t>(l.fwd_kv_send_elems);
    lj["fwd_kv_recv_elems"] = static_cast<std::int64_t>(l.fwd_kv_recv_elems);
    lj["replay_kv_send_elems"] = static_cast<std::int64_t>(l.replay_kv_send_elems);
    lj["replay_kv_recv_elems"] = static_cast<std::int64_t>(l.replay_kv_recv_elems);
    lj["grad_send_elems"] = static_cast<std::int64_t>(l.grad_send_elems);
    lj["grad_recv_elems"] = static_cast<std::int64_t>(l.grad_recv_elems);
    lj["send_bytes"] = static_cast<std::int64_t>(l.send_elems() * es);
    lj["recv_bytes"] = static_cast<std::int64_t>(l.recv_elems() * es);
    lj["resident_qkv_elems"] = static_cast<std::int64_t>(l.resident_qkv_elems);
    lj["remote_block_elems"] = static_cast<std::int64_t>(l.remote_block_elems);
    lj["online_state_elems"] = static_cast<std::int64_t>(l.online_state_elems);
    if (rr.allreduce_send_elems >= 0) {  // not ring traffic: send_bytes and recv_bytes leave it out
      lj["allreduce_send_elems"] = static_cast<std::int64_t>(rr.allreduce_send_elems);
      lj["allreduce_recv_elems"] = static_cast<std::int64_t>(rr.allreduce_recv_elems);
      lj["allreduce_send_bytes"] = static_cast<std::int64_t>(rr.allreduce_send_elems * es);
      lj["allreduce_recv_bytes"] = static_cast<std::int64_t>(rr.allreduce_recv_elems * es);
    }
    x["ledger"] = lj;
    Json tj = Json::object();
    tj["forward_s"] = rr.forward_s;
    tj["backward_s"] = rr.backward_s;
    tj["compute_s"] = rr.compute_s;
    tj["wait_s"] = rr.wait_s;
    x["time"] = tj;
    Json w = Json::object();
    w["tile_pairs"] = static_cast<std::int64_t>(rr.work.tile_pairs);
    w["flops"] = rr.work.flops;
    const double secs = rr.forward_s + rr.backward_s;
    w["gflops_per_s"] = secs > 0 ? rr.work.flops / secs * 1e-9 : 0.0;
    x["work"] = w;
    Json mem = Json::object();
    mem["budget_bytes"] = static_cast<std::int64_t>(rr.budget_bytes);
    mem["peak_rss_bytes"] = static_cast<std::int64_t>(rr.peak_rss_bytes);
    x["memory"] = mem;
    ranks.push_back(x);
  }
  j["ranks"] = ranks;
  // Load balance: max/mean of the flops each rank computed, next to seed 003's model for
  // causal contiguous shards (rank r does r+1 block pairs: max N over mean (N+1)/2) and the same
  // count with the diagonal block as a triangle (rank r: r + 1/2; max N - 1/2 over mean N/2).
  Json bal = Json::object();
  double mx = 0, sum = 0;
  for (const RankReport& rr : r.ranks) {
    mx = std::max(mx, rr.work.flops);
    sum += rr.work.flops;
  }
  const double n = static_cast<double>(r.ranks.size());
  bal["flops_max_over_mean"] = sum > 0 ? mx / (sum / n) : 1.0;
  bal["model_contiguous_causal"] = n > 0 ? 2 * n / (n + 1) : 1.0;           // diagonal block whole
  bal["model_contiguous_causal_pairs"] = n > 0 ? (2 * n - 1) / n : 1.0;     // visible pairs only
  bal["total_flops"] = sum;
  j["imbalance"] = bal;
  return j;
}

}  // namespace ringattn::io
