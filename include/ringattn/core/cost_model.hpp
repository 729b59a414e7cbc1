#pragma once
// The cost model of ring attention: bytes each device receives, the work it does, their
// ratio (arithmetic intensity) against the machine's FLOP/byte ratio beta, and the causal,
// Ulysses and tensor-parallel figures next to it. Per device, per layer, forward pass. Pure math.
//
//   W        = 4 B (S/N) S H D                    FLOPs per device (QK^T and PV, 2 FLOPs a MAC)
//   C_recv   = (N-1)/N B S 2 HKV D p              bytes received per device (N-1 K/V blocks)
//   I        = W / C_recv = (H/HKV) S/(N-1) (2/p)                     layer intensity
//   I_step   = 4 B (S/N)^2 H D / (2 B (S/N) HKV D p) = (H/HKV)(S/N)(2/p)  one block pair per block
//   beta     = flops / bandwidth (one-way)        overlap can hide the transfer when I_step >= beta
//
// With p = 2 (bf16) these are (H/HKV) S/(N-1) and (H/HKV) S/N. The reference example
// (S=262144, N=8, H=32, HKV=8, D=128, p=2, 312e12 FLOP/s, 300e9 B/s) gives 0.94 GB, 451 ms,
// 3.13 ms, 0.69%, I_step 131,072 and I 149,797 FLOP/byte.
//
// Causal (--causal): each query sees only earlier keys, so the useful work per device is halved on
// average (the continuous "useful FLOP" convention, 2 B S^2 H D in all) while the bytes do
// not change (every block still travels). So W, compute_s, step_compute_s, I and I_step halve,
// comm_ratio doubles and max_ranks roughly halves. The slowest device of a contiguous layout does
// more than the mean: causal_utilization is the mean / max of that block model.
#include <string>
#include <vector>

#include "ringattn/core/shape.hpp"

namespace ringattn::core {

struct CostInputs {
  Index S = 262144, N = 8, H = 32, HKV = 8, D = 128, B = 1;
  double bytes = 2;             // p, bytes per element
  double flops = 312e12;        // device FLOP/s
  double bandwidth = 300e9;     // one-way bytes/s between neighbours
  bool causal = false;
  // Throws InputError naming the offending option.
  void validate() const;
};

// The rule of thumb on comm/compute of one step: < 5% overlap has room,
// 5-15% it depends on the implementation, > 15% communication is not negligible.
enum class Verdict { no_communication, overlap_has_room, depends_on_implementation, not_negligible };
Verdict verdict_for(double comm_ratio, bool communicates = true);
const char* verdict_text(Verdict v);

struct CostEstimate {
  double recv_bytes = 0;       // C_recv: (N-1)/N B S 2 HKV D p per device per layer
  double send_bytes = 0;       // each device sends N-1 blocks (its own and N-2 it forwards): = C_recv
  double layer_intensity = 0;  // I = W / C_recv, FLOP/byte; +inf when N = 1 (nothing received)
  double step_intensity = 0;   // I_step: one block pair's FLOPs per byte of one K/V block
  double beta = 0;             // flops / bandwidth, FLOP/byte
  double work_flops = 0;       // W (halved when causal)
  double compute_s = 0;        // W / flops
  double comm_s = 0;           // C_recv / bandwidth
  double comm_ratio = 0;       // comm_s / compute_s (layer totals: N-1 receives over N steps)
  double step_compute_s = 0;   // 4 B (S/N)^2 H D / flops (halved when causal)
  double step_comm_s = 0;      // 2 B (S/N) HKV D p / bandwidth; 0 when N = 1
  double step_comm_ratio = 0;  // step_comm_s / step_compute_s = beta / I_step: what the verdict reads
  double max_ranks_bound = 0;  // (H/HKV) S (2/p) / beta (x 1/2 when causal): I_step >= beta for N <= this
  Index max_ranks = 1;         // floor of the bound, at least 1 (one device never communicates)
  double causal_utilization = 0;      // (N+1)/2N: contiguous causal, diagonal block counted whole
  double causal_utilization_tri = 0;  // N/(2N-1): diagonal block counted as a triangle
  double ulysses_recv_bytes = 0;      // (N-1)/N B (S/N) (2H + 2HKV) D p
  double tp_bytes = 0;                // 4 B S H D p: two activation all-reduces
  Verdict verdict = Verdict::overlap_has_room;  // of step_comm_ratio
};

CostEstimate estimate_cost(const CostInputs& in);

// The three strategies side by side, per device, forward pass, for Ulysses degree U (ring U = 1,
// ulysses U = N, usp anything between that divides N): an all-to-all inside groups of U devices
// gives each H/U query heads (and the kv heads they read, replicated when HKV % U != 0) over the
// group's U S/N positions; the ring then runs over R = N/U groups on that head slice.
//   a2a recv = (U-1)/U B (S/N) (2 H + 2 HKV') D elements: q, k, v in, O back (HKV' = U HKVu,
//              HKV when HKV % U == 0), plus LSE (U-1)/U B (S/N) H; bytes at p
//   ring recv = (R-1) 2 B (S/R) HKVu D p,   I_step = (H/HKV') (S/R) (2/p), halved when causal
// The all-to-all waits for its data (nothing to overlap it with) while the ring's receive hides
// behind a step's compute, so: predicted = compute_s max(1, beta / I_step) + a2a recv bytes /
// bandwidth, and the verdict reads a2a_s / compute_s + beta / I_step (what overlap cannot hide plus
// what it must).
// The all-gather strategy's KV-head group when none is given: the largest G dividing HKV that leaves
// at least two groups (one group's gather overlaps the other's compute) and keeps the two gathered
// groups, 2 x 2 B G S D `bytes`, within 256 MiB.
Index default_kv_head_group(Index B, Index S, Index HKV, Index D, double bytes);

struct StrategyEstimate {
  std::string strategy;  // ring, ulysses, usp, allgather
  Index U = 1;
  std::string impossible;     // why the shape forbids it; empty when it can run
  double a2a_recv_elems = 0;  // forward, without LSE: (U-1)/U B (S/N) (2H + 2HKV') D
  double lse_recv_elems = 0;
  double a2a_recv_bytes = 0, ring_recv_bytes = 0, recv_bytes = 0;
  double step_intensity = 0;  // of the ring between groups; 0 when there is none (R = 1)
  double step_comm_ratio = 0;  // beta / I_step
  double a2a_s = 0, compute_s = 0, predicted_s = 0, comm_ratio = 0;
  // allgather: the K/V it gathers per pass, (N-1)/N B S 2 HKV D p, the group G, the two gathered
  // groups it holds, and the one gather no compute hides (the first group's).
  double ag_recv_bytes = 0, gathered_bytes = 0, exposed_gather_s = 0;
  Index kv_head_group = 0;
  Verdict verdict = Verdict::no_communication;
};

// ring, ulysses, usp for every U with 1 < U < N dividing N, then allgather. Validates `in`.
std::vector<StrategyEstimate> estimate_strategies(const CostInputs& in);
// The possible estimate with the least predicted time (the ring when nothing else is).
const StrategyEstimate& predicted_best(const std::vector<StrategyEstimate>& e);

// I_step for a shard of L positions (L = S/N): 4 B L^2 H D / (2 B L HKV D p), halved when causal.
double step_intensity(double L, Index H, Index HKV, double bytes, bool causal);

}  // namespace ringattn::core
