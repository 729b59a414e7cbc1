#pragma once
// Ranks agree before they talk: a failure on one rank becomes the same error on every rank, so no
// rank is left waiting in a collective for a peer that already gave up.
#include <string>

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

}  // namespace ringattn::runtime
