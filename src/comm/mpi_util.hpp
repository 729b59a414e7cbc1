#pragma once
// What the comm sources share (private to src/comm): MPI return codes as exceptions, and the
// watchdog's way of ending a job.
#include <mpi.h>

#include <cstdio>
#include <string>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/errors.hpp"

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

// A transfer waited on longer than --timeout: one error line on stderr, like every other error
// and before MPI_Abort's own report, then the whole job ends with exit 3.
[[noreturn]] inline void timeout_abort(const std::string& what, double timeout_s) {
  std::fprintf(stderr, "ringattn: error: timeout: %s did not complete within --timeout %g s; aborting the job\n",
               what.c_str(), timeout_s);
  std::fflush(stderr);
  abort_job(kExitRuntime);
}

}  // namespace ringattn::comm::detail
