#pragma once
// The median of a sample (0 for an empty one): what the benchmarks and reports time with.
#include <algorithm>
#include <vector>

namespace ringattn::core {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace ringattn::core
