#pragma once
// Ring sendrecv bandwidth between neighbours, step 1 of the three-step measurement method, in the style
// of OSU osu_bw (windows of nonblocking messages, warm-up skipped, sizes doubling) and nccl-tests
// sendrecv_perf (recvPeer = rank-1, sendPeer = rank+1; a #wrong column; algbw = bytes / time).
//
// Every rank sends `bytes` to r+1 and receives `bytes` from r-1 at the same time, so the figure is
// one-way per rank: gbps = bytes / time_s / 1e9, time_s the time of one message (a window of W
// messages divided by W), the median over repetitions of the slowest rank.
#include <cstddef>
#include <vector>

#include "ringattn/comm/comm.hpp"

namespace ringattn::comm {

struct BandwidthOptions {
  std::size_t min_bytes = std::size_t(4) << 10;   // 4 KiB
  std::size_t max_bytes = std::size_t(64) << 20;  // 64 MiB
  int iters = 20;                  // timed repetitions per size, at most
  int warmup = 2;                  // untimed repetitions per size, first
  double budget_s = 0.5;           // per size: fewer repetitions when one is slow (never below 3)
  int max_window = 64;             // messages in flight per repetition, as osu_bw's window
  std::size_t window_bytes = std::size_t(64) << 20;  // ... and at most this many bytes of them
};

struct BandwidthSample {
  std::size_t bytes = 0;  // one message
  double time_s = 0;      // one message: slowest rank's median over repetitions, / window
  double gbps = 0;        // bytes / time_s / 1e9, one-way per rank
  int iters = 0;          // timed repetitions
  int window = 0;         // messages in flight per repetition
  std::size_t wrong = 0;  // received bytes that differ from what the sender wrote (all ranks)
};

// Sizes doubling from min_bytes to max_bytes (max_bytes included when it is not a doubling).
// With one rank there is no neighbour and nothing to measure: the result is empty.
// Collective: every rank calls it with the same options.
std::vector<BandwidthSample> ring_bandwidth(const Comm& comm, const BandwidthOptions& opt);

// One size with `window` messages in flight (1 = what a ring step does: one K/V block).
BandwidthSample ring_transfer(const Comm& comm, std::size_t bytes, int window, const BandwidthOptions& opt);

// GB/s at `bytes` from a table sorted by size: linear in log2(bytes) between the two measured
// sizes around it, the nearest end outside the table; 0 for an empty table.
double interpolate_gbps(const std::vector<BandwidthSample>& table, double bytes);

}  // namespace ringattn::comm
