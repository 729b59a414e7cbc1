#pragma once
// What `ringattn run` prints: the summary table on stdout (rank 0) and, for long jobs, a progress
// line on stderr.
#include <string>

#include "ringattn/runtime/run_job.hpp"

namespace ringattn::app {

void print_run(const runtime::RunResult& res);

// Progress of long runs on rank 0's stderr: a live line on a terminal; in logs at most one line
// every few seconds. Silent for the first two seconds so short jobs print nothing.
class ProgressLine {
 public:
  ProgressLine();
  void iteration(int it, int iterations);
  void step(int pass, int done, int steps);

 private:
  bool tty_;
  int iterations_ = 1, it_ = 0;
  double t0_, pass_t0_ = 0, last_ = -1e9;
};

}  // namespace ringattn::app
