#pragma once
// One input plan for every job mode: which tensors a job reads (or generates), their shapes, the
// memory the job will need on each rank, and the loading of one rank's shard.
//
// A tensor has a position axis (S, split over the ranks by the layout) or is whole (weights,
// held by every rank). Files are read shard-wise: each rank reads only its positions. Generated
// inputs are a pure function of (seed, tensor, global index), so the global tensors are the same
// whatever N and the layout are.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ringattn/core/inputs.hpp"
#include "ringattn/core/layout.hpp"
#include "ringattn/core/shape.hpp"
#include "ringattn/io/npy.hpp"

namespace ringattn::runtime {

using core::Index;

inline constexpr int kWhole = -1;  // a tensor every rank holds whole

struct TensorSpec {
  std::string name;           // "q" is q.npy
  core::InputTensor id = core::InputTensor::q;  // its stream of generated values
  std::vector<Index> shape;   // the global shape
  int pos_axis = 1;           // the position axis, or kWhole
  double gen_scale = 1.0;     // generated values are scaled by this (weights: 1/sqrt(fan_in))
  bool optional = false;      // may be missing from --inputs (then zeros): dout without a backward pass

  Index outer() const;        // product of the dimensions before the position axis (1 for kWhole)
  Index inner() const;        // product of those after it (all of them for kWhole)
  Index local_elems(Index L) const { return pos_axis == kWhole ? inner() : outer() * L * inner(); }
};

struct InputPlan {
  std::string dir;            // --inputs; empty: generated from `seed`
  std::uint64_t seed = 0;
  std::vector<TensorSpec> specs;
  std::vector<std::optional<io::NpyHeader>> headers;  // [spec] with --inputs; nullopt: a missing optional file
  bool rounded = false;       // the files' values were rounded to the run's dtype on load

  bool from_files() const { return !dir.empty(); }
  std::string path(const TensorSpec& t) const;  // DIR/NAME.npy
  const TensorSpec& spec(const std::string& name) const;
};

// A file a mode expects in --inputs: its name, its number of dimensions, whether it may be missing.
struct FileWant {
  std::string name;
  std::size_t dims;
  const char* dims_text;  // for messages: "4: [B, S, heads, D]"
  bool optional = false;
};

// Headers of `want` in `dir`, each fully validated (dimensions, no zero extent, one dtype for all).
// Throws InputError naming the file.
std::vector<std::optional<io::NpyHeader>> read_headers(const std::string& dir, const std::vector<FileWant>& want);

// An option that must equal what the input files say (--seq 64 against files of 32 positions).
void agree_opt(const std::optional<Index>& given, Index file, const char* opt);

// This rank's values of every spec, in spec order: [outer, L, inner] for positional tensors (the
// layout's positions of `rank`), whole otherwise. Values are converted (rounded to nearest) to T.
// Non-finite values are refused, naming the file and the global index.
template <class T>
std::vector<std::vector<T>> load_inputs(const InputPlan& plan, const core::Layout& layout, int rank);

// Every rank's values of one spec, whole, as float64, rounded through T first as the ranks see
// them (the check's reference inputs; rank 0 only).
template <class T>
std::vector<double> global_input(const InputPlan& plan, const TensorSpec& spec);

// What a job will allocate on the most loaded rank, by item, and the one rule that admits it.
struct MemoryPlan {
  struct Item {
    std::string what;
    double bytes;
  };
  std::vector<Item> items;
  void add(std::string what, double bytes) { items.push_back({std::move(what), bytes}); }
  double total() const;
};

// Memory available to each rank of this node: MemAvailable over the node's ranks, capped by the
// address-space limit.
double memory_per_rank();

// Throws InputError when the plan exceeds memory_per_rank(): "<culprit>: <shape> needs about X GiB
// per rank (largest: <item>), more than the Y GiB available to each of this node's N ranks
// (expected <hint>)".
void admit_memory(const MemoryPlan& plan, const std::string& culprit, const std::string& shape,
                  const std::string& hint);

}  // namespace ringattn::runtime
