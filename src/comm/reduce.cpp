#include "ringattn/comm/reduce.hpp"

#include <mpi.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "ringattn/core/errors.hpp"
#include "mpi_util.hpp"

namespace ringattn::comm {

using detail::check;

namespace {


template <class T>
MPI_Datatype mpi_type() {
  return std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
}

int as_count(std::int64_t n) { return detail::as_count(n, "an ordered all-reduce"); }

enum class Phase { idle, scatter, gather, done };

}  // namespace

std::int64_t segment_begin(std::int64_t n, int N, int c) {
  const std::int64_t base = n / N, extra = n % N;
  return c * base + std::min<std::int64_t>(c, extra);
}

std::int64_t segment_size(std::int64_t n, int N, int c) { return n / N + (c < n % N ? 1 : 0); }

template <class T>
struct OrderedAllreduce<T>::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, N = 1;
  double timeout_s = 0;
  T* total = nullptr;
  Phase phase = Phase::idle;
  bool waited = false;  // wait() was called for the current reduction
  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<int> seg_counts, seg_displs;  // segment c of the whole buffer
  std::vector<int> own_counts, own_displs;  // every rank's piece of this rank's segment
  std::vector<T> pieces;                    // [N, own segment], rank-major
  double t_start = 0, sum_s = 0;
  ReduceStats stats;

  // Phase 1 is complete: add the pieces of this rank's segment in rank order, then share it.
  void finish_scatter() {
    const double t0 = MPI_Wtime();
    const std::int64_t len = own_counts[0], begin = seg_displs[rank];
    for (std::int64_t e = 0; e < len; ++e) {
      double acc = 0;
      for (int c = 0; c < N; ++c) acc += static_cast<double>(pieces[c * len + e]);
      total[begin + e] = static_cast<T>(acc);
    }
    sum_s += MPI_Wtime() - t0;
    check(MPI_Iallgatherv(MPI_IN_PLACE, 0, mpi_type<T>(), total, seg_counts.data(), seg_displs.data(), mpi_type<T>(),
                          comm, &req),
          "MPI_Iallgatherv");
    phase = Phase::gather;
  }

  void finish() {
    phase = Phase::done;
    stats.elapsed_s = MPI_Wtime() - t_start;
  }

  bool test() {
    int flag = 0;
    if (phase == Phase::scatter) {
      check(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test (reduce-scatter)");
      if (!flag) return false;
      finish_scatter();
    }
    if (phase == Phase::gather) {
      check(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test (allgather)");
      if (!flag) return false;
      finish();
    }
    return true;
  }
};

template <class T>
OrderedAllreduce<T>::OrderedAllreduce(const Comm& comm) : impl_(std::make_unique<Impl>()) {
  check(MPI_Comm_dup(detail::mpi(comm), &impl_->comm), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(impl_->comm, MPI_ERRORS_RETURN);
  impl_->timeout_s = comm.timeout();
  impl_->rank = comm.rank();
  impl_->N = comm.size();
}

template <class T>
OrderedAllreduce<T>::~OrderedAllreduce() {
  if (active()) {
    try {
      wait();
    } catch (const std::exception& e) {
      spdlog::error("rank {}: ordered all-reduce could not complete: {}", impl_->rank, e.what());
    }
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&impl_->comm);
}

template <class T>
bool OrderedAllreduce<T>::active() const {
  return impl_->phase == Phase::scatter || impl_->phase == Phase::gather;
}

template <class T>
const ReduceStats& OrderedAllreduce<T>::stats() const {
  return impl_->stats;
}

template <class T>
void OrderedAllreduce<T>::start(const T* partial, T* total, std::int64_t n) {
  Impl& m = *impl_;
  if (active()) throw RuntimeFailure("OrderedAllreduce::start: the previous reduction is still pending");
  const int N = m.N, r = m.rank;
  m.total = total;
  m.sum_s = 0;
  m.waited = false;
  m.stats = ReduceStats{};
  m.stats.elems = n;
  m.t_start = MPI_Wtime();
  as_count(n);  // displacements are ints too
  const std::int64_t own = segment_size(n, N, r);
  m.seg_counts.resize(N);
  m.seg_displs.resize(N);
  m.own_counts.assign(N, as_count(own));
  m.own_displs.resize(N);
  for (int c = 0; c < N; ++c) {
    m.seg_counts[c] = as_count(segment_size(n, N, c));
    m.seg_displs[c] = as_count(segment_begin(n, N, c));
    m.own_displs[c] = as_count(c * own);
  }
  m.stats.send_elems = (n - own) + (N - 1) * own;
  m.stats.recv_elems = (N - 1) * own + (n - own);
  if (N == 1) {  // the sum of one term is the term
    std::copy_n(partial, n, total);
    m.finish();
    return;
  }
  m.pieces.resize(N * own);
  check(MPI_Ialltoallv(partial, m.seg_counts.data(), m.seg_displs.data(), mpi_type<T>(), m.pieces.data(),
                       m.own_counts.data(), m.own_displs.data(), mpi_type<T>(), m.comm, &m.req),
        "MPI_Ialltoallv");
  m.phase = Phase::scatter;
}

template <class T>
bool OrderedAllreduce<T>::test() {
  return impl_->phase == Phase::done || (active() && impl_->test());
}

template <class T>
void OrderedAllreduce<T>::wait(core::FunctionRef<std::string()> describe) {
  Impl& m = *impl_;
  if (m.phase == Phase::idle || m.waited) return;
  m.waited = true;
  if (m.phase == Phase::done || m.test()) {  // already complete: hidden behind the caller's work
    m.stats.hidden = true;
    return;
  }
  const double sum_before = m.sum_s;
  const double t0 = MPI_Wtime();
  // Each phase completes under the watchdog; the reduce-scatter's completion starts the gather.
  while (active()) {
    detail::wait_all(1, &m.req, m.timeout_s, [&] {
      return describe ? describe() : "rank " + std::to_string(m.rank) + ": an ordered all-reduce";
    });
    if (m.phase == Phase::scatter) m.finish_scatter();
    else m.finish();
  }
  // Exposed = blocked; the rank-order sum of this rank's segment is compute, not waiting.
  m.stats.exposed_s = (MPI_Wtime() - t0) - (m.sum_s - sum_before);
}

template <class T>
ReduceStats ordered_allreduce(const Comm& comm, const T* partial, T* total, std::int64_t n) {
  OrderedAllreduce<T> red(comm);
  red.start(partial, total, n);
  red.wait();
  return red.stats();
}

template class OrderedAllreduce<float>;
template class OrderedAllreduce<double>;
template ReduceStats ordered_allreduce<float>(const Comm&, const float*, float*, std::int64_t);
template ReduceStats ordered_allreduce<double>(const Comm&, const double*, double*, std::int64_t);

}  // namespace ringattn::comm
