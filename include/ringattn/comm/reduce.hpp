#pragma once
// Summing a buffer over every rank with a result that is bitwise the same on every rank and on
// every run. MPI_Allreduce promises neither: the algorithm (and so the order of the additions)
// may depend on the message size, the rank count and the network. Here the order is fixed:
//   phase 1 (reduce-scatter, MPI_Ialltoallv): the buffer is cut into N balanced segments; rank c
//            receives every rank's piece of segment c and adds them in rank order 0, 1, .., N-1
//            (in double, rounded once to T);
//   phase 2 (MPI_Iallgatherv): every rank receives every summed segment.
// Every element is therefore the same rank-ordered sum, computed once by one rank and copied,
// and each rank moves 2 (N-1)/N of the buffer each way, as a ring all-reduce does.
// Both phases are nonblocking: start() returns at once, test() progresses (and starts phase 2
// when phase 1 is done), wait() completes. MPI progresses the transfers only inside MPI calls,
// so a caller that wants overlap calls test() (or any other MPI test) while it computes.
#include <cstdint>
#include <memory>
#include <string>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/function_ref.hpp"

namespace ringattn::comm {

// What one rank's reduction moved and how long it took.
struct ReduceStats {
  std::int64_t elems = 0;                      // length of the buffer summed
  std::int64_t send_elems = 0, recv_elems = 0;  // both phases, this rank
  double elapsed_s = 0;   // from start() to the moment completion was observed
  double exposed_s = 0;   // time blocked in wait() on transfers that had not completed
  bool hidden = false;    // complete before wait() was called: nothing was exposed
};

// First element and length of segment c when n elements are cut into N balanced segments
// (the first n mod N one longer).
std::int64_t segment_begin(std::int64_t n, int N, int c);
std::int64_t segment_size(std::int64_t n, int N, int c);

// Each instance works on its own duplicate of the communicator: when two reductions are in flight,
// one rank may start the second's phase 1 before the first's phase 2 and another rank after, and
// MPI matches collectives on one communicator by the order they were started in.
template <class T>
class OrderedAllreduce {
 public:
  // Collective (duplicates the communicator): every rank constructs its instances in one order.
  explicit OrderedAllreduce(const Comm& comm);
  // Completes a reduction still pending (every rank must have started it), then frees the
  // duplicate communicator.
  ~OrderedAllreduce();
  OrderedAllreduce(const OrderedAllreduce&) = delete;
  OrderedAllreduce& operator=(const OrderedAllreduce&) = delete;

  // Start summing this rank's `partial` [n] into `total` [n] on every rank. Both must stay alive
  // and `partial` unmodified until wait() returns; `total` may not alias `partial`.
  void start(const T* partial, T* total, std::int64_t n);
  // Progress without blocking; true once `total` holds the sum.
  bool test();
  // Complete the reduction, under the communicator's watchdog (describe() names it if it trips).
  void wait(core::FunctionRef<std::string()> describe = {});
  bool active() const;
  const ReduceStats& stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Blocking form: start + wait.
template <class T>
ReduceStats ordered_allreduce(const Comm& comm, const T* partial, T* total, std::int64_t n);

}  // namespace ringattn::comm
