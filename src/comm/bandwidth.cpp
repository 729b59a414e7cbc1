#include "ringattn/comm/bandwidth.hpp"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "ringattn/core/errors.hpp"
#include "ringattn/core/median.hpp"
#include "mpi_util.hpp"

namespace ringattn::comm {

using detail::check;

namespace {

constexpr int kTagBandwidth = 21;


// What rank `r` writes at byte i: differs between neighbours, so a message from the wrong peer or
// a shifted one is caught.
void fill_pattern(std::vector<unsigned char>& buf, int r) {
  for (std::size_t i = 0; i < buf.size(); ++i)
    buf[i] = static_cast<unsigned char>((std::uint32_t(i) * 2654435761u >> 13) + std::uint32_t(r) * 97u);
}

}  // namespace

BandwidthSample ring_transfer(const Comm& comm, std::size_t bytes, int window, const BandwidthOptions& opt) {
  if (bytes > static_cast<std::size_t>(INT_MAX))
    throw InputError("--max-bytes: " + std::to_string(bytes) + " exceeds MPI's int count (expected <= 2147483647)");
  const MPI_Comm mpi = detail::mpi(comm);
  const int count = static_cast<int>(bytes), next = comm.next(), prev = comm.prev();
  window = std::max(1, window);
  // One send buffer for the whole window (MPI allows concurrent sends from one buffer); a slice
  // of the receive buffer per message (concurrent receives into one buffer would be erroneous).
  std::vector<unsigned char> sendbuf(bytes), recvbuf(bytes * window), expect(bytes);
  fill_pattern(sendbuf, comm.rank());
  fill_pattern(expect, prev);
  std::vector<MPI_Request> reqs(2 * window);

  auto repetition = [&] {  // seconds for one window of W messages each way
    const double t0 = MPI_Wtime();
    for (int w = 0; w < window; ++w)
      check(MPI_Irecv(recvbuf.data() + w * bytes, count, MPI_BYTE, prev, kTagBandwidth, mpi, &reqs[w]), "MPI_Irecv");
    for (int w = 0; w < window; ++w)
      check(MPI_Isend(sendbuf.data(), count, MPI_BYTE, next, kTagBandwidth, mpi, &reqs[window + w]), "MPI_Isend");
    detail::wait_all(2 * window, reqs.data(), comm.timeout(), [&] {
      return "rank " + std::to_string(comm.rank()) + ": a bandwidth message from rank " + std::to_string(prev);
    });
    return MPI_Wtime() - t0;
  };

  double last = 0;
  for (int i = 0; i < std::max(1, opt.warmup); ++i) {
    comm.barrier();
    last = repetition();
  }
  // Every rank must run the same number of repetitions: decide from the slowest warm-up.
  const double slowest = comm.max(last);
  int reps = opt.iters;
  if (slowest > 0 && opt.iters > 3) reps = std::clamp(static_cast<int>(opt.budget_s / slowest), 3, opt.iters);
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    comm.barrier();  // start together; the barrier's skew is outside the timed window
    times.push_back(repetition());
  }
  // Checking is separate from timing: the last repetition's data, every slice.
  std::size_t wrong = 0;
  for (int w = 0; w < window; ++w) {
    const unsigned char* got = recvbuf.data() + w * bytes;
    if (std::memcmp(got, expect.data(), bytes) == 0) continue;
    for (std::size_t i = 0; i < bytes; ++i) wrong += got[i] != expect[i];
  }
  BandwidthSample s;
  s.bytes = bytes;
  s.window = window;
  s.iters = reps;
  s.time_s = comm.max(core::median(times)) / window;
  s.gbps = s.time_s > 0 ? double(bytes) / s.time_s * 1e-9 : 0.0;
  s.wrong = static_cast<std::size_t>(comm.sum(double(wrong)));
  return s;
}

std::vector<BandwidthSample> ring_bandwidth(const Comm& comm, const BandwidthOptions& opt) {
  if (opt.min_bytes < 1) throw InputError("--min-bytes: 0 is not a message size (expected >= 1)");
  if (opt.max_bytes < opt.min_bytes)
    throw InputError("--max-bytes: " + std::to_string(opt.max_bytes) + " is below --min-bytes " +
                     std::to_string(opt.min_bytes) + " (expected max >= min)");
  // Three buffers of the largest size live at once (send, receive, expected).
  if (opt.max_bytes > (std::size_t(1) << 30))
    throw InputError("--max-bytes: " + std::to_string(opt.max_bytes) + " is above 1 GiB (expected <= 1073741824)");
  if (opt.iters < 1) throw InputError("--iters: " + std::to_string(opt.iters) + " is not >= 1");
  std::vector<BandwidthSample> table;
  if (comm.size() < 2) return table;  // no neighbour, no ring traffic
  for (std::size_t b = opt.min_bytes;; b *= 2) {
    const std::size_t bytes = std::min(b, opt.max_bytes);
    const int window = static_cast<int>(
        std::clamp<std::size_t>(opt.window_bytes / bytes, 1, static_cast<std::size_t>(std::max(1, opt.max_window))));
    table.push_back(ring_transfer(comm, bytes, window, opt));
    if (bytes == opt.max_bytes) break;
  }
  return table;
}

double interpolate_gbps(const std::vector<BandwidthSample>& table, double bytes) {
  if (table.empty()) return 0;
  if (bytes <= double(table.front().bytes)) return table.front().gbps;
  if (bytes >= double(table.back().bytes)) return table.back().gbps;
  for (std::size_t i = 1; i < table.size(); ++i) {
    const BandwidthSample &a = table[i - 1], &b = table[i];
    if (bytes > double(b.bytes)) continue;
    const double t = (std::log2(bytes) - std::log2(double(a.bytes))) /
                     (std::log2(double(b.bytes)) - std::log2(double(a.bytes)));
    return a.gbps + t * (b.gbps - a.gbps);
  }
  return table.back().gbps;
}

}  // namespace ringattn::comm
