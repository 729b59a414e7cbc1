#include "ringattn/comm/state_merge.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "mpi_util.hpp"

namespace ringattn::comm {

namespace {

template <class T>
MPI_Datatype mpi_type() {
  return std::is_same_v<T, double> ? MPI_DOUBLE : MPI_FLOAT;
}

// Under SimGrid's SMPI the collectives are the blocking ones, as in environment.cpp.
#ifdef RINGATTN_SMPI
constexpr bool kBlocking = true;
#else
constexpr bool kBlocking = false;
#endif

void complete(const Comm& comm, MPI_Request r, const char* what) {
  detail::wait_all(1, &r, comm.timeout(), [&] { return std::string(what) + " (rank " + std::to_string(comm.rank()) + ")"; });
}

// inout = merge(in, inout) for `len` records of the datatype's D + 2 values.
template <class T>
void merge_records(void* in, void* inout, int* len, MPI_Datatype* type) {
  int bytes = 0;
  MPI_Type_size(*type, &bytes);
  const int w = bytes / int(sizeof(T)), D = w - 2;
  const T* x = static_cast<const T*>(in);
  T* y = static_cast<T*>(inout);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (int r = 0; r < *len; ++r, x += w, y += w) {
    if (std::isnan(x[0]) || std::isnan(x[1]) || std::isnan(y[0]) || std::isnan(y[1])) {
      std::fill_n(y, w, std::numeric_limits<T>::quiet_NaN());
      continue;
    }
    if (x[0] == kNegInf) continue;  // nothing visible on that side
    if (y[0] == kNegInf) {
      std::copy_n(x, w, y);
      continue;
    }
    const T m = std::max(x[0], y[0]), cx = std::exp2(x[0] - m), cy = std::exp2(y[0] - m);
    y[0] = m;
    y[1] = cx * x[1] + cy * y[1];
    for (int d = 0; d < D; ++d) y[2 + d] = cx * x[2 + d] + cy * y[2 + d];
  }
}

}  // namespace

template <class T>
void all_gather_fixed(const Comm& comm, std::span<const T> mine, std::span<T> all) {
  const int n = detail::as_count(std::int64_t(mine.size()), "the merge's all-gather");
  if (kBlocking) {
    detail::check(MPI_Allgather(mine.data(), n, mpi_type<T>(), all.data(), n, mpi_type<T>(), detail::mpi(comm)),
                  "MPI_Allgather");
    return;
  }
  MPI_Request r;
  detail::check(MPI_Iallgather(mine.data(), n, mpi_type<T>(), all.data(), n, mpi_type<T>(), detail::mpi(comm), &r),
                "MPI_Iallgather");
  complete(comm, r, "the merge's all-gather");
}

// Recursive doubling with fixed partners: ranks r and r ^ 2^k exchange their merged records and
// each computes merge(theirs, mine). The merge is exactly commutative (max, and sums of two
// products, are the same bits in either order), so both partners hold the same bits after every
// round, and the association (the tree) depends on N alone: every rank returns the same records,
// and a run returns the same records as the last one with that N. With N not a power of two, the
// ranks past the largest power of two P first fold their records into rank r - P and get the
// result back at the end. log2 P rounds of B T H (D + 2) values: the latency-bound shape MPI's
// own small-message all-reduce has, but with an order the standard does not leave open.
template <class T>
void allreduce_states(const Comm& comm, std::span<T> records, int head_dim) {
  const int N = comm.size(), r = comm.rank();
  if (N == 1) return;
  const int w = head_dim + 2, len = int(records.size() / std::size_t(w));
  const int count = detail::as_count(std::int64_t(records.size()), "the merge's all-reduce");
  MPI_Datatype rec;
  detail::check(MPI_Type_contiguous(w, mpi_type<T>(), &rec), "MPI_Type_contiguous");
  MPI_Type_commit(&rec);
  std::vector<T> theirs(records.size());
  const MPI_Comm c = detail::mpi(comm);
  constexpr int kTag = 30517;  // the merge's messages only
  auto exchange = [&](int peer, bool send, bool recv) {
    MPI_Request req[2];
    int n = 0;
    if (recv) detail::check(MPI_Irecv(theirs.data(), count, mpi_type<T>(), peer, kTag, c, &req[n++]), "MPI_Irecv");
    if (send) detail::check(MPI_Isend(records.data(), count, mpi_type<T>(), peer, kTag, c, &req[n++]), "MPI_Isend");
    detail::wait_all(n, req, comm.timeout(), [&] {
      return "the merge's all-reduce with rank " + std::to_string(peer) + " (rank " + std::to_string(r) + ")";
    });
    if (recv) {
      int l = len;
      merge_records<T>(theirs.data(), records.data(), &l, &rec);
    }
  };
  int P = 1;
  while (P * 2 <= N) P *= 2;
  if (r >= P) {
    exchange(r - P, true, false);  // fold in, then wait for the result
    MPI_Request q;
    detail::check(MPI_Irecv(records.data(), count, mpi_type<T>(), r - P, kTag, c, &q), "MPI_Irecv");
    detail::wait_all(1, &q, comm.timeout(), [&] {
      return "the merge's all-reduce result from rank " + std::to_string(r - P) + " (rank " + std::to_string(r) + ")";
    });
  } else {
    if (r + P < N) exchange(r + P, false, true);
    for (int k = 1; k < P; k *= 2) exchange(r ^ k, true, true);
    if (r + P < N) exchange(r + P, true, false);
  }
  MPI_Type_free(&rec);
}

template <class T>
void allreduce_sum(const Comm& comm, std::span<T> values) {
  const int n = detail::as_count(std::int64_t(values.size()), "an all-reduce");
  if (kBlocking) {
    detail::check(MPI_Allreduce(MPI_IN_PLACE, values.data(), n, mpi_type<T>(), MPI_SUM, detail::mpi(comm)),
                  "MPI_Allreduce");
    return;
  }
  MPI_Request r;
  detail::check(MPI_Iallreduce(MPI_IN_PLACE, values.data(), n, mpi_type<T>(), MPI_SUM, detail::mpi(comm), &r),
                "MPI_Iallreduce");
  complete(comm, r, "an all-reduce");
}

template void all_gather_fixed<float>(const Comm&, std::span<const float>, std::span<float>);
template void all_gather_fixed<double>(const Comm&, std::span<const double>, std::span<double>);
template void allreduce_states<float>(const Comm&, std::span<float>, int);
template void allreduce_states<double>(const Comm&, std::span<double>, int);
template void allreduce_sum<float>(const Comm&, std::span<float>);
template void allreduce_sum<double>(const Comm&, std::span<double>);

}  // namespace ringattn::comm
