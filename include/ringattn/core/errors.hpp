#pragma once
// Error kinds and the exit codes they map to (0 ok, 1 check failed,
// 2 bad input or usage, 3 runtime or communication failure).
#include <stdexcept>
#include <string>

namespace ringattn {

enum ExitCode : int { kExitOk = 0, kExitCheckFailed = 1, kExitBadInput = 2, kExitRuntime = 3 };

// Bad input or usage: a file, a shape, an option. The message is one line that names
// what is wrong, where, and what was expected.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A failure while the job runs (communication, timeout, I/O after validation).
struct RuntimeFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A runtime failure every rank has agreed on (so no rank is left waiting for a peer).
struct AgreedFailure : RuntimeFailure {
  using RuntimeFailure::RuntimeFailure;
};

}  // namespace ringattn
