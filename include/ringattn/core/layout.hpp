#pragma once
// Which rank owns which global positions.
//   contiguous: consecutive ranges; balanced (first S mod N ranks one longer) or explicit sizes.
//   striped:    position p belongs to rank p mod N.
//   zigzag:     S cut into 2N chunks (first S mod 2N one longer); rank r owns chunks r and 2N-1-r.
// A rank stores its positions in increasing global order; local index = rank of the position
// within that order. Everything here is O(S) at most.
#include <span>
#include <string>
#include <vector>

#include "ringattn/core/shape.hpp"

namespace ringattn::core {

enum class LayoutKind { contiguous, striped, zigzag };
LayoutKind parse_layout_kind(const std::string& name);  // throws InputError
const char* layout_name(LayoutKind k);

// A maximal run of consecutive global positions held by one rank.
struct Run {
  Index global_begin;
  Index local_begin;
  Index length;
};

class Layout {
 public:
  static Layout contiguous(Index S, int N);
  static Layout partitioned(const std::vector<Index>& sizes);  // validates: non-negative
  static Layout striped(Index S, int N);
  static Layout zigzag(Index S, int N);
  static Layout make(LayoutKind kind, Index S, int N, const std::vector<Index>& partition = {});
  // Ranks gU .. gU+U-1 of `l` taken as one rank g: it owns the union of their positions (in
  // increasing order, as always). U must divide l.ranks(). The kind stays l's.
  static Layout grouped(const Layout& l, int U);

  LayoutKind kind() const { return kind_; }
  int ranks() const { return static_cast<int>(sizes_.size()); }
  Index seq() const { return static_cast<Index>(owner_.size()); }
  Index size(int r) const { return sizes_[r]; }
  Index max_size() const;
  const std::vector<Index>& sizes() const { return sizes_; }
  std::span<const Index> positions(int r) const;
  int owner(Index p) const { return owner_[p]; }
  Index local_index(Index p) const { return local_[p]; }
  std::vector<Run> runs(int r) const;

 private:
  Layout(LayoutKind kind, std::vector<int> owner);
  void build_index();
  LayoutKind kind_;
  std::vector<Index> sizes_;
  std::vector<int> owner_;       // [S]
  std::vector<Index> local_;     // [S]
  std::vector<Index> offsets_;   // [N+1] into positions_
  std::vector<Index> positions_; // concatenated, rank-major, increasing within a rank
};

}  // namespace ringattn::core
