#include "ringattn/runtime/input_plan.hpp"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include "ringattn/comm/simulation.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/core/storage.hpp"
#include "ringattn/runtime/paths.hpp"

namespace ringattn::runtime {

Index TensorSpec::outer() const {
  Index n = 1;
  if (pos_axis == kWhole) return 1;
  for (int d = 0; d < pos_axis; ++d) n *= shape[d];
  return n;
}

Index TensorSpec::inner() const {
  Index n = 1;
  for (std::size_t d = pos_axis == kWhole ? 0 : std::size_t(pos_axis) + 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

std::string InputPlan::path(const TensorSpec& t) const { return path_in(dir, t.name + ".npy"); }

const TensorSpec& InputPlan::spec(const std::string& name) const {
  for (const TensorSpec& t : specs)
    if (t.name == name) return t;
  throw std::logic_error("InputPlan: no tensor " + name);
}

std::vector<std::optional<io::NpyHeader>> read_headers(const std::string& dir, const std::vector<FileWant>& want) {
  std::vector<std::optional<io::NpyHeader>> h(want.size());
  const io::NpyHeader* first = nullptr;
  std::string first_name;
  for (std::size_t t = 0; t < want.size(); ++t) {
    const std::string path = path_in(dir, want[t].name + ".npy");
    std::error_code ec;
    if (want[t].optional && !std::filesystem::exists(path, ec)) continue;
    h[t] = io::read_npy_header(path);
    const auto& shape = h[t]->shape;
    if (shape.size() != want[t].dims)
      throw InputError(fmt::format("{}: has {} dimensions {} (expected {})", path, shape.size(), shape_str(shape),
                                   want[t].dims_text));
    if (!first) {
      first = &*h[t];
      first_name = want[t].name + ".npy";
    } else if (h[t]->dtype != first->dtype) {
      throw InputError(fmt::format("{}: dtype {} differs from {}'s {} (expected all inputs alike)", path,
                                   io::npy_descr(h[t]->dtype), first_name, io::npy_descr(first->dtype)));
    }
  }
  // The files decide the shape: say which file is wrong, not which option.
  for (std::size_t t = 0; t < want.size(); ++t)
    if (h[t])
      for (Index d : h[t]->shape)
        if (d < 1)
          throw InputError(fmt::format("{}: shape {} has a zero dimension (expected every extent >= 1)",
                                       path_in(dir, want[t].name + ".npy"), shape_str(h[t]->shape)));
  return h;
}

void agree_opt(const std::optional<Index>& given, Index file, const char* opt) {
  if (given && *given != file)
    throw InputError(fmt::format("{} {} contradicts the input files, which give {}", opt, *given, file));
}

namespace {

// The largest finite value of a storage type.
template <class T>
double largest_finite() {
  if constexpr (std::same_as<T, core::f16>) return 65504.0;
  else if constexpr (std::same_as<T, core::bf16>) return 0x1.fep127;
  else return static_cast<double>(std::numeric_limits<T>::max());
}

// The first non-finite value of a local tensor read from `file`, reported by its global index: a
// non-finite value of the file, or a finite one the storage type could not hold.
template <class T>
void check_finite(const std::vector<T>& x, const TensorSpec& spec, const core::Layout& layout, int rank,
                  const std::string& file, const io::NpyHeader& header) {
  const bool whole = spec.pos_axis == kWhole;
  const Index L = whole ? 1 : layout.size(rank), S = whole ? 1 : layout.seq(), inner = spec.inner();
  const auto pos = layout.positions(rank);
  for (Index n = 0; n < static_cast<Index>(x.size()); ++n) {
    if (std::isfinite(core::value_cast<double>(x[n]))) continue;
    Index flat = n;
    if (!whole) {
      const Index a = n / (L * inner), i = (n / inner) % L, e = n % inner;
      flat = (a * S + pos[i]) * inner + e;
    }
    const double given = io::read_npy_element(file, header, flat);
    std::vector<Index> idx(spec.shape.size());
    for (int d = static_cast<int>(spec.shape.size()) - 1; d >= 0; --d) {
      idx[d] = flat % spec.shape[d];
      flat /= spec.shape[d];
    }
    if (std::isfinite(given))
      throw InputError(fmt::format("{}: value {} at index {} is out of {}'s range (it becomes {}; expected values "
                                   "that round to at most {} in magnitude)", file, given, shape_str(idx),
                                   core::dtype_name(core::dtype_of<T>()), core::value_cast<double>(x[n]),
                                   largest_finite<T>()));
    throw InputError(fmt::format("{}: non-finite value {} at index {} (expected finite inputs)", file, given,
                                 shape_str(idx)));
  }
}

// Generated values of a spec for `runs` of its positions (or whole), scaled, rounded once to T.
template <class T>
void generate(const InputPlan& plan, const TensorSpec& spec, std::span<const core::Run> runs, Index L, T* out) {
  const bool whole = spec.pos_axis == kWhole;
  const Index outer = spec.outer(), S = whole ? spec.shape[0] : spec.shape[spec.pos_axis];
  const Index inner = whole ? spec.inner() / spec.shape[0] : spec.inner();
  const core::Run all{0, 0, S};
  const std::span<const core::Run> r = whole ? std::span<const core::Run>(&all, 1) : runs;
  const Index n = outer * (whole ? S : L) * inner;
  if (spec.gen_scale == 1.0) {
    core::generate_positions<T>(plan.seed, spec.id, outer, S, inner, r, whole ? S : L, out);
    return;
  }
  std::vector<double> g(n);
  core::generate_positions<double>(plan.seed, spec.id, outer, S, inner, r, whole ? S : L, g.data());
  for (Index e = 0; e < n; ++e) out[e] = core::value_cast<T>(g[e] * spec.gen_scale);
}

}  // namespace

template <class T>
std::vector<std::vector<T>> load_inputs(const InputPlan& plan, const core::Layout& layout, int rank) {
  std::vector<std::vector<T>> out(plan.specs.size());
  const Index L = layout.size(rank);
  const auto runs = layout.runs(rank);
  for (std::size_t t = 0; t < plan.specs.size(); ++t) {
    const TensorSpec& spec = plan.specs[t];
    std::vector<T>& dst = out[t];
    dst.assign(spec.local_elems(L), T{});
    if (!plan.from_files()) {
      generate<T>(plan, spec, runs, L, dst.data());
      continue;
    }
    if (!plan.headers[t]) continue;  // a missing optional file: zeros
    const std::string path = plan.path(spec);
    if (spec.pos_axis == kWhole) dst = io::read_npy<T>(path, *plan.headers[t]);
    else io::read_npy_positions<T>(path, *plan.headers[t], spec.pos_axis, runs, L, dst.data());
    check_finite(dst, spec, layout, rank, path, *plan.headers[t]);
  }
  return out;
}

template <class T>
std::vector<double> global_input(const InputPlan& plan, const TensorSpec& spec) {
  Index n = 1;
  for (Index d : spec.shape) n *= d;
  const std::size_t t = static_cast<std::size_t>(&spec - plan.specs.data());
  if (plan.from_files()) {
    if (!plan.headers[t]) return std::vector<double>(n, 0.0);
    std::vector<double> g = io::read_npy<double>(plan.path(spec), *plan.headers[t]);
    for (double& x : g) x = core::value_cast<double>(core::value_cast<T>(x));  // as the ranks hold them
    return g;
  }
  std::vector<T> local(n);
  const Index S = spec.pos_axis == kWhole ? 1 : spec.shape[spec.pos_axis];
  const core::Run all{0, 0, S};
  generate<T>(plan, spec, {&all, 1}, S, local.data());
  std::vector<double> g(n);
  std::transform(local.begin(), local.end(), g.begin(), [](T x) { return core::value_cast<double>(x); });
  return g;
}

double MemoryPlan::total() const {
  double t = 0;
  for (const Item& i : items) t += i.bytes;
  return t;
}

double memory_per_rank() {
  double avail = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") {
      avail = kib * 1024.0;
      break;
    }
    meminfo.ignore(256, '\n');
  }
  double local_ranks = 1;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"})
    if (const char* v = std::getenv(var)) {
      local_ranks = std::max(1, std::atoi(v));
      break;
    }
  // Simulated ranks all live in this one process.
  local_ranks = std::max(local_ranks, double(comm::ranks_in_process()));
  double limit = avail / local_ranks;
  rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) limit = std::min(limit, double(rl.rlim_cur));
  return limit;
}

void admit_memory(const MemoryPlan& plan, const std::string& culprit, const std::string& shape,
                  const std::string& hint) {
  const double need = plan.total(), limit = memory_per_rank();
  if (!(need > limit)) return;
  const auto largest = std::max_element(plan.items.begin(), plan.items.end(),
                                        [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
  double local_ranks = 1;
  if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) local_ranks = std::max(1, std::atoi(v));
  local_ranks = std::max(local_ranks, double(comm::ranks_in_process()));
  throw InputError(fmt::format("{}: {} needs about {:.1f} GiB per rank (largest: {} {:.1f} GiB), more than the "
                               "{:.1f} GiB available to each of this node's {} ranks (expected {})",
                               culprit, shape, need / 1073741824.0, largest->what, largest->bytes / 1073741824.0,
                               limit / 1073741824.0, local_ranks, hint));
}

template std::vector<std::vector<float>> load_inputs<float>(const InputPlan&, const core::Layout&, int);
template std::vector<std::vector<double>> load_inputs<double>(const InputPlan&, const core::Layout&, int);
template std::vector<double> global_input<float>(const InputPlan&, const TensorSpec&);
template std::vector<double> global_input<double>(const InputPlan&, const TensorSpec&);
template std::vector<std::vector<core::bf16>> load_inputs<core::bf16>(const InputPlan&, const core::Layout&, int);
template std::vector<std::vector<core::f16>> load_inputs<core::f16>(const InputPlan&, const core::Layout&, int);
template std::vector<double> global_input<core::bf16>(const InputPlan&, const TensorSpec&);
template std::vector<double> global_input<core::f16>(const InputPlan&, const TensorSpec&);

}  // namespace ringattn::runtime
