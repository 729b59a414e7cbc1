#pragma once
// One harness for every job mode (`run`, `run --layer`, and any strategy under them): warm-up
// and timed iterations, medians, the check against the dense reference, staged outputs and the
// report. A mode describes itself through Job; the harness never knows which mode it runs.
//
// Order, on every rank: iterations (each rank's times; the job's time is the slowest rank's,
// median over the timed iterations) -> the check (positional outputs gathered to rank 0, whole
// ones compared bit for bit between ranks; rank 0 computes the reference; the errors are shared)
// -> every rank's figures gathered to rank 0 -> outputs staged, then the trace and the report,
// then the outputs committed last. Only rank 0's report is complete.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ringattn/comm/group.hpp"
#include "ringattn/core/layout.hpp"
#include "ringattn/io/report.hpp"
#include "ringattn/runtime/input_plan.hpp"
#include "ringattn/runtime/strategy.hpp"

namespace ringattn::runtime {

// One rank's timings of one iteration.
struct IterationTimes {
  double forward_s = 0, backward_s = 0, compute_s = 0, wait_s = 0;
  double a2a_wait_s = 0;  // the part of wait_s spent in all-to-alls (head-parallel strategies)
};

// An output of this rank, for --out and --check. Positional tensors hold this rank's positions
// [outer, L, inner] of the global [outer, S, inner]; whole ones (pos_axis kWhole) are held
// identically by every rank.
struct OutputTensor {
  std::string name;          // "o" is o.npy
  std::vector<Index> shape;  // global file shape
  int pos_axis = 1;
  std::span<const double> f64;  // one of the two holds the data
  std::span<const float> f32;
  core::DType file_dtype = core::DType::f32;
  bool checked = false;      // compared with the reference under --check
};

// The reference of one checked output on rank 0: global values, and the magnitude below which
// its error is measured absolutely (max |ref| when larger).
struct ReferenceTensor {
  std::string name;
  std::vector<double> values;
  double floor = 0;
};

class Job {
 public:
  virtual ~Job() = default;
  // One forward (and, when the job has one, backward) pass; collective. `timed` is false for the
  // warm-up iterations, whose figures the job leaves out.
  virtual IterationTimes iterate(bool timed) = 0;
  // After the iterations, on every rank:
  virtual std::vector<OutputTensor> outputs() const = 0;
  virtual std::optional<double> local_loss() const = 0;  // this rank's part of the loss, if computed
  virtual io::RankRow rank_row() const = 0;               // ledger, work and memory (times: the harness's)
  virtual std::vector<StepRecord> steps() const = 0;      // the last iteration's, for --trace
  // Rank 0 only: the dense float64 reference of every checked output.
  virtual std::vector<ReferenceTensor> reference() const = 0;
  // Collective, after the rows are gathered: the mode's own report figures (rank 0 fills them in).
  virtual void finish_report(const comm::Group& group, io::Report& report) = 0;
};

struct HarnessOptions {
  int warmup = 0, iters = 1;
  bool check = false;
  double tolerance = 0;
  bool report = false, trace = false;  // write them (their paths are the StagedOutputs')
  const core::Layout* layout = nullptr;  // who owns the positions of positional outputs
  io::Json config = io::Json::object();
  std::function<void(int iteration, int iterations)> on_iteration;  // may be empty
};

class StagedOutputs;

// Runs `job` as the options say and writes its results through `staged` (whose paths were checked
// before the job was built); returns the report (complete on rank 0, the check in report.check).
// Throws AgreedFailure on every rank when an output cannot be written.
io::Report run_harness(const comm::Group& group, Job& job, StagedOutputs& staged, const HarnessOptions& opt);

// The exit code of a finished job: 1 when a check failed, else 0.
int exit_code(const io::Report& report);

}  // namespace ringattn::runtime
