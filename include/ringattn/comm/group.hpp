#pragma once
// The collectives a job needs across its ranks, as an interface. comm::Comm implements it over
// MPI; the unit tests implement it with threads, so the job harness runs without MPI.
//
// The virtual primitives move bytes and reduce arrays; the typed helpers on top gather, share and
// broadcast trivially copyable values (report rows, figures, events) without packing them into
// doubles by hand. Every call is collective: every rank of the group makes it, in the same order.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace ringattn::comm {

template <class T>
concept Trivial = std::is_trivially_copyable_v<T>;

class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void barrier() const = 0;
  // Element-wise over the ranks, in place, on every rank.
  virtual void allreduce_max(std::span<double> v) const = 0;
  virtual void allreduce_sum(std::span<double> v) const = 0;
  virtual void allreduce_min(std::span<std::int64_t> v) const = 0;
  virtual void allreduce_max(std::span<std::int64_t> v) const = 0;
  // Every rank's bytes concatenated in rank order, with each rank's count, on `root`; with
  // root < 0 on every rank. Ranks that are not the root get nothing.
  virtual std::vector<std::byte> gather_bytes(std::span<const std::byte> mine, int root,
                                              std::vector<std::size_t>& counts) const = 0;
  virtual void broadcast_bytes(std::span<std::byte> buf, int root) const = 0;

  double max(double v) const {
    allreduce_max(std::span<double>(&v, 1));
    return v;
  }
  double sum(double v) const {
    allreduce_sum(std::span<double>(&v, 1));
    return v;
  }

  // One value per rank, in rank order: on `root` (others get an empty vector), or on every rank.
  template <Trivial T>
  std::vector<T> gather(const T& mine, int root = 0) const {
    return flatten(gatherv(std::span<const T>(&mine, 1), root));
  }
  template <Trivial T>
  std::vector<T> all_gather(const T& mine) const {
    return flatten(gatherv(std::span<const T>(&mine, 1), -1));
  }
  // Any number of values per rank: result[r] is rank r's (on `root`, or everywhere with root < 0).
  template <Trivial T>
  std::vector<std::vector<T>> gatherv(std::span<const T> mine, int root = 0) const {
    std::vector<std::size_t> counts;
    const std::vector<std::byte> all =
        gather_bytes(std::as_bytes(mine), root, counts);
    std::vector<std::vector<T>> out;
    if (root >= 0 && rank() != root) return out;
    std::size_t at = 0;
    for (std::size_t c : counts) {
      std::vector<T> part(c / sizeof(T));
      if (c) std::memcpy(part.data(), all.data() + at, c);
      out.push_back(std::move(part));
      at += c;
    }
    return out;
  }
  template <Trivial T>
  std::vector<std::vector<T>> all_gatherv(std::span<const T> mine) const {
    return gatherv(mine, -1);
  }
  template <Trivial T>
  void broadcast(T& v, int root = 0) const {
    broadcast_bytes(std::as_writable_bytes(std::span<T>(&v, 1)), root);
  }
  // The root's vector, length included, on every rank.
  template <Trivial T>
  void broadcast(std::vector<T>& v, int root = 0) const {
    std::uint64_t n = v.size();
    broadcast(n, root);
    v.resize(n);
    broadcast_bytes(std::as_writable_bytes(std::span<T>(v)), root);
  }
  void broadcast(std::string& s, int root = 0) const {
    std::vector<char> v(s.begin(), s.end());
    broadcast(v, root);
    s.assign(v.begin(), v.end());
  }

  // Agreement on errors: every rank passes its own error ("" when fine); every rank gets the
  // error of the lowest failing rank, or nothing. Only fixed-size collectives come first, so ranks
  // that disagree about everything else still agree here.
  std::optional<std::string> agree(const std::string& local_error) const {
    std::int64_t first = local_error.empty() ? INT64_MAX : rank();
    allreduce_min(std::span<std::int64_t>(&first, 1));
    if (first == INT64_MAX) return std::nullopt;
    std::string msg = first == rank() ? local_error : std::string();
    broadcast(msg, static_cast<int>(first));
    return msg;
  }

 private:
  template <class T>
  static std::vector<T> flatten(std::vector<std::vector<T>> parts) {
    std::vector<T> out;
    for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  }
};

}  // namespace ringattn::comm
