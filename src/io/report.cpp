#include "ringattn/io/report.hpp"

#include <algorithm>
#include <limits>

namespace ringattn::io {

double CheckReport::error(const std::string& name) const {
  for (const auto& [n, e] : errors)
    if (n == name) return e;
  return std::numeric_limits<double>::quiet_NaN();
}

Json to_json(const Report& r) {
  Json j = Json::object();
  j["config"] = r.config;
  j["loss"] = r.loss ? Json(*r.loss) : Json();
  Json t = Json::object();
  t["forward_s"] = r.forward_s;
  t["backward_s"] = r.backward_s;
  j["time"] = t;
  if (r.check) {
    Json c = Json::object();
    c["passed"] = r.check->passed;
    c["tolerance"] = r.check->tolerance;
    Json e = Json::object();
    for (const auto& [name, err] : r.check->errors) e[name] = err;
    c["max_rel_err"] = e;
    j["check"] = c;
  }
  Json ranks = Json::array();
  for (std::size_t k = 0; k < r.ranks.size(); ++k) {
    const RankRow& rr = r.ranks[k];
    const core::Ledger& l = rr.ledger;
    Json x = Json::object();
    x["rank"] = rr.rank;
    x["positions"] = rr.positions;
    Json lj = Json::object();
    lj["fwd_kv_send_elems"] = l.fwd_kv_send_elems;
    lj["fwd_kv_recv_elems"] = l.fwd_kv_recv_elems;
    lj["replay_kv_send_elems"] = l.replay_kv_send_elems;
    lj["replay_kv_recv_elems"] = l.replay_kv_recv_elems;
    lj["grad_send_elems"] = l.grad_send_elems;
    lj["grad_recv_elems"] = l.grad_recv_elems;
    lj["a2a_fwd_send_elems"] = l.a2a_fwd_send_elems;
    lj["a2a_fwd_recv_elems"] = l.a2a_fwd_recv_elems;
    lj["a2a_bwd_send_elems"] = l.a2a_bwd_send_elems;
    lj["a2a_bwd_recv_elems"] = l.a2a_bwd_recv_elems;
    lj["ag_fwd_recv_elems"] = l.ag_fwd_recv_elems;
    lj["ag_bwd_recv_elems"] = l.ag_bwd_recv_elems;
    lj["rs_bwd_send_elems"] = l.rs_bwd_send_elems;
    lj["rs_bwd_recv_elems"] = l.rs_bwd_recv_elems;
    lj["send_bytes"] = l.send_bytes;
    lj["recv_bytes"] = l.recv_bytes;
    lj["resident_qkv_elems"] = l.resident_qkv_elems;
    lj["remote_block_elems"] = l.remote_block_elems;
    lj["online_state_elems"] = l.online_state_elems;
    if (k < r.ledger_extras.size() && r.ledger_extras[k].is_object())
      for (const auto& [key, value] : r.ledger_extras[k].members()) lj[key] = value;
    x["ledger"] = lj;
    Json tj = Json::object();
    tj["forward_s"] = rr.forward_s;
    tj["backward_s"] = rr.backward_s;
    tj["compute_s"] = rr.compute_s;
    tj["wait_s"] = rr.wait_s;
    tj["a2a_wait_s"] = rr.a2a_wait_s;
    x["time"] = tj;
    Json w = Json::object();
    w["tile_pairs"] = rr.work.tile_pairs;
    w["flops"] = rr.work.flops;
    const double secs = rr.forward_s + rr.backward_s;
    w["gflops_per_s"] = secs > 0 ? rr.work.flops / secs * 1e-9 : 0.0;
    x["work"] = w;
    Json mem = Json::object();
    mem["budget_bytes"] = rr.budget_bytes;
    mem["peak_rss_bytes"] = rr.peak_rss_bytes;
    x["memory"] = mem;
    ranks.push_back(x);
  }
  j["ranks"] = ranks;
  // Load balance: max/mean of the flops each rank computed, next to the block model for causal
  // contiguous shards (rank r does r+1 block pairs: max N over mean (N+1)/2) and the same count
  // with the diagonal block as a triangle (rank r: r + 1/2; max N - 1/2 over mean N/2).
  Json bal = Json::object();
  double mx = 0, sum = 0;
  for (const RankRow& rr : r.ranks) {
    mx = std::max(mx, rr.work.flops);
    sum += rr.work.flops;
  }
  const double n = static_cast<double>(r.ranks.size());
  bal["flops_max_over_mean"] = sum > 0 ? mx / (sum / n) : 1.0;
  bal["model_contiguous_causal"] = n > 0 ? 2 * n / (n + 1) : 1.0;        // diagonal block whole
  bal["model_contiguous_causal_pairs"] = n > 0 ? (2 * n - 1) / n : 1.0;  // visible pairs only
  bal["total_flops"] = sum;
  j["imbalance"] = bal;
  if (r.extras.is_object())
    for (const auto& [key, value] : r.extras.members()) j[key] = value;
  return j;
}

}  // namespace ringattn::io
