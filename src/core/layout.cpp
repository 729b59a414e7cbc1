#include "ringattn/core/layout.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ringattn/core/errors.hpp"

namespace ringattn::core {

std::optional<LayoutKind> layout_from_name(std::string_view name) {
  for (LayoutKind k : {LayoutKind::contiguous, LayoutKind::striped, LayoutKind::zigzag})
    if (name == layout_name(k)) return k;
  return std::nullopt;
}

const char* layout_name(LayoutKind k) {
  switch (k) {
    case LayoutKind::contiguous: return "contiguous";
    case LayoutKind::striped: return "striped";
    case LayoutKind::zigzag: return "zigzag";
  }
  return "?";
}

namespace {
LayoutStore g_store;
}  // namespace

void set_layout_store(LayoutStore store) { g_store = store; }

template <class Owner>
Layout Layout::build(LayoutKind kind, int ranks, std::string key, Owner&& owner) {
  using Shared = std::shared_ptr<const Tables>;
  if (g_store.find)
    if (const void* found = g_store.find(key)) return Layout(kind, *static_cast<const Shared*>(found), std::move(key));
  auto t = std::make_shared<Tables>();
  owner(t->owner);
  const Index S = static_cast<Index>(t->owner.size());
  // sizes, local indices and the per-rank position lists, from the owner map
  t->sizes.assign(ranks, 0);
  t->local.resize(S);
  for (Index p = 0; p < S; ++p) t->local[p] = t->sizes[t->owner[p]]++;
  t->offsets.assign(ranks + 1, 0);
  for (int r = 0; r < ranks; ++r) t->offsets[r + 1] = t->offsets[r] + t->sizes[r];
  t->positions.resize(S);
  for (Index p = 0; p < S; ++p) t->positions[t->offsets[t->owner[p]] + t->local[p]] = p;
  Shared shared = std::move(t);
  if (g_store.keep) g_store.keep(key, new Shared(shared));  // kept for the life of the process
  return Layout(kind, std::move(shared), std::move(key));
}

// Sizes of `parts` nearly equal pieces of `total`: the first total mod parts are one longer.
static std::vector<Index> balanced(Index total, Index parts) {
  std::vector<Index> sizes(parts, total / parts);
  for (Index i = 0; i < total % parts; ++i) ++sizes[i];
  return sizes;
}

Layout Layout::contiguous(Index S, int N) { return partitioned(balanced(S, N)); }

Layout Layout::partitioned(const std::vector<Index>& sizes) {
  // Preconditions (the plan checks the options before anything is built).
  if (sizes.empty()) throw InputError("Layout::partitioned: no sizes (expected one per rank)");
  Index S = 0;
  for (Index n : sizes) {
    if (n < 0) throw InputError(fmt::format("Layout::partitioned: size {} is negative (expected sizes >= 0)", n));
    S += n;
  }
  const int N = static_cast<int>(sizes.size());
  return build(LayoutKind::contiguous, N, fmt::format("contiguous [{}]", fmt::join(sizes, " ")),
               [&](std::vector<int>& owner) {
                 owner.reserve(S);
                 for (int r = 0; r < N; ++r) owner.insert(owner.end(), sizes[r], r);
               });
}

Layout Layout::striped(Index S, int N) {
  return build(LayoutKind::striped, N, fmt::format("striped S={} N={}", S, N), [&](std::vector<int>& owner) {
    owner.resize(S);
    for (Index p = 0; p < S; ++p) owner[p] = static_cast<int>(p % N);
  });
}

Layout Layout::zigzag(Index S, int N) {
  return build(LayoutKind::zigzag, N, fmt::format("zigzag S={} N={}", S, N), [&](std::vector<int>& owner) {
    const std::vector<Index> chunk = balanced(S, 2 * Index{N});
    owner.reserve(S);
    for (Index c = 0; c < 2 * N; ++c) owner.insert(owner.end(), chunk[c], static_cast<int>(c < N ? c : 2 * N - 1 - c));
  });
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
  return build(l.kind_, l.ranks() / U, fmt::format("{} grouped by {}", l.key_, U), [&](std::vector<int>& owner) {
    owner = l.t_->owner;
    for (int& o : owner) o /= U;
  });
}

Index Layout::max_size() const {
  return t_->sizes.empty() ? 0 : *std::max_element(t_->sizes.begin(), t_->sizes.end());
}

std::span<const Index> Layout::positions(int r) const {
  const std::vector<Index>& off = t_->offsets;
  return {t_->positions.data() + off[r], static_cast<std::size_t>(off[r + 1] - off[r])};
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
