#pragma once
// The MPI side of ringattn. This is the only layer that includes <mpi.h>, and only in its
// sources: the headers use opaque handles so runtime/ and apps/ compile without MPI.
//
// Every wait goes through one watchdog: with a timeout set (Comm::set_timeout), a transfer or a
// collective that does not complete in time ends the whole job with exit code 3 and one line
// naming what was waited for. While it waits, a rank polls with growing pauses instead of
// spinning, so a stalled peer does not keep its waiting neighbours at 100% CPU.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ringattn/comm/group.hpp"
#include "ringattn/core/function_ref.hpp"

namespace ringattn::comm {

// MPI_Init_thread / MPI_Finalize for the life of the process (RAII). Does nothing when MPI is
// already initialised (an embedding program or mpi4py did it) and then leaves finalising to it.
class Environment {
 public:
  Environment(int* argc, char*** argv);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

 private:
  bool owner_ = false;
};

double wtime();
// End the whole job now with `code` (MPI_Abort on the world communicator).
[[noreturn]] void abort_job(int code);

// A private duplicate of an MPI communicator, with the collectives the runtime needs.
class Comm final : public Group {
 public:
  static Comm world();
  // A duplicate of `native` (an MPI_Comm passed as a pointer-sized handle, e.g. from mpi4py).
  static Comm duplicate(void* native);
  // A duplicate of the application's communicator `*mpi_comm` (an MPI_Comm, whatever its type in
  // the MPI implementation: mpi4py's PyMPIComm_Get gives such a pointer). Collective over it; MPI
  // stays the application's to initialise and finalise.
  static Comm duplicate_of(const void* mpi_comm);
  Comm(Comm&&) noexcept;
  Comm& operator=(Comm&&) noexcept;
  ~Comm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int next() const { return (rank_ + 1) % size_; }
  int prev() const { return (rank_ - 1 + size_) % size_; }

  // Watchdog on every wait of this communicator and of what it makes (Exchange, split, reductions);
  // 0 = none.
  // Under SimGrid's SMPI there is none: MPI_Wtime is simulated time, each poll of the watchdog
  // would itself cost simulated time, and the simulator reports a deadlock on its own.
  void set_timeout(double seconds) {
#ifdef RINGATTN_SMPI
    seconds = 0;
#endif
    timeout_s_ = seconds;
  }
  double timeout() const { return timeout_s_; }

  void barrier() const override;
  void allreduce_max(std::span<double> v) const override;
  void allreduce_sum(std::span<double> v) const override;
  void allreduce_min(std::span<std::int64_t> v) const override;
  void allreduce_max(std::span<std::int64_t> v) const override;
  std::vector<std::byte> gather_bytes(std::span<const std::byte> mine, int root,
                                      std::vector<std::size_t>& counts) const override;
  void broadcast_bytes(std::span<std::byte> buf, int root) const override;

  // Personalised exchange: this rank sends send_counts[r] bytes at send_displs[r] to rank r and
  // receives recv_counts[r] bytes at recv_displs[r] from it (MPI_Ialltoallv, under the watchdog).
  // Returns the seconds spent waiting for it.
  double alltoallv(const void* send, std::span<const std::int64_t> send_counts,
                   std::span<const std::int64_t> send_displs, void* recv, std::span<const std::int64_t> recv_counts,
                   std::span<const std::int64_t> recv_displs, const std::string& what) const;
  // Ranks with the same colour form a new communicator, ordered by key then rank (collective).
  Comm split(int colour, int key) const;

  void* native() const;  // the MPI_Comm, for comm/ sources only

 private:
  Comm() = default;
  void set_from(const void* mpi_comm);  // duplicates *mpi_comm (an MPI_Comm)
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 0;
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
  // Every rank's `mine` (counts[q] bytes on rank q) into `recv` at displs[q], one collective over
  // the communicator (MPI_Iallgatherv; blocking where the MPI has no nonblocking collectives).
  void iallgatherv(const void* mine, void* recv, std::span<const std::int64_t> counts,
                   std::span<const std::int64_t> displs, const char* what);
  // Progress every pending transfer; true when none is left.
  bool test();
  // Complete every pending transfer and return the seconds spent waiting, under the
  // communicator's watchdog (describe() names what is waited for if it trips).
  double wait(core::FunctionRef<std::string()> describe);
  bool idle() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringattn::comm
