#pragma once
// Ranks agree before they talk: a failure on one rank becomes the same error on every rank, so no
// rank is left waiting in a collective for a peer that already gave up.
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

}  // namespace ringattn::runtime
