#pragma once
// What the comm sources share (private to src/comm): MPI return codes as exceptions, and the one
// watchdog every wait goes through.
#include <mpi.h>

#include <climits>
#include <string>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/core/function_ref.hpp"

namespace ringattn::comm::detail {

// Throws RuntimeFailure("what: MPI's message") unless rc is MPI_SUCCESS.
inline void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw RuntimeFailure(std::string(what) + ": " + std::string(msg, len));
  }
}

inline MPI_Comm mpi(const Comm& c) { return reinterpret_cast<MPI_Comm>(c.native()); }

// A byte count as MPI's int, or a RuntimeFailure naming the message.
inline int as_count(std::int64_t bytes, const char* what) {
  if (bytes < 0 || bytes > INT_MAX)
    throw RuntimeFailure(std::string(what) + ": a message of " + std::to_string(bytes) +
                         " bytes exceeds MPI's int count");
  return static_cast<int>(bytes);
}

// Completes `n` requests. With timeout_s > 0 it polls, pausing a little longer each round once
// the first millisecond has passed, and ends the job with exit 3 when timeout_s runs out (one
// line naming describe()). Returns the seconds spent.
double wait_all(int n, MPI_Request* reqs, double timeout_s, core::FunctionRef<std::string()> describe);

}  // namespace ringattn::comm::detail
