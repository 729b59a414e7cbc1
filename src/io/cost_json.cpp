#include "ringattn/io/cost_json.hpp"

namespace ringattn::io {

Json plan_json(const core::CostInputs& in, const core::CostEstimate& e,
               const std::vector<core::StrategyEstimate>& strategies) {
  Json j = Json::object();
  j["recv_bytes"] = e.recv_bytes;
  j["send_bytes"] = e.send_bytes;
  j["step_intensity"] = e.step_intensity;
  j["layer_intensity"] = e.layer_intensity;  // null (inf) with one rank: nothing is received
  j["beta"] = e.beta;
  j["compute_s"] = e.compute_s;
  j["comm_s"] = e.comm_s;
  j["comm_ratio"] = e.comm_ratio;
  j["step_compute_s"] = e.step_compute_s;
  j["step_comm_s"] = e.step_comm_s;
  j["max_ranks"] = static_cast<std::int64_t>(e.max_ranks);
  j["causal_utilization"] = e.causal_utilization;
  j["causal_utilization_tri"] = e.causal_utilization_tri;
  j["ulysses_recv_bytes"] = e.ulysses_recv_bytes;
  j["tp_bytes"] = e.tp_bytes;
  j["verdict"] = core::verdict_text(e.verdict);
  Json x = Json::object();
  x["seq"] = static_cast<std::int64_t>(in.S);
  x["ranks"] = static_cast<std::int64_t>(in.N);
  x["heads"] = static_cast<std::int64_t>(in.H);
  x["kv_heads"] = static_cast<std::int64_t>(in.HKV);
  x["head_dim"] = static_cast<std::int64_t>(in.D);
  x["batch"] = static_cast<std::int64_t>(in.B);
  x["bytes"] = in.bytes;
  x["flops"] = in.flops;
  x["bandwidth"] = in.bandwidth;
  x["causal"] = in.causal;
  j["inputs"] = x;
  if (strategies.empty()) return j;
  Json st = Json::array();
  for (const core::StrategyEstimate& s : strategies) {
    Json o = Json::object();
    o["strategy"] = s.strategy;
    o["ulysses_degree"] = static_cast<std::int64_t>(s.U);
    o["possible"] = s.impossible.empty();
    if (!s.impossible.empty()) {
      o["reason"] = s.impossible;
      st.push_back(o);
      continue;
    }
    o["recv_bytes"] = s.recv_bytes;
    o["a2a_recv_elems"] = s.a2a_recv_elems;
    o["lse_recv_elems"] = s.lse_recv_elems;
    o["a2a_recv_bytes"] = s.a2a_recv_bytes;
    o["ring_recv_bytes"] = s.ring_recv_bytes;
    o["step_intensity"] = s.step_intensity > 0 ? Json(s.step_intensity) : Json();
    o["step_comm_ratio"] = s.step_comm_ratio;
    o["a2a_s"] = s.a2a_s;
    o["predicted_s"] = s.predicted_s;
    o["comm_ratio"] = s.comm_ratio;
    if (s.strategy == "allgather") {
      o["ag_recv_bytes"] = s.ag_recv_bytes;
      o["kv_head_group"] = static_cast<std::int64_t>(s.kv_head_group);
      o["gathered_bytes"] = s.gathered_bytes;
      o["exposed_gather_s"] = s.exposed_gather_s;
    }
    o["verdict"] = core::verdict_text(s.verdict);
    st.push_back(o);
  }
  j["strategies"] = st;
  const core::StrategyEstimate& best = core::predicted_best(strategies);
  j["recommended"] = best.strategy;
  j["recommended_ulysses_degree"] = static_cast<std::int64_t>(best.U);
  return j;
}

}  // namespace ringattn::io
