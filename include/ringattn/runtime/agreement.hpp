#pragma once
// Ranks agree before they talk: a failure on one rank becomes the same error on every rank, so no
// rank is left waiting in a collective for a peer that already gave up.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ringattn/comm/group.hpp"
#include "ringattn/core/errors.hpp"

namespace ringattn::runtime {

// Runs `fn` on every rank; if it throws InputError on any rank, every rank throws the message of
// the lowest failing rank.
template <class Fn>
void agreed(const comm::Group& group, Fn&& fn) {
  std::string err;
  try {
    fn();
  } catch (const InputError& e) {
    err = e.what();
  }
  if (auto e = group.agree(err)) throw InputError(*e);
}

// The same for any failure after validation (I/O, system errors): every rank throws AgreedFailure.
template <class Fn>
void agreed_runtime(const comm::Group& group, Fn&& fn) {
  std::string err;
  try {
    fn();
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (auto e = group.agree(err)) throw AgreedFailure(*e);
}

// One entry of a job's plan that every rank must hold the same: what it is ("S (--seq or the
// input files)") and its value as text.
struct PlanField {
  std::string name;
  std::string value;
};

// Collective, before any communication whose sizes depend on the plan: every rank's fields are
// compared (a digest first, all fields only when the digests differ). A difference is an
// InputError on every rank naming the first field that differs and which ranks hold which value.
void agree_on_plan(const comm::Group& group, const std::vector<PlanField>& fields);

// FNV-1a over n bytes, continuing from h: a digest that ranks compare to learn whether they hold
// the same bytes (options, inputs, outputs) before they compare the bytes themselves.
inline constexpr std::uint64_t kDigestSeed = 1469598103934665603ull;
std::uint64_t digest_bytes(const void* p, std::size_t n, std::uint64_t h = kDigestSeed);

}  // namespace ringattn::runtime
