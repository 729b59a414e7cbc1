#include "ringattn/core/layout.hpp"

#include <algorithm>
#include <fmt/format.h>

#include "ringattn/core/errors.hpp"

namespace ringattn::core {

LayoutKind parse_layout_kind(const std::string& name) {
  if (name == "contiguous") return LayoutKind::contiguous;
  if (name == "striped") return LayoutKind::striped;
  if (name == "zigzag") return LayoutKind::zigzag;
  throw InputError(fmt::format("--layout: unknown layout '{}' (expected contiguous, striped or zigzag)", name));
}

const char* layout_name(LayoutKind k) {
  switch (k) {
    case LayoutKind::contiguous: return "contiguous";
    case LayoutKind::striped: return "striped";
    case LayoutKind::zigzag: return "zigzag";
  }
  return "?";
}

Layout::Layout(LayoutKind kind, std::vector<int> owner) : kind_(kind), owner_(std::move(owner)) {}

// Sizes of `parts` nearly equal pieces of `total`: the first total mod parts are one longer.
static std::vector<Index> balanced(Index total, Index parts) {
  std::vector<Index> sizes(parts, total / parts);
  for (Index i = 0; i < total % parts; ++i) ++sizes[i];
  return sizes;
}

Layout Layout::contiguous(Index S, int N) { return partitioned(balanced(S, N)); }

Layout Layout::partitioned(const std::vector<Index>& sizes) {
  if (sizes.empty()) throw InputError("--partition: needs one size per rank");
  Index S = 0;
  for (Index n : sizes) {
    if (n < 0) throw InputError(fmt::format("--partition: size {} is negative (sizes must be >= 0)", n));
    S += n;
  }
  std::vector<int> owner;
  owner.reserve(S);
  for (int r = 0; r < static_cast<int>(sizes.size()); ++r) owner.insert(owner.end(), sizes[r], r);
  Layout l(LayoutKind::contiguous, std::move(owner));
  l.sizes_ = sizes;
  l.build_index();
  return l;
}

Layout Layout::striped(Index S, int N) {
  std::vector<int> owner(S);
  for (Index p = 0; p < S; ++p) owner[p] = static_cast<int>(p % N);
  Layout l(LayoutKind::striped, std::move(owner));
  l.sizes_.assign(N, 0);
  l.build_index();
  return l;
}

Layout Layout::zigzag(Index S, int N) {
  std::vector<Index> chunk = balanced(S, 2 * Index{N});
  std::vector<int> owner;
  owner.reserve(S);
  for (Index c = 0; c < 2 * N; ++c) {
    int r = static_cast<int>(c < N ? c : 2 * N - 1 - c);
    owner.insert(owner.end(), chunk[c], r);
  }
  Layout l(LayoutKind::zigzag, std::move(owner));
  l.sizes_.assign(N, 0);
  l.build_index();
  return l;
}

Layout Layout::make(LayoutKind kind, Index S, int N, const std::vector<Index>& partition) {
  switch (kind) {
    case LayoutKind::contiguous: return partition.empty() ? contiguous(S, N) : partitioned(partition);
    case LayoutKind::striped: return striped(S, N);
    case LayoutKind::zigzag: return zigzag(S, N);
  }
  throw InputError("unknown layout");
}

Layout Layout::grouped(const Layout& l, int U) {
  if (U < 1 || l.ranks() % U != 0)
    throw InputError(fmt::format("a group of {} ranks does not divide {} ranks", U, l.ranks()));
  std::vector<int> owner(l.owner_);
  for (int& o : owner) o /= U;
  Layout g(l.kind_, std::move(owner));
  g.sizes_.assign(l.ranks() / U, 0);
  g.build_index();
  return g;
}

// Derive sizes, local indices and per-rank position lists from the owner map.
void Layout::build_index() {
  const int N = static_cast<int>(sizes_.size());
  const Index S = seq();
  std::fill(sizes_.begin(), sizes_.end(), 0);
  local_.resize(S);
  for (Index p = 0; p < S; ++p) local_[p] = sizes_[owner_[p]]++;
  offsets_.assign(N + 1, 0);
  for (int r = 0; r < N; ++r) offsets_[r + 1] = offsets_[r] + sizes_[r];
  positions_.resize(S);
  for (Index p = 0; p < S; ++p) positions_[offsets_[owner_[p]] + local_[p]] = p;
}

Index Layout::max_size() const { return sizes_.empty() ? 0 : *std::max_element(sizes_.begin(), sizes_.end()); }

std::span<const Index> Layout::positions(int r) const {
  return {positions_.data() + offsets_[r], static_cast<std::size_t>(offsets_[r + 1] - offsets_[r])};
}

std::vector<Run> Layout::runs(int r) const {
  std::vector<Run> out;
  auto pos = positions(r);
  for (Index i = 0; i < static_cast<Index>(pos.size()); ++i) {
    if (!out.empty() && out.back().global_begin + out.back().length == pos[i]) {
      ++out.back().length;
    } else {
      out.push_back({pos[i], i, 1});
    }
  }
  return out;
}

}  // namespace ringattn::core
