#include "ringattn/comm/state_merge.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

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

template <class T>
void allreduce_states(const Comm& comm, std::span<T> records, int head_dim) {
  MPI_Datatype rec;
  detail::check(MPI_Type_contiguous(head_dim + 2, mpi_type<T>(), &rec), "MPI_Type_contiguous");
  MPI_Type_commit(&rec);
  MPI_Op op;
  detail::check(MPI_Op_create(&merge_records<T>, 1, &op), "MPI_Op_create");
  const int n = detail::as_count(std::int64_t(records.size()) / (head_dim + 2), "the merge's all-reduce");
  // Blocking: Open MPI runs a user operation inside MPI calls either way.
  const int rc = MPI_Allreduce(MPI_IN_PLACE, records.data(), n, rec, op, detail::mpi(comm));
  MPI_Op_free(&op);
  MPI_Type_free(&rec);
  detail::check(rc, "MPI_Allreduce");
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
