#include "ringattn/core/mask.hpp"

#include <fmt/format.h>

#include "ringattn/core/errors.hpp"

namespace ringattn::core {

Mask Mask::make(Index S, bool causal, Index window, const std::vector<Index>& doc_lens) {
  Mask m;
  // Preconditions (the plan checks the options before anything is built).
  if (window < 0) throw InputError(fmt::format("Mask::make: window {} is negative (expected W >= 1, or 0)", window));
  m.causal_ = causal || window > 0;  // a sliding window is causal by definition
  m.window_ = window;
  if (!doc_lens.empty()) {
    Index total = 0;
    for (Index n : doc_lens) {
      if (n < 0) throw InputError(fmt::format("Mask::make: document length {} is negative (expected >= 0)", n));
      total += n;
    }
    if (total != S)
      throw InputError(fmt::format("Mask::make: document lengths sum to {}, not S = {}", total, S));
    m.doc_of_.reserve(S);
    for (std::size_t d = 0; d < doc_lens.size(); ++d) m.doc_of_.insert(m.doc_of_.end(), doc_lens[d], static_cast<int>(d));
  }
  return m;
}

std::string Mask::describe() const {
  std::string s;
  if (window_ > 0) s = fmt::format("window {}: i-{}<j<=i", window_, window_);
  else if (causal_) s = "causal j<=i";
  if (!doc_of_.empty()) s += (s.empty() ? "" : ", ") + fmt::format("{} documents", doc_of_.back() + 1);
  return s.empty() ? "none (all keys)" : s;
}

TileClass Mask::classify(Index qmin, Index qmax, Index kmin, Index kmax) const {
  const bool docs = !doc_of_.empty();
  // empty: even the most favourable pair fails some rule
  if (causal_ && qmax < kmin) return TileClass::empty;
  if (window_ > 0 && kmax <= qmin - window_) return TileClass::empty;
  if (docs && (doc_of_[qmax] < doc_of_[kmin] || doc_of_[kmax] < doc_of_[qmin])) return TileClass::empty;
  // full: even the least favourable pair passes every rule
  bool full = true;
  if (causal_ && qmin < kmax) full = false;
  if (window_ > 0 && kmin <= qmax - window_) full = false;
  if (docs && !(doc_of_[qmin] == doc_of_[qmax] && doc_of_[kmin] == doc_of_[kmax] && doc_of_[qmin] == doc_of_[kmin]))
    full = false;
  return full ? TileClass::full : TileClass::partial;
}

}  // namespace ringattn::core
