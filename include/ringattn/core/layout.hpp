#pragma once
// Which rank owns which global positions.
//   contiguous: consecutive ranges; balanced (first S mod N ranks one longer) or explicit sizes.
//   striped:    position p belongs to rank p mod N.
//   zigzag:     S cut into 2N chunks (first S mod 2N one longer); rank r owns chunks r and 2N-1-r.
// A rank stores its positions in increasing global order; local index = rank of the position
// within that order. Everything here is O(S) at most; copies of a Layout share its tables.
#include <memory>
#include <optional>
#include <string_view>
#include <span>
#include <string>
#include <vector>

#include "ringattn/core/shape.hpp"

namespace ringattn::core {

enum class LayoutKind { contiguous, striped, zigzag };
const char* layout_name(LayoutKind k);
std::optional<LayoutKind> layout_from_name(std::string_view name);  // the kind whose layout_name is `name`

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
  int ranks() const { return static_cast<int>(t_->sizes.size()); }
  Index seq() const { return static_cast<Index>(t_->owner.size()); }
  Index size(int r) const { return t_->sizes[r]; }
  Index max_size() const;
  const std::vector<Index>& sizes() const { return t_->sizes; }
  std::span<const Index> positions(int r) const;
  int owner(Index p) const { return t_->owner[p]; }
  Index local_index(Index p) const { return t_->local[p]; }
  std::vector<Run> runs(int r) const;

 private:
  struct Tables {
    std::vector<Index> sizes;      // [N]
    std::vector<int> owner;        // [S]
    std::vector<Index> local;      // [S]
    std::vector<Index> offsets;    // [N+1] into positions
    std::vector<Index> positions;  // concatenated, rank-major, increasing within a rank
  };
  Layout(LayoutKind kind, std::shared_ptr<const Tables> t, std::string key)
      : kind_(kind), t_(std::move(t)), key_(std::move(key)) {}
  // The layout `key` names, from the layout store when it has one, else from owner() (the owner of
  // each position for `ranks` ranks), then offered to the store.
  template <class Owner>
  static Layout build(LayoutKind kind, int ranks, std::string key, Owner&& owner);
  LayoutKind kind_;
  std::shared_ptr<const Tables> t_;
  std::string key_;  // what built the tables (kind and parameters), so equal layouts can share them
};

// Where layouts of equal parameters share their tables: the simulated ranks of one process each
// build the same layouts, 20 bytes per position each (10 GiB for 1024 ranks at S = 512K).
// find(key) returns what keep(key, tables) was given, or null; both opaque. Without a store (the
// default) every layout has tables of its own.
struct LayoutStore {
  const void* (*find)(const std::string& key) = nullptr;
  void (*keep)(const std::string& key, const void* tables) = nullptr;
};
void set_layout_store(LayoutStore store);

}  // namespace ringattn::core
