#include <mpi.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/errors.hpp"
#include "mpi_util.hpp"

namespace ringattn::comm {

using detail::check;

Environment::Environment(int* argc, char*** argv) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  // Errors come back as codes and become exceptions, instead of MPI aborting silently.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

Environment::~Environment() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

double wtime() { return MPI_Wtime(); }

void abort_job(int code) {
  spdlog::default_logger()->flush();
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // not reached
}

struct Comm::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  ~Impl() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm);
  }
};

Comm Comm::world() {
  Comm c;
  c.impl_ = std::make_unique<Impl>();
  check(MPI_Comm_dup(MPI_COMM_WORLD, &c.impl_->comm), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(c.impl_->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c.impl_->comm, &c.rank_);
  MPI_Comm_size(c.impl_->comm, &c.size_);
  return c;
}

Comm::Comm(Comm&&) noexcept = default;
Comm& Comm::operator=(Comm&&) noexcept = default;
Comm::~Comm() = default;

void* Comm::native() const { return reinterpret_cast<void*>(impl_->comm); }

void Comm::barrier() const { check(MPI_Barrier(impl_->comm), "MPI_Barrier"); }

std::optional<std::string> Comm::agree(const std::string& local_error) const {
  int mine = local_error.empty() ? INT_MAX : rank_;
  int first = INT_MAX;
  check(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, impl_->comm), "MPI_Allreduce");
  if (first == INT_MAX) return std::nullopt;
  // The lowest failing rank tells everyone what went wrong.
  int len = first == rank_ ? static_cast<int>(local_error.size()) : 0;
  check(MPI_Bcast(&len, 1, MPI_INT, first, impl_->comm), "MPI_Bcast");
  std::string msg(len, '\0');
  if (first == rank_) msg = local_error;
  check(MPI_Bcast(msg.data(), len, MPI_CHAR, first, impl_->comm), "MPI_Bcast");
  return msg;
}

double Comm::max(double v) const {
  double out = 0;
  check(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, impl_->comm), "MPI_Allreduce");
  return out;
}

double Comm::sum(double v) const {
  double out = 0;
  check(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, impl_->comm), "MPI_Allreduce");
  return out;
}

void Comm::max_inplace(std::span<double> v) const {
  check(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MAX, impl_->comm),
        "MPI_Allreduce");
}

std::vector<double> Comm::gather(std::span<const double> v) const {
  std::vector<double> all(rank_ == 0 ? v.size() * size_ : 0);
  check(MPI_Gather(v.data(), static_cast<int>(v.size()), MPI_DOUBLE, all.data(), static_cast<int>(v.size()),
                   MPI_DOUBLE, 0, impl_->comm),
        "MPI_Gather");
  return all;
}

void Comm::broadcast(std::span<double> v, int root) const {
  check(MPI_Bcast(v.data(), static_cast<int>(v.size()), MPI_DOUBLE, root, impl_->comm), "MPI_Bcast");
}

// ---- Exchange -------------------------------------------------------------------------------

struct Exchange::Impl {
  MPI_Comm comm;
  std::vector<MPI_Request> reqs;
};

Exchange::Exchange(const Comm& comm) : impl_(std::make_unique<Impl>()) {
  impl_->comm = reinterpret_cast<MPI_Comm>(comm.native());
  impl_->reqs.reserve(4);
}

Exchange::~Exchange() {
  if (!impl_->reqs.empty()) MPI_Waitall(static_cast<int>(impl_->reqs.size()), impl_->reqs.data(), MPI_STATUSES_IGNORE);
}

static int byte_count(std::size_t bytes) {
  if (bytes > static_cast<std::size_t>(INT_MAX))
    throw RuntimeFailure("a single message of " + std::to_string(bytes) + " bytes exceeds MPI's int count");
  return static_cast<int>(bytes);
}

void Exchange::isend(const void* buf, std::size_t bytes, int peer, int tag) {
  MPI_Request r;
  check(MPI_Isend(buf, byte_count(bytes), MPI_BYTE, peer, tag, impl_->comm, &r), "MPI_Isend");
  impl_->reqs.push_back(r);
}

void Exchange::irecv(void* buf, std::size_t bytes, int peer, int tag) {
  MPI_Request r;
  check(MPI_Irecv(buf, byte_count(bytes), MPI_BYTE, peer, tag, impl_->comm, &r), "MPI_Irecv");
  impl_->reqs.push_back(r);
}

bool Exchange::test() {
  if (impl_->reqs.empty()) return true;
  int done = 0;
  check(MPI_Testall(static_cast<int>(impl_->reqs.size()), impl_->reqs.data(), &done, MPI_STATUSES_IGNORE),
        "MPI_Testall");
  if (done) impl_->reqs.clear();
  return done != 0;
}

double Exchange::wait(double timeout_s, core::FunctionRef<std::string()> describe) {
  if (impl_->reqs.empty()) return 0.0;
  const double t0 = MPI_Wtime();
  if (timeout_s <= 0) {
    check(MPI_Waitall(static_cast<int>(impl_->reqs.size()), impl_->reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    impl_->reqs.clear();
    return MPI_Wtime() - t0;
  }
  // Watchdog: poll, and end the job if a peer never answers.
  while (!test()) {
    if (MPI_Wtime() - t0 > timeout_s) {
      detail::timeout_abort(describe(), timeout_s);
    }
  }
  return MPI_Wtime() - t0;
}

bool Exchange::idle() const { return impl_->reqs.empty(); }

}  // namespace ringattn::comm
