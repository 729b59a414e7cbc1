#pragma once
// The MPI side of ringattn. This is the only layer that includes <mpi.h>, and only in its
// sources: the headers use opaque handles so runtime/ and apps/ compile without MPI.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ringattn/core/function_ref.hpp"

namespace ringattn::comm {

// MPI_Init_thread / MPI_Finalize for the life of the process (RAII).
class Environment {
 public:
  Environment(int* argc, char*** argv);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
};

double wtime();
// End the whole job now with `code` (MPI_Abort on the world communicator).
[[noreturn]] void abort_job(int code);

// A private duplicate of MPI_COMM_WORLD, with the collectives the runtime needs.
class Comm {
 public:
  static Comm world();
  Comm(Comm&&) noexcept;
  Comm& operator=(Comm&&) noexcept;
  ~Comm();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int next() const { return (rank_ + 1) % size_; }
  int prev() const { return (rank_ - 1 + size_) % size_; }

  void barrier() const;
  // Agreement on errors: every rank passes its own error ("" when fine); every rank gets the
  // error of the lowest failing rank, or nothing. No rank is left waiting.
  std::optional<std::string> agree(const std::string& local_error) const;
  double max(double v) const;
  double sum(double v) const;
  void max_inplace(std::span<double> v) const;
  // Rank 0 receives every rank's values (size() * v.size(), rank-major); others get nothing.
  std::vector<double> gather(std::span<const double> v) const;
  void broadcast(std::span<double> v, int root) const;

  void* native() const;  // the MPI_Comm, for comm/ sources only

 private:
  Comm() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
};

// Outstanding nonblocking point-to-point transfers (MPI_Isend / MPI_Irecv). MPI does not
// progress large transfers on its own while a rank computes, so the owner calls test() between
// tiles. The destructor completes anything still pending.
class Exchange {
 public:
  explicit Exchange(const Comm& comm);
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  void isend(const void* buf, std::size_t bytes, int peer, int tag);
  void irecv(void* buf, std::size_t bytes, int peer, int tag);
  // Progress every pending transfer; true when none is left.
  bool test();
  // Complete every pending transfer and return the seconds spent waiting. With timeout_s > 0,
  // a wait longer than that logs describe() and aborts the job with exit code 3.
  double wait(double timeout_s, core::FunctionRef<std::string()> describe);
  bool idle() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringattn::comm
