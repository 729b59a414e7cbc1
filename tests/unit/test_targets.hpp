#pragma once
// The SIMD targets a kernel test runs its cases on: every target this build has and this CPU runs,
// best first, or those of them RINGATTN_TEST_TARGETS names (comma-separated Highway names). The
// emulated Arm runs use the variable to test each target once over the whole matrix of emulated
// CPUs rather than every target on every vector length: wide SVE under qemu costs minutes per
// target. A name this CPU cannot run fails the test; it is never dropped in silence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "ringattn/core/simd.hpp"

namespace ringattn::test {

inline std::vector<std::string> test_targets() {
  const std::vector<std::string> all = core::simd::available();
  const char* env = std::getenv("RINGATTN_TEST_TARGETS");
  if (env == nullptr || *env == '\0') return all;
  std::vector<std::string> chosen;
  std::stringstream names(env);
  for (std::string name; std::getline(names, name, ',');) {
    if (name.empty()) continue;
    if (std::find(all.begin(), all.end(), name) == all.end()) {
      ADD_FAILURE() << "RINGATTN_TEST_TARGETS names " << name << ", which this CPU does not run";
      continue;
    }
    chosen.push_back(name);
  }
  return chosen;
}

// Runs fn once on each of test_targets() (the results must hold on each), then goes back to the
// best target this CPU runs.
template <class Fn>
void on_every_target(Fn&& fn) {
  const std::vector<std::string> targets = test_targets();
  ASSERT_FALSE(targets.empty()) << "no SIMD target to test";
  for (const std::string& t : targets) {
    core::simd::select(t);
    ASSERT_EQ(core::simd::current(), t) << "the dispatch runs the selected target";
    SCOPED_TRACE("SIMD target " + t);
    fn();
  }
  core::simd::select(core::simd::available().front());
}

}  // namespace ringattn::test
