#include <mpi.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "mpi_util.hpp"
#include "ringattn/comm/comm.hpp"
#include "ringattn/comm/simulation.hpp"
#include "ringattn/core/errors.hpp"

namespace ringattn::comm {

using detail::check;

namespace {
// Under SimGrid's SMPI there is no watchdog (see Comm::set_timeout) and the collectives are the
// blocking ones: SMPI runs those with its tuned algorithms, while its nonblocking collectives fan
// out point to point, N^2 messages for an all-gather (minutes at 1024 simulated ranks).
#ifdef RINGATTN_SMPI
constexpr bool kBlockingCollectives = true;
#else
constexpr bool kBlockingCollectives = false;
#endif
}  // namespace

Environment::Environment(int* argc, char*** argv) {
  share_layouts();  // simulated ranks: one copy of each layout's tables per process
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) return;
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  owner_ = true;
  // Errors come back as codes and become exceptions, instead of MPI aborting silently.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

Environment::~Environment() {
  if (!owner_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

double wtime() { return MPI_Wtime(); }

void abort_job(int code) {
  spdlog::default_logger()->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // not reached
}

double detail::wait_all(int n, MPI_Request* reqs, double timeout_s, core::FunctionRef<std::string()> describe) {
  if (n == 0) return 0.0;
  const double t0 = MPI_Wtime();
  if (timeout_s <= 0) {
    check(MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE), "MPI_Waitall");
    return MPI_Wtime() - t0;
  }
  double pause = 0;  // seconds between polls once the first millisecond has passed
  for (;;) {
    int done = 0;
    check(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    const double waited = MPI_Wtime() - t0;
    if (done) return waited;
    if (waited > timeout_s) {
      // One line, on this rank's log (tagged with the rank), then the whole job ends.
      spdlog::error("timeout: {} did not complete within --timeout {} s; aborting the job",
                    describe ? describe() : std::string("a transfer"), timeout_s);
      abort_job(kExitRuntime);
    }
    if (waited > 1e-3) {
      pause = std::min(1e-3, std::max(2e-5, 1.5 * pause));
      std::this_thread::sleep_for(std::chrono::duration<double>(pause));
    }
  }
}

struct Comm::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  ~Impl() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm);
  }
};

void Comm::set_from(const void* mpi_comm) {
  impl_ = std::make_unique<Impl>();
  check(MPI_Comm_dup(*static_cast<const MPI_Comm*>(mpi_comm), &impl_->comm), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(impl_->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(impl_->comm, &rank_);
  MPI_Comm_size(impl_->comm, &size_);
}

Comm Comm::world() {
  Comm c;
  const MPI_Comm world = MPI_COMM_WORLD;
  c.set_from(&world);
  return c;
}

Comm Comm::duplicate(void* native) {
  Comm c;
  const MPI_Comm mpi = reinterpret_cast<MPI_Comm>(native);
  c.set_from(&mpi);
  return c;
}

Comm Comm::duplicate_of(const void* mpi_comm) {
  Comm c;
  c.set_from(mpi_comm);
  return c;
}

Comm::Comm(Comm&&) noexcept = default;
Comm& Comm::operator=(Comm&&) noexcept = default;
Comm::~Comm() = default;

void* Comm::native() const { return reinterpret_cast<void*>(impl_->comm); }

namespace {
std::string collective(const char* name, int rank) {
  return std::string(name) + " on rank " + std::to_string(rank) +
         " (a peer has not reached it: it stopped, or its work takes longer than the timeout)";
}
}  // namespace

void Comm::barrier() const {
  if (kBlockingCollectives) return check(MPI_Barrier(impl_->comm), "MPI_Barrier");
  MPI_Request r;
  check(MPI_Ibarrier(impl_->comm, &r), "MPI_Ibarrier");
  detail::wait_all(1, &r, timeout_s_, [&] { return collective("a barrier", rank_); });
}

template <class T>
static void allreduce(const Comm& c, std::span<T> v, MPI_Datatype type, MPI_Op op, double timeout, const char* what) {
  if (kBlockingCollectives)
    return check(MPI_Allreduce(MPI_IN_PLACE, v.data(), detail::as_count(std::int64_t(v.size()), what), type, op,
                               detail::mpi(c)),
                 "MPI_Allreduce");
  MPI_Request r;
  check(MPI_Iallreduce(MPI_IN_PLACE, v.data(), detail::as_count(std::int64_t(v.size()), what), type, op,
                       detail::mpi(c), &r),
        "MPI_Iallreduce");
  detail::wait_all(1, &r, timeout, [&] { return collective(what, c.rank()); });
}

void Comm::allreduce_max(std::span<double> v) const {
  allreduce(*this, v, MPI_DOUBLE, MPI_MAX, timeout_s_, "an all-reduce");
}
void Comm::allreduce_sum(std::span<double> v) const {
  allreduce(*this, v, MPI_DOUBLE, MPI_SUM, timeout_s_, "an all-reduce");
}
void Comm::allreduce_min(std::span<std::int64_t> v) const {
  allreduce(*this, v, MPI_INT64_T, MPI_MIN, timeout_s_, "an all-reduce");
}
void Comm::allreduce_max(std::span<std::int64_t> v) const {
  allreduce(*this, v, MPI_INT64_T, MPI_MAX, timeout_s_, "an all-reduce");
}

std::vector<std::byte> Comm::gather_bytes(std::span<const std::byte> mine, int root,
                                          std::vector<std::size_t>& counts) const {
  // Every rank's count first (fixed size), then the bytes.
  std::vector<int> n(size_);
  const int own = detail::as_count(std::int64_t(mine.size()), "a gather");
  MPI_Request r;
  if (kBlockingCollectives) {
    check(MPI_Allgather(&own, 1, MPI_INT, n.data(), 1, MPI_INT, impl_->comm), "MPI_Allgather");
  } else {
    check(MPI_Iallgather(&own, 1, MPI_INT, n.data(), 1, MPI_INT, impl_->comm, &r), "MPI_Iallgather");
    detail::wait_all(1, &r, timeout_s_, [&] { return collective("a gather", rank_); });
  }
  std::vector<int> displs(size_, 0);
  std::int64_t total = 0;
  for (int q = 0; q < size_; ++q) {
    displs[q] = detail::as_count(total, "a gather");
    total += n[q];
  }
  detail::as_count(total, "a gather");
  const bool here = root < 0 || root == rank_;
  std::vector<std::byte> all(here ? std::size_t(total) : 0);
  counts.assign(n.begin(), n.end());
  if (!here) counts.clear();
  if (kBlockingCollectives) {
    if (root < 0)
      check(MPI_Allgatherv(mine.data(), own, MPI_BYTE, all.data(), n.data(), displs.data(), MPI_BYTE, impl_->comm),
            "MPI_Allgatherv");
    else
      check(MPI_Gatherv(mine.data(), own, MPI_BYTE, all.data(), n.data(), displs.data(), MPI_BYTE, root, impl_->comm),
            "MPI_Gatherv");
    return all;
  }
  if (root < 0)
    check(MPI_Iallgatherv(mine.data(), own, MPI_BYTE, all.data(), n.data(), displs.data(), MPI_BYTE, impl_->comm, &r),
          "MPI_Iallgatherv");
  else
    check(MPI_Igatherv(mine.data(), own, MPI_BYTE, all.data(), n.data(), displs.data(), MPI_BYTE, root, impl_->comm,
                       &r),
          "MPI_Igatherv");
  detail::wait_all(1, &r, timeout_s_, [&] { return collective("a gather", rank_); });
  return all;
}

void Comm::broadcast_bytes(std::span<std::byte> buf, int root) const {
  if (kBlockingCollectives)
    return check(MPI_Bcast(buf.data(), detail::as_count(std::int64_t(buf.size()), "a broadcast"), MPI_BYTE, root,
                           impl_->comm),
                 "MPI_Bcast");
  MPI_Request r;
  check(MPI_Ibcast(buf.data(), detail::as_count(std::int64_t(buf.size()), "a broadcast"), MPI_BYTE, root, impl_->comm,
                   &r),
        "MPI_Ibcast");
  detail::wait_all(1, &r, timeout_s_, [&] { return collective("a broadcast", rank_); });
}

double Comm::alltoallv(const void* send, std::span<const std::int64_t> send_counts,
                       std::span<const std::int64_t> send_displs, void* recv,
                       std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> recv_displs,
                       const std::string& what) const {
  std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
  for (int q = 0; q < size_; ++q) {
    sc[q] = detail::as_count(send_counts[q], what.c_str());
    sd[q] = detail::as_count(send_displs[q], what.c_str());
    rc[q] = detail::as_count(recv_counts[q], what.c_str());
    rd[q] = detail::as_count(recv_displs[q], what.c_str());
  }
  if (kBlockingCollectives) {
    const double t0 = MPI_Wtime();
    check(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, impl_->comm),
          "MPI_Alltoallv");
    return MPI_Wtime() - t0;
  }
  MPI_Request r;
  check(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, impl_->comm, &r),
        "MPI_Ialltoallv");
  return detail::wait_all(1, &r, timeout_s_, [&] { return what + " on rank " + std::to_string(rank_); });
}

Comm Comm::split(int colour, int key) const {
  MPI_Comm out = MPI_COMM_NULL;
  check(MPI_Comm_split(impl_->comm, colour, key, &out), "MPI_Comm_split");
  Comm c;
  c.impl_ = std::make_unique<Impl>();
  c.impl_->comm = out;
  MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
  MPI_Comm_rank(out, &c.rank_);
  MPI_Comm_size(out, &c.size_);
  c.timeout_s_ = timeout_s_;
  return c;
}

// ---- Exchange -------------------------------------------------------------------------------

struct Exchange::Impl {
  MPI_Comm comm;
  double timeout_s;
  std::vector<MPI_Request> reqs;
  std::vector<std::vector<int>> counts;  // a nonblocking collective's count arrays, alive until it completes
};

Exchange::Exchange(const Comm& comm) : impl_(std::make_unique<Impl>()) {
  impl_->comm = detail::mpi(comm);
  impl_->timeout_s = comm.timeout();
  impl_->reqs.reserve(4);
}

Exchange::~Exchange() {
  if (!impl_->reqs.empty()) MPI_Waitall(static_cast<int>(impl_->reqs.size()), impl_->reqs.data(), MPI_STATUSES_IGNORE);
}

void Exchange::isend(const void* buf, std::size_t bytes, int peer, int tag) {
  MPI_Request r;
  check(MPI_Isend(buf, detail::as_count(std::int64_t(bytes), "MPI_Isend"), MPI_BYTE, peer, tag, impl_->comm, &r),
        "MPI_Isend");
  impl_->reqs.push_back(r);
}

void Exchange::irecv(void* buf, std::size_t bytes, int peer, int tag) {
  MPI_Request r;
  check(MPI_Irecv(buf, detail::as_count(std::int64_t(bytes), "MPI_Irecv"), MPI_BYTE, peer, tag, impl_->comm, &r),
        "MPI_Irecv");
  impl_->reqs.push_back(r);
}

void Exchange::iallgatherv(const void* mine, void* recv, std::span<const std::int64_t> counts,
                           std::span<const std::int64_t> displs, const char* what) {
  int rank = 0;
  MPI_Comm_rank(impl_->comm, &rank);
  std::vector<int> c(counts.size()), d(displs.size());
  for (std::size_t q = 0; q < counts.size(); ++q) {
    c[q] = detail::as_count(counts[q], what);
    d[q] = detail::as_count(displs[q], what);
  }
  if (kBlockingCollectives) {
    check(MPI_Allgatherv(mine, c[rank], MPI_BYTE, recv, c.data(), d.data(), MPI_BYTE, impl_->comm), "MPI_Allgatherv");
    return;
  }
  MPI_Request r;
  check(MPI_Iallgatherv(mine, c[rank], MPI_BYTE, recv, c.data(), d.data(), MPI_BYTE, impl_->comm, &r),
        "MPI_Iallgatherv");
  impl_->reqs.push_back(r);
  impl_->counts.push_back(std::move(c));
  impl_->counts.push_back(std::move(d));
}

bool Exchange::test() {
  if (impl_->reqs.empty()) return true;
  int done = 0;
  check(MPI_Testall(static_cast<int>(impl_->reqs.size()), impl_->reqs.data(), &done, MPI_STATUSES_IGNORE),
        "MPI_Testall");
  if (done) {
    impl_->reqs.clear();
    impl_->counts.clear();
  }
  return done != 0;
}

double Exchange::wait(core::FunctionRef<std::string()> describe) {
  const double w =
      detail::wait_all(static_cast<int>(impl_->reqs.size()), impl_->reqs.data(), impl_->timeout_s, describe);
  impl_->reqs.clear();
  impl_->counts.clear();
  return w;
}

bool Exchange::idle() const { return impl_->reqs.empty(); }

}  // namespace ringattn::comm
