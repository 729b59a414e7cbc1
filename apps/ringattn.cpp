// ringattn: exact ring attention over MPI ranks. Thin: parse into a config, call the library,
// print, return the exit code (0 ok, 1 check failed, 2 bad input or usage, 3 runtime failure).
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <optional>

#include "commands.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/core/simd.hpp"
#include "ringattn/runtime/staged_outputs.hpp"

using namespace ringattn;

namespace ringattn::app {
int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}

int launcher_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 1;
}

// Whether `name` is a flag (an option that takes no value) of one of cli's subcommands.
bool is_flag(const CLI::App& cli, const std::string& name) {
  for (const CLI::App* sub : cli.get_subcommands([](const CLI::App*) { return true; }))
    if (const CLI::Option* o = sub->get_option_no_throw(name)) return o->get_items_expected_max() == 0;
  return false;
}

// CLI11's words said plainly, the option first as in every other line: a repeated option ("--seq: At
// Most 1 required but received 2") and a value it could not convert ("Could not convert: --scale =
// abc": a floating option's, or a flag's --causal=abc; the integer options have their own check).
std::string usage_message(const std::string& what, const CLI::App& cli) {
  const std::string repeated = ": At Most 1 required but received ";
  if (const auto at = what.find(repeated); at != std::string::npos)
    return fmt::format("{}: given {} times (expected once) (see 'ringattn --help')", what.substr(0, at),
                       what.substr(at + repeated.size()));
  const std::string convert = "Could not convert: ";
  if (const auto eq = what.find(" = "); what.starts_with(convert) && eq != std::string::npos) {
    const std::string name = what.substr(convert.size(), eq - convert.size());
    return fmt::format("{}: '{}' is not {} (see 'ringattn --help')", name, what.substr(eq + 3),
                       is_flag(cli, name) ? "true or false" : "a number");
  }
  return what + " (see 'ringattn --help')";
}
}  // namespace ringattn::app

int main(int argc, char** argv) {
  CLI::App cli{"ringattn: exact ring attention over MPI ranks"};
  cli.require_subcommand(1);
  std::vector<app::Command> commands = {app::add_run_command(cli), app::add_plan_command(cli),
                                        app::add_probe_command(cli), app::add_lab_command(cli),
                                        app::add_decode_command(cli)};

  // Every rank parses its argv. A usage error ends the job with exit 2 on every rank: without MPI
  // when this rank is alone; under a launcher the ranks agree first, so a rank whose options are
  // fine is not left waiting for one whose are not.
  const int launcher_rank = app::launcher_rank();
  std::string usage_error;
  try {
    cli.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (launcher_rank == 0) std::fputs(cli.help().c_str(), stdout);
    return kExitOk;
  } catch (const CLI::CallForAllHelp&) {
    if (launcher_rank == 0) std::fputs(cli.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    usage_error = app::usage_message(e.what(), cli);
  }
  if (!usage_error.empty()) {
    // Rank 0 says it before MPI_Finalize: a peer that finalizes and exits first makes the launcher
    // end the job, and rank 0 with it.
    std::optional<comm::Environment> env;
    if (app::launcher_size() > 1) {
      env.emplace(&argc, &argv);
      comm::Comm::world().agree(usage_error);
    }
    if (launcher_rank == 0) fmt::print(stderr, "ringattn: error: {}\n", usage_error);
    return kExitBadInput;
  }
  app::Command* cmd = nullptr;
  for (auto& c : commands)
    if (c.cli->parsed()) cmd = &c;

  std::optional<comm::Environment> env;
  std::optional<comm::Comm> world;
#ifndef RINGATTN_SMPI
  runtime::install_exit_signal_handlers();  // SIGINT/SIGTERM/SIGHUP: clean up, exit 128 + signal
#endif
  if (cmd->needs_mpi) {
    env.emplace(&argc, &argv);
    world.emplace(comm::Comm::world());
  }
  const int rank = world ? world->rank() : 0;
#ifdef RINGATTN_SMPI
  // Simulated ranks share the process and so its signal dispositions: one handler, rank 0's, whose
  // table of staged paths (and commit in progress) is the one that matters.
  if (rank == 0) runtime::install_exit_signal_handlers();
#endif
  // Logs never mix with tables on stdout. The logger is made, not registered by name: a library
  // caller may have its own "ringattn", and simulated ranks (SMPI) each make theirs in one process.
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("ringattn", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
  spdlog::set_pattern(fmt::format("[%H:%M:%S.%e] [r{}] [%l] %v", rank));
  spdlog::set_level(rank == 0 ? spdlog::level::info : spdlog::level::warn);
  try {
    // RINGATTN_SIMD restricts the kernels to one SIMD target; a name this build or CPU lacks is
    // bad input, agreed so that no rank starts work its peers refuse.
    std::string simd_error;
    try {
      core::simd::select_from_environment();
    } catch (const InputError& e) {
      simd_error = e.what();
    }
    if (world && world->size() > 1) {
      if (auto agreed = world->agree(simd_error)) simd_error = *agreed;
    }
    if (!simd_error.empty()) throw InputError(simd_error);
    return cmd->run(world ? &*world : nullptr);
  } catch (const InputError& e) {
    if (rank == 0) fmt::print(stderr, "ringattn: error: {}\n", e.what());
    return kExitBadInput;
  } catch (const AgreedFailure& e) {  // every rank knows: rank 0 says it, nobody aborts
    if (rank == 0) fmt::print(stderr, "ringattn: error: {}\n", e.what());
    return kExitRuntime;
  } catch (const RuntimeFailure& e) {
    fmt::print(stderr, "ringattn: rank {}: runtime failure: {}\n", rank, e.what());
    if (world && world->size() > 1) comm::abort_job(kExitRuntime);  // peers may be waiting on us
    return kExitRuntime;
  } catch (const std::exception& e) {
    // Anything unexpected on one rank would leave the others waiting: end the job.
    fmt::print(stderr, "ringattn: rank {}: internal error: {}\n", rank, e.what());
    if (world && world->size() > 1) comm::abort_job(kExitRuntime);
    return kExitRuntime;
  }
}
