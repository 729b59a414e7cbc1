#pragma once
// Visibility on global positions only:
//   causal:    j <= i
//   window w:  i - w < j <= i          (a causal sliding window)
//   documents: i and j in the same document, and j <= i if causal
// Local indices are storage; nothing here knows about ranks.
#include <span>
#include <string>
#include <vector>

#include "ringattn/core/shape.hpp"

namespace ringattn::core {

enum class TileClass { empty, partial, full };

class Mask {
 public:
  Mask() = default;
  static Mask none() { return Mask(); }
  static Mask make(Index S, bool causal, Index window, const std::vector<Index>& doc_lens);

  bool causal() const { return causal_; }
  Index window() const { return window_; }
  bool has_docs() const { return !doc_of_.empty(); }
  bool is_full() const { return !causal_ && window_ == 0 && doc_of_.empty(); }
  std::string describe() const;  // "causal j<=i", "none", ...

  bool visible(Index i, Index j) const {
    if (causal_ && j > i) return false;
    if (window_ > 0 && j <= i - window_) return false;
    if (!doc_of_.empty() && doc_of_[i] != doc_of_[j]) return false;
    return true;
  }

  // Conservative class of a tile whose query positions lie in [qmin, qmax] and key positions
  // in [kmin, kmax]: `empty` and `full` are exact claims, `partial` means test each pair.
  TileClass classify(Index qmin, Index qmax, Index kmin, Index kmax) const;

 private:
  bool causal_ = false;
  Index window_ = 0;
  std::vector<int> doc_of_;  // [S] document index of each position, empty when no documents
};

}  // namespace ringattn::core
