#pragma once
// The run report ("config", "loss", "time", "check", "ranks", "imbalance"), as plain data and its
// JSON form. A rank's figures are one trivially copyable RankRow, gathered to rank 0 as is.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/ledger.hpp"
#include "ringattn/io/json.hpp"

namespace ringattn::io {

struct RankRow {
  int rank = 0;
  core::Index positions = 0;
  core::Ledger ledger;
  double forward_s = 0, backward_s = 0, compute_s = 0, wait_s = 0;  // this rank, median over --iters
  core::Work work;                                                   // forward + backward
  core::Index budget_bytes = 0;                                      // buffers held for the strategy
  core::Index peak_rss_bytes = 0;                                    // the process's high-water mark
  double a2a_wait_s = 0;  // the part of wait_s spent in all-to-alls, median over --iters
};

struct CheckReport {
  bool passed = false;
  double tolerance = 0;
  // max relative error of each checked output, in report order (NaN: not computed)
  std::vector<std::pair<std::string, double>> errors;
  double error(const std::string& name) const;
};

struct Report {
  Json config = Json::object();
  std::optional<double> loss;  // sum dout . O (or dY . Y); absent when not computed
  double forward_s = 0, backward_s = 0;  // slowest rank, median over --iters
  std::optional<CheckReport> check;
  std::vector<RankRow> ranks;
  std::vector<Json> ledger_extras;  // per rank: more fields of its "ledger" object (may be empty)
  Json extras = Json::object();     // more top-level fields (a mode's own figures)
};

Json to_json(const Report& r);

}  // namespace ringattn::io
