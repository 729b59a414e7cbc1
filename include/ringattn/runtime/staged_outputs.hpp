#pragma once
// Where a job's results go: every path checked before any compute, everything written at the end
// all at once, never a mix of two runs and never a lost result.
//
// Paths (checked in the constructor, collective, InputError on every rank):
//   --out DIR    an existing writable directory, or a new name in one (it is created only when
//                the outputs are staged, so a job refused for bad input leaves nothing behind);
//                every name at most NAME_MAX and the path, with the job's hidden names under it,
//                within PATH_MAX. Resolved once (symlinks followed): a link swapped while the job
//                runs does not move its files. A commit that a dead job left in DIR is finished
//                here, before anything is computed (see Commit).
//   --report F, --trace F   a file (or nothing yet) in a writable directory, written atomically;
//                a character device or FIFO is written through; a symlink is followed (the link
//                stays, its target is replaced); never a directory, never an input file, never
//                one of the outputs, never each other. An input file that --out DIR holds under a
//                name the job may write (q.npy read with --inputs DIR --out DIR and converted to
//                --dtype, so written back as used; a --sinks file named o.npy) is refused too.
// Staging: each job writes into its own hidden directory DIR/.ringattn-<job>.tmp (rank 0 creates
// each file at its full size, every rank writes its positions), so concurrent jobs on one
// directory never touch each other's files.
// Commit (rank 0, under an exclusive flock on DIR, signals held back; docs/robustness-commit.md):
// every rank first hands the staged files over to rank 0 (a peer's signal handler removes nothing
// after that). Rank 0 publishes a journal, DIR/.ringattn-<job>.commit, naming the old files to set
// aside (the names this run writes, and ringattn's own names it does not write, such as a
// forward-only run's dq, dk, dv) and the new ones to move in; then moves the old files into
// DIR/.ringattn-<job>.old and the new ones in, removes both hidden directories and last the
// journal. A process killed at any point leaves the journal, which the next job on DIR (or
// `sh DIR/.ringattn-<job>.commit`) carries out to the end: one complete set, the new one, and
// nothing hidden. A failure while rank 0 lives turns the journal around and puts the old set back.
// A directory (or anything but a file) standing on an output name stops the commit before it
// changes anything. Then the trace and the report are put in place, only if the outputs were.
// Until the handover, SIGTERM, SIGINT or SIGHUP (what Open MPI sends when a peer dies) removes
// what is staged and ends the process with 128 + the signal.
#include <memory>
#include <string>
#include <vector>

#include "ringattn/comm/group.hpp"
#include "ringattn/core/layout.hpp"
#include "ringattn/runtime/harness.hpp"

namespace ringattn::runtime {

struct OutputPaths {
  std::string out_dir;                   // --out; empty: none
  std::string report, trace;             // --report, --trace; empty: none
  std::vector<std::string> inputs;       // files the job reads (never overwritten or removed)
  std::vector<std::string> writes;       // names (without .npy) the job may write into --out: an
                                         // input file standing on one is refused before any compute
};

// ringattn's own output names (any mode), without ".npy": a commit removes those it did not write.
const std::vector<std::string>& own_output_names();

class StagedOutputs {
 public:
  StagedOutputs(const comm::Group& group, OutputPaths paths);
  ~StagedOutputs();
  StagedOutputs(const StagedOutputs&) = delete;
  StagedOutputs& operator=(const StagedOutputs&) = delete;

  // Collective: writes every file into the staging directory. Throws AgreedFailure on every rank.
  void stage(const std::vector<OutputTensor>& files, const core::Layout& layout);
  // Rank 0: the text of the trace and the report (written at commit()).
  void set_trace(std::string text);
  void set_report(std::string text);
  // Collective: puts everything in place as described above. Throws AgreedFailure on every rank.
  void commit();
  // Removes whatever is staged; never throws.
  void discard() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// While a job runs: SIGTERM, SIGINT and SIGHUP remove the staged files (if any, and only until
// the commit's handover) and end the process with exit code 128 + signal. Installed once per process by the command line; a library
// caller keeps its own signal handling.
void install_exit_signal_handlers();

}  // namespace ringattn::runtime
