#pragma once
// Small pieces every job (run, lab, layer) shares: error agreement around a stage, the
// process's peak memory, medians of timings.
#include <algorithm>
#include <string>
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/core/shape.hpp"

namespace ringattn::runtime {

// Run `fn` on every rank; if it throws InputError on any rank, every rank throws the message of
// the lowest failing rank. Keeps ranks from waiting on a peer that already gave up.
template <class Fn>
void agreed(const comm::Comm& comm, Fn&& fn) {
  std::string err;
  try {
    fn();
  } catch (const InputError& e) {
    err = e.what();
  }
  if (auto e = comm.agree(err)) throw InputError(*e);
}

// The same for any failure after validation (I/O, system errors): every rank throws AgreedFailure.
template <class Fn>
void agreed_runtime(const comm::Comm& comm, Fn&& fn) {
  std::string err;
  try {
    fn();
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (auto e = comm.agree(err)) throw AgreedFailure(*e);
}

// High-water mark of this process's resident memory in bytes.
core::Index peak_rss_bytes();

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace ringattn::runtime
