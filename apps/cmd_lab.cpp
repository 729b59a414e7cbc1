// `ringattn lab`: the two-rank, five-position worked example on real ranks (mpirun -np 2):
// every event of the ring printed, checked against the dense float64 reference.
#include <memory>

#include "commands.hpp"
#include "options.hpp"
#include "lab_text.hpp"
#include "ringattn/runtime/harness.hpp"
#include "ringattn/runtime/lab.hpp"

namespace ringattn::app {

Command add_lab_command(CLI::App& parent) {
  auto cfg = std::make_shared<runtime::LabConfig>();
  runtime::LabConfig& c = *cfg;
  CLI::App* lab = parent.add_subcommand(
      "lab", "the worked example: five positions on two ranks, every ring event printed (mpirun -np 2)");
  add_list(lab, "--partition", c.partition,
           "contiguous shard sizes n0,...,n(N-1) summing to S, one per rank (default 2,3)");
  lab->add_flag("--no-causal{false}", c.causal, "every key visible (default causal j <= i)");
  lab->add_flag("--skip-empty", c.skip_empty,
                "do not return all-zero dK/dV contributions, and print the bytes saved versus the full protocol");
  add_path(lab, "--inputs", c.inputs,
           "directory with q.npy k.npy v.npy dout.npy instead of the worked example's fixed tensors", "DIR");
  lab->add_flag("--layer", c.layer,
                "the whole layer around the ring: q,k,v = X Wq, X Wk, X Wv, Y = O Wo, weight gradients summed over ranks");
  add_path(lab, "--report", c.report, "write the JSON report (the `run` format) here", "FILE");
  add_integer(lab, "--debug-drop-grad-step", c.drop_grad_step, "test hook: ignore one returned gradient")
      ->group("");  // hidden
  Command cmd;
  cmd.cli = lab;
  cmd.run = [cfg](comm::Comm* comm) {
    comm->set_timeout(60);  // the lab's messages are tiny: a minute means a peer is gone
    const runtime::LabResult res = runtime::lab_job(*comm, *cfg);
    if (comm->rank() == 0) print_lab(res);
    return runtime::exit_code(res.report);
  };
  return cmd;
}

}  // namespace ringattn::app
