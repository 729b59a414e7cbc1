#pragma once
// `ringattn lab`: the two-rank, five-position worked example on real ranks: five positions,
// D=2, B=H=HKV=1, float64, causal; rank 0 owns positions 0,1 and rank 1 owns 2,3,4; dout = G/5
// for a fixed upstream G. Every event of the ring forward and backward is recorded on the rank
// that performed it (through RingObserver) and gathered, with the outputs, the dense float64
// reference and every rank's ledger, so the command's tables and the experiments on the worked
// example (tests/mpi/worked_example_test.cpp) read the same numbers. The words and tables are the
// command line's; this is the data.
#include <optional>
#include <string>
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/layer_reference.hpp"
#include "ringattn/core/layout.hpp"
#include "ringattn/core/mask.hpp"
#include "ringattn/core/reference.hpp"
#include "ringattn/core/ring_plan.hpp"
#include "ringattn/io/report.hpp"
#include "ringattn/runtime/strategy.hpp"

namespace ringattn::runtime {

using core::Index;

struct LabConfig {
  // Contiguous shard sizes, one per rank; empty = {floor(S/2), S - floor(S/2)}: the example's {2, 3}.
  std::vector<Index> partition;
  bool causal = true;
  bool skip_empty = false;  // core::Traffic::skip_empty_grads instead of the full protocol (Traffic::full)
  std::string inputs;       // directory with q.npy k.npy v.npy dout.npy; empty = the example's fixed tensors
  std::string report;       // JSON report file (the `run` format); empty = none
  int drop_grad_step = -1;  // test hook, see RingSetup
  // The whole layer around the same ring: fixed X [1, 5, 2] and weights; q, k, v and
  // dout become X Wq, X Wk, X Wv and dY Wo^T, and the worked example adds the layer's outputs, each
  // rank's weight-gradient partials, their fixed-order sum and the all-reduce's traffic.
  bool layer = false;
};

// Global float64 tensors in file order: q, dout [B, S, H, D]; k, v [B, S, HKV, D].
struct LabInputs {
  core::Shape shape;
  std::vector<double> q, k, v, dout;
  std::vector<double> g;  // the upstream G with dout = G / (B S); empty when dout came from a file
};

// The worked example's fixed tensors (S=5, D=2, B=H=HKV=1; dout = G / 5).
LabInputs example_inputs();

enum class LabEventKind { forward_block = 0, replay_block = 1, grad_sent = 2, grad_received = 3 };

// One query row (forward) or one key of the visiting block (replay), at global position `pos`.
struct LabRow {
  Index b = 0, head = 0, pos = 0;  // head: query head (forward) or kv head (replay)
  // forward: m, l, a[0..D) after the block, in the softmax's natural units whatever base the kernels
  // use: m = max_j S_ij and l = sum_j e^(S_ij - m) over the keys folded so far (S_ij = scale q_i.k_j),
  // a = sum_j e^(S_ij - m) v_j, so a/l is the prefix output; -inf, 0, 0 before any key.
  // replay: dK[0..D), dV[0..D).
  std::vector<double> x;
};

struct LabEvent {
  LabEventKind kind = LabEventKind::forward_block;
  int rank = 0;  // the rank that performed it
  int step = 0;
  int peer = 0;  // forward/replay: owner of the block; grad_sent: its owner (to); grad_received: from
  Index elems = 0;       // gradient returns: elements moved
  bool dropped = false;  // grad_received that the drop_grad_step hook ignored
  std::vector<LabRow> rows;
};

// Max |x - ref| over every entry (absolute; -inf must match, NaN is +inf).
struct LabDiffs {
  double o = 0, lse = 0, dq = 0, dk = 0, dv = 0;
};

// `lab --layer`: the layer's inputs, outputs and weight gradients, with the dense reference.
struct LabLayer {
  Index M = 0;
  core::LayerTensors in;    // x, dy [B, S, M]; wq [M, H*D], wk, wv [M, HKV*D], wo [H*D, M]
  core::LayerResult ref;    // the dense float64 layer
  std::vector<double> y, dx;                      // gathered [B, S, M]
  std::vector<double> dw[4];                      // dWq, dWk, dWv, dWo as rank 0 holds them
  std::vector<std::vector<double>> partial[4];    // [rank]: X_r^T dQ_r, X_r^T dK_r, X_r^T dV_r, O_r^T dY_r
  bool same_bits_on_every_rank = false;           // every rank's summed gradients, byte for byte
  double err[6] = {};                             // max relative error: y, dx, dwq, dwk, dwv, dwo
};

// Everything the worked example shows; run_lab returns it whole on every rank.
struct LabResult {
  LabInputs in;
  core::Layout layout = core::Layout::contiguous(1, 1);
  core::Mask mask;
  double scale = 1;
  core::Traffic traffic = core::Traffic::full;
  // Gathered outputs in global order: o, dq [B, S, H, D]; lse [B, H, S]; dk, dv [B, S, HKV, D].
  std::vector<double> o, lse, dq, dk, dv;
  double loss = 0;  // sum dout . O
  core::DenseResult ref;
  LabDiffs diff;
  double tolerance = 0;  // on the max relative error of every output
  std::vector<LabEvent> events;  // in table order: by pass and step, each rank's work then its receipts
  io::Report report;             // the `run` report: config, loss, time, check, per-rank ledger
  Index full_send_bytes = 0;     // what every rank together would send under Traffic::full
  std::vector<std::pair<Index, Index>> allreduce_elems;  // --layer: per rank, all-reduce elements sent, received
  std::optional<LabLayer> layer;  // --layer
};

// Collective. Throws InputError (the same on every rank) on bad options or files.
LabResult run_lab(const comm::Comm& comm, const LabConfig& cfg);

// Collective: checks --report's path first, then run_lab, then writes the report. The exit code
// is report.check's: 1 when an error exceeds the tolerance.
LabResult lab_job(const comm::Comm& comm, const LabConfig& cfg);

// The JSON report of a lab run: the `run` report, with --layer also a "layer" object.
io::Json lab_report_json(const LabResult& res);

}  // namespace ringattn::runtime
