#include "ringattn/runtime/agreement.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>

namespace ringattn::runtime {

namespace {

std::string serialize(const std::vector<PlanField>& fields) {
  std::string s;
  for (const PlanField& f : fields) s += f.name + '\x1f' + f.value + '\x1e';
  return s;
}

std::vector<PlanField> parse(const std::string& s) {
  std::vector<PlanField> out;
  std::size_t at = 0;
  while (at < s.size()) {
    const std::size_t sep = s.find('\x1f', at), end = s.find('\x1e', at);
    if (sep == std::string::npos || end == std::string::npos || sep > end) break;
    out.push_back({s.substr(at, sep - at), s.substr(sep + 1, end - sep - 1)});
    at = end + 1;
  }
  return out;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ',';
    if (i == 8 && ranks.size() > 9) return s + fmt::format("... ({} ranks)", ranks.size());
    s += std::to_string(ranks[i]);
  }
  return s;
}

std::string short_value(const std::string& v) { return v.size() > 60 ? v.substr(0, 57) + "..." : v; }

// Rank 0: the first field (in the fields' order) whose value is not the same on every rank.
std::string first_difference(const std::vector<std::vector<PlanField>>& all) {
  const std::vector<PlanField>& mine = all[0];
  std::size_t most = 0;
  for (const auto& f : all) most = std::max(most, f.size());
  for (std::size_t k = 0; k < most; ++k) {
    std::map<std::string, std::vector<int>> by_value;
    std::string name = k < mine.size() ? mine[k].name : std::string();
    for (std::size_t r = 0; r < all.size(); ++r) {
      if (k < all[r].size()) {
        if (name.empty()) name = all[r][k].name;
        if (all[r][k].name != name) return fmt::format("ranks disagree on what the job is: rank 0 plans {}, rank {} "
                                                        "plans {} (expected the same options on every rank)",
                                                        name, r, all[r][k].name);
        by_value[all[r][k].value].push_back(int(r));
      } else {
        by_value["(nothing)"].push_back(int(r));
      }
    }
    if (by_value.size() < 2) continue;
    std::string parts;
    // Rank 0's value first, then the others in order of their first rank.
    std::vector<std::pair<int, std::string>> order;
    for (const auto& [value, ranks] : by_value) order.emplace_back(ranks.front(), value);
    std::sort(order.begin(), order.end());
    for (const auto& [first, value] : order) {
      const auto& ranks = by_value[value];
      parts += fmt::format("{}{} {} {}", parts.empty() ? "" : ", ", ranks_text(ranks), ranks.size() == 1 ? "has" : "have",
                           short_value(value));
    }
    return fmt::format("ranks disagree on {}: {} (expected the same options and inputs on every rank)", name,
                       parts);
  }
  return "ranks disagree on their plans (expected the same options and inputs on every rank)";
}

}  // namespace

std::uint64_t digest_bytes(const void* p, std::size_t n, std::uint64_t h) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

void agree_on_plan(const comm::Group& group, const std::vector<PlanField>& fields) {
  const std::string text = serialize(fields);
  const auto h = static_cast<std::int64_t>(digest_bytes(text.data(), text.size()));
  std::int64_t lo = h, hi = h;
  group.allreduce_min(std::span<std::int64_t>(&lo, 1));
  group.allreduce_max(std::span<std::int64_t>(&hi, 1));
  if (lo == hi) return;
  // Only now, with every rank known to be here, the variable-size comparison.
  const auto all = group.gatherv(std::span<const char>(text.data(), text.size()), 0);
  std::string msg;
  if (group.rank() == 0) {
    std::vector<std::vector<PlanField>> plans;
    for (const auto& t : all) plans.push_back(parse(std::string(t.begin(), t.end())));
    msg = first_difference(plans);
  }
  group.broadcast(msg, 0);
  throw InputError(msg);
}

}  // namespace ringattn::runtime
