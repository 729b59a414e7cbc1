#pragma once
// One file per subcommand; main() parses, initialises MPI only for commands that need it, and
// maps exceptions to exit codes (0 ok, 1 check failed, 2 bad input or usage, 3 runtime failure).
#include "cli.hpp"

#include <functional>

#include "ringattn/comm/comm.hpp"

namespace ringattn::app {

struct Command {
  CLI::App* cli = nullptr;
  bool needs_mpi = true;
  // Called after a successful parse; returns the exit code, throws InputError / RuntimeFailure.
  std::function<int(comm::Comm*)> run;
};

// The launcher's rank and size before MPI is initialised (to let only rank 0 print parse errors,
// and to know whether other ranks wait for this one).
int launcher_rank();
int launcher_size();
std::string usage_message(const std::string& what);

Command add_run_command(CLI::App& parent);
Command add_lab_command(CLI::App& parent);
Command add_plan_command(CLI::App& parent);
Command add_probe_command(CLI::App& parent);
Command add_decode_command(CLI::App& parent);

}  // namespace ringattn::app
