#pragma once
// Small pieces every job (run, lab, layer) shares: error agreement around a stage, the
// process's peak memory, medians of timings.
#include <algorithm>
#include <string>
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/core/layout.hpp"
#include "ringattn/core/mask.hpp"
#include "ringattn/core/median.hpp"
#include "ringattn/core/ring_plan.hpp"
#include "ringattn/core/shape.hpp"
#include "ringattn/io/json.hpp"
#include "ringattn/runtime/ring_attention.hpp"
#include "ringattn/runtime/job.hpp"

namespace ringattn::runtime {

// Run `fn` on every rank; if it throws InputError on any rank, every rank throws the message of
// the lowest failing rank. Keeps ranks from waiting on a peer that already gave up.
template <class Fn>
void agreed(const comm::Comm& comm, Fn&& fn) {
  std::string err;
  try {
    fn();
  } catch (const InputError& e) {
    err = e.what();
  }
  if (auto e = comm.agree(err)) throw InputError(*e);
}

// The same for any failure after validation (I/O, system errors): every rank throws AgreedFailure.
template <class Fn>
void agreed_runtime(const comm::Comm& comm, Fn&& fn) {
  std::string err;
  try {
    fn();
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (auto e = comm.agree(err)) throw AgreedFailure(*e);
}

// Every rank's values (of any lengths), indexed by rank: on every rank, or with root_only on
// rank 0 alone (the others get an empty result). Collective.
std::vector<std::vector<double>> all_gather(const comm::Comm& comm, const std::vector<double>& mine,
                                            bool root_only = false);
// Every rank's local [outer, L, inner] tensor -> the global [outer, S, inner], placed by the
// layout's positions; root_only as above. Collective.
std::vector<double> gather_positions(const comm::Comm& comm, const std::vector<double>& mine, core::Index outer,
                                     core::Index inner, const core::Layout& l, bool root_only = false);

// DIR/FILE as a string.
std::string path_in(const std::string& dir, const std::string& file);
// A shape as "[2, 3]", for messages.
std::string shape_str(const std::vector<core::Index>& v);

// --iters >= 1, --warmup >= 0, --timeout >= 0 (InputError naming the option).
void check_run_options(const JobConfig& c);
// An option that must equal what the input files say (--seq 64 against files of 32 positions).
void agree_opt(const std::optional<core::Index>& given, core::Index file, const char* opt);

// Shape and dtype from the options alone (no input files): defaults where an option is absent.
void shape_from_options(const JobConfig& c, core::Shape& shape, core::DType& dtype);

// What run and layer derive alike from the options, validated (InputError naming the option);
// the tile sizes are checked here too.
struct RingOptions {
  core::Layout layout = core::Layout::contiguous(1, 1);
  core::Mask mask;
  core::Traffic traffic = core::Traffic::aware;
  double scale = 1;
};
RingOptions ring_options(const JobConfig& c, const core::Shape& s, int N);
// The ring's setup from the options and the derived plan; it points into `o`, which must outlive
// the ring.
RingSetup ring_setup(const JobConfig& c, const core::Shape& s, const RingOptions& o);

// The report's "config": every `run` option with the values the job used (DESIGN.md keys, plus
// tile_q, tile_k, tile_strip, mask, traffic and rope).
io::Json run_config_json(const JobConfig& c, const core::Shape& shape, core::DType dtype, const core::Mask& mask,
                         const core::Layout& layout, double scale, int N);

// High-water mark of this process's resident memory in bytes.
core::Index peak_rss_bytes();

// --out DIR exists (or is created) and files can really be created in it (root passes
// access(W_OK) even in /proc); stale partial outputs of a killed job are removed. Rank 0 checks,
// every rank agrees.
void ensure_out_dir(const comm::Comm& comm, const std::string& dir);
// The directory of `path` (for --report, --trace) exists and files can be created in it.
void check_writable_file(const comm::Comm& comm, const std::string& path, const char* opt);

using core::median;

}  // namespace ringattn::runtime
