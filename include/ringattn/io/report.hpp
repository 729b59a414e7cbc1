#pragma once
// The run report of DESIGN.md ("Report JSON"), as plain data and its JSON form.
#include <optional>
#include <string>
#include <vector>

#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/ledger.hpp"
#include "ringattn/io/json.hpp"

namespace ringattn::io {

struct RankReport {
  int rank = 0;
  core::Index positions = 0;
  core::Ledger ledger;
  double forward_s = 0, backward_s = 0, compute_s = 0, wait_s = 0;  // this rank, median over --iters
  core::Work work;                                                   // forward + backward
  core::Index budget_bytes = 0;                                      // buffers held for the ring
  core::Index peak_rss_bytes = 0;                                    // the process's high-water mark
  // --layer: elements this rank sent and received in the weight-gradient all-reduces (dWo and
  // dWq/dWk/dWv), per iteration; -1 when there are none (attention mode).
  core::Index allreduce_send_elems = -1, allreduce_recv_elems = -1;
};

struct CheckReport {
  bool passed = false;
  double tolerance = 0;
  double o = 0, lse = 0, dq = 0, dk = 0, dv = 0;  // max relative error (dq, dk, dv NaN without backward)
};

struct Report {
  Json config = Json::object();
  double loss = 0;
  double forward_s = 0, backward_s = 0;  // slowest rank, median over --iters
  std::size_t elem_size = 4;
  std::optional<CheckReport> check;
  std::vector<RankReport> ranks;
};

Json to_json(const Report& r);

// A RankReport as a fixed-length row of doubles (integers below 2^53 are exact), so the ranks'
// figures travel to rank 0 in one gather.
inline constexpr std::size_t kRankReportFields = 20;
std::vector<double> to_row(const RankReport& r);
RankReport from_row(const double* row, int rank);

}  // namespace ringattn::io
