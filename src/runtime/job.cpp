#include "ringattn/runtime/job.hpp"

#include <fmt/format.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

#include "ringattn/core/errors.hpp"
#include "ringattn/core/inputs.hpp"
#include "ringattn/core/layout.hpp"
#include "ringattn/core/layer_reference.hpp"
#include "ringattn/core/reference.hpp"
#include "ringattn/core/rope.hpp"
#include "ringattn/io/json.hpp"
#include "ringattn/io/npy.hpp"
#include "ringattn/io/report.hpp"
#include "ringattn/runtime/common.hpp"
#include "ringattn/runtime/ring_attention.hpp"
#include "ringattn/runtime/staged_outputs.hpp"

namespace ringattn::runtime {

double check_tolerance(core::DType t) { return t == core::DType::f32 ? 3e-4 : 1e-10; }

void shape_from_options(const JobConfig& c, core::Shape& shape, core::DType& dtype) {
  shape = core::Shape{c.batch.value_or(kDefaultBatch), c.seq.value_or(kDefaultSeq), c.heads.value_or(kDefaultHeads), 0,
                c.head_dim.value_or(kDefaultHeadDim)};
  shape.HKV = c.kv_heads.value_or(shape.H);
  if (c.dtype.empty() || c.dtype == "f32") dtype = core::DType::f32;
  else if (c.dtype == "f64") dtype = core::DType::f64;
  else throw InputError(fmt::format("--dtype: unknown dtype '{}' (expected f32 or f64)", c.dtype));
}

std::string path_in(const std::string& dir, const std::string& file) {
  return (std::filesystem::path(dir) / file).string();
}

// Comm::gather takes equal lengths, so each rank leads with its own length and pads to the
// longest; rank 0 then broadcasts the lot unless root_only.
std::vector<std::vector<double>> all_gather(const comm::Comm& comm, const std::vector<double>& mine,
                                            bool root_only) {
  const std::size_t width = 1 + static_cast<std::size_t>(comm.max(static_cast<double>(mine.size())));
  std::vector<double> padded(width, 0.0);
  padded[0] = static_cast<double>(mine.size());
  std::copy(mine.begin(), mine.end(), padded.begin() + 1);
  std::vector<double> all = comm.gather(padded);
  if (root_only && comm.rank() != 0) return {};
  all.resize(width * comm.size());
  if (!root_only) comm.broadcast(all, 0);
  std::vector<std::vector<double>> out(comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    const double* p = &all[r * width];
    out[r].assign(p + 1, p + 1 + static_cast<std::size_t>(p[0]));
  }
  return out;
}

std::vector<double> gather_positions(const comm::Comm& comm, const std::vector<double>& mine, Index outer,
                                     Index inner, const core::Layout& l, bool root_only) {
  const auto parts = all_gather(comm, mine, root_only);
  if (parts.empty()) return {};
  const Index S = l.seq();
  std::vector<double> g(outer * S * inner);
  for (int r = 0; r < comm.size(); ++r) {
    const Index L = l.size(r);
    const auto pos = l.positions(r);
    for (Index a = 0; a < outer; ++a)
      for (Index i = 0; i < L; ++i) std::copy_n(&parts[r][(a * L + i) * inner], inner, &g[(a * S + pos[i]) * inner]);
  }
  return g;
}

std::string shape_str(const std::vector<Index>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

void agree_opt(const std::optional<Index>& given, Index file, const char* opt) {
  if (given && *given != file)
    throw InputError(fmt::format("{} {} contradicts the input files, which give {}", opt, *given, file));
}

void check_run_options(const JobConfig& c) {
  if (c.iters < 1) throw InputError(fmt::format("--iters: {} is not >= 1", c.iters));
  if (c.warmup < 0) throw InputError(fmt::format("--warmup: {} is negative", c.warmup));
  if (c.timeout < 0) throw InputError(fmt::format("--timeout: {} is negative (0 disables the watchdog)", c.timeout));
}

RingOptions ring_options(const JobConfig& c, const core::Shape& s, int N) {
  RingOptions o;
  for (const auto& [option, value] : {std::pair{"--tile-q", c.tiling.q_rows}, std::pair{"--tile-k", c.tiling.k_cols},
                                      std::pair{"--tile-strip", c.tiling.strip_rows}})
    if (value < 1 || value > 65536)
      throw InputError(fmt::format("{}: {} is outside 1..65536 (a tile size)", option, value));
  const core::LayoutKind kind = core::parse_layout_kind(c.layout);
  if (!c.partition.empty()) {
    if (kind != core::LayoutKind::contiguous)
      throw InputError(fmt::format("--partition: only applies to --layout contiguous, not {}", c.layout));
    if (static_cast<int>(c.partition.size()) != N)
      throw InputError(
          fmt::format("--partition: has {} sizes for {} ranks (expected one per rank)", c.partition.size(), N));
    Index sum = 0;
    for (Index n : c.partition) sum += n;
    if (sum != s.S && std::all_of(c.partition.begin(), c.partition.end(), [](Index n) { return n >= 0; }))
      throw InputError(fmt::format("--partition: sizes sum to {} but S is {} (expected sum == S)", sum, s.S));
  }
  o.layout = core::Layout::make(kind, s.S, N, c.partition);
  if (c.window < 0) throw InputError(fmt::format("--window: {} is negative (expected W >= 1)", c.window));
  o.mask = core::Mask::make(s.S, c.causal, c.window, c.doc_lens);
  if (c.traffic == "aware") o.traffic = core::Traffic::aware;
  else if (c.traffic == "full") o.traffic = core::Traffic::full;
  else if (c.traffic == "skip-empty") o.traffic = core::Traffic::skip_empty_grads;
  else throw InputError(fmt::format("--traffic: unknown plan '{}' (expected full, aware or skip-empty)", c.traffic));
  o.scale = c.scale ? *c.scale : 1.0 / std::sqrt(double(s.D));
  if (!std::isfinite(o.scale)) throw InputError("--scale: must be finite");
  return o;
}

RingSetup ring_setup(const JobConfig& c, const core::Shape& s, const RingOptions& o) {
  return RingSetup{.shape = s,
                   .layout = &o.layout,
                   .mask = &o.mask,
                   .scale = o.scale,
                   .tiling = c.tiling,
                   .timeout_s = c.timeout,
                   .traffic = o.traffic,
                   .drop_grad_step = c.drop_grad_step,
                   .stall_rank = c.stall_rank,
                   .stall_s = c.stall_s};
}

io::Json run_config_json(const JobConfig& c, const core::Shape& shape, core::DType dtype, const core::Mask& mask,
                         const core::Layout& layout, double scale, int N) {
  io::Json j = io::Json::object();
  j["ranks"] = N;
  j["seq"] = static_cast<std::int64_t>(shape.S);
  j["batch"] = static_cast<std::int64_t>(shape.B);
  j["heads"] = static_cast<std::int64_t>(shape.H);
  j["kv_heads"] = static_cast<std::int64_t>(shape.HKV);
  j["head_dim"] = static_cast<std::int64_t>(shape.D);
  j["dtype"] = core::dtype_name(dtype);
  j["causal"] = mask.causal();
  j["window"] = static_cast<std::int64_t>(c.window);
  io::Json docs = io::Json::array();
  for (Index n : c.doc_lens) docs.push_back(static_cast<std::int64_t>(n));
  j["doc_lens"] = docs;
  j["layout"] = core::layout_name(layout.kind());
  io::Json part = io::Json::array();
  for (Index n : layout.sizes()) part.push_back(static_cast<std::int64_t>(n));
  j["partition"] = part;
  j["scale"] = scale;
  j["seed"] = static_cast<std::int64_t>(c.seed);
  j["inputs"] = c.inputs;
  j["out"] = c.out;
  j["check"] = c.check;
  j["report"] = c.report;
  j["trace"] = c.trace;
  j["backward"] = c.backward;
  j["warmup"] = c.warmup;
  j["iters"] = c.iters;
  j["timeout"] = c.timeout;
  j["tile_q"] = static_cast<std::int64_t>(c.tiling.q_rows);
  j["tile_k"] = static_cast<std::int64_t>(c.tiling.k_cols);
  j["tile_strip"] = static_cast<std::int64_t>(c.tiling.strip_rows);
  j["mask"] = mask.describe();
  j["traffic"] = c.traffic;
  j["rope"] = c.rope ? io::Json(*c.rope) : io::Json();
  return j;
}

Index peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<Index>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

namespace {

using core::DType;
using core::Shape;

// A tensor with the position axis in the middle: [outer, S, inner].
struct TensorSpec {
  const char* name;
  core::InputTensor id;
  std::vector<Index> shape;
  int pos_axis;
  Index outer, inner;
};

struct Plan : RingOptions {  // layout, mask, traffic, scale
  Shape shape;
  DType dtype = DType::f32;
  std::vector<io::NpyHeader> headers;  // q, k, v, dout when --inputs
  bool have_dout = true;
};

std::vector<TensorSpec> input_specs(const Shape& s) {
  return {{"q", core::InputTensor::q, {s.B, s.S, s.H, s.D}, 1, s.B, s.H * s.D},
          {"k", core::InputTensor::k, {s.B, s.S, s.HKV, s.D}, 1, s.B, s.HKV * s.D},
          {"v", core::InputTensor::v, {s.B, s.S, s.HKV, s.D}, 1, s.B, s.HKV * s.D},
          {"dout", core::InputTensor::dout, {s.B, s.S, s.H, s.D}, 1, s.B, s.H * s.D}};
}

// Shape from the four input files, each fully validated and consistent with the others and with
// any shape option the user also gave.
void shape_from_files(const JobConfig& c, Plan& p) {
  const char* names[] = {"q.npy", "k.npy", "v.npy", "dout.npy"};
  for (int t = 0; t < 4; ++t) {
    const std::string path = path_in(c.inputs, names[t]);
    if (t == 3 && !c.backward && !std::filesystem::exists(path)) {
      p.have_dout = false;
      break;
    }
    p.headers.push_back(io::read_npy_header(path));
    if (p.headers.back().shape.size() != 4)
      throw InputError(fmt::format("{}: has {} dimensions {} (expected 4: [B, S, heads, D])", path,
                                   p.headers.back().shape.size(), shape_str(p.headers.back().shape)));
  }
  const auto& q = p.headers[0].shape;
  const auto& k = p.headers[1].shape;
  p.shape = Shape{q[0], q[1], q[2], k[2], q[3]};
  p.dtype = p.headers[0].dtype;
  for (std::size_t t = 1; t < p.headers.size(); ++t) {
    const std::string path = path_in(c.inputs, names[t]);
    if (p.headers[t].dtype != p.dtype)
      throw InputError(fmt::format("{}: dtype {} differs from q.npy's {} (expected all inputs alike)", path,
                                   core::dtype_name(p.headers[t].dtype), core::dtype_name(p.dtype)));
    const std::vector<Index> want = (t == 3) ? q : std::vector<Index>{q[0], q[1], k[2], q[3]};
    if (p.headers[t].shape != want)
      throw InputError(fmt::format("{}: shape {} does not match q.npy {} (expected {})", path,
                                   shape_str(p.headers[t].shape), shape_str(q), shape_str(want)));
  }
  // The files decide the shape: say which file is wrong, not which option.
  const std::string qpath = path_in(c.inputs, "q.npy"), kpath = path_in(c.inputs, "k.npy");
  for (std::size_t t = 0; t < p.headers.size(); ++t)
    for (Index d : p.headers[t].shape)
      if (d < 1)
        throw InputError(fmt::format("{}: shape {} has a zero dimension (expected B, S, heads, D >= 1)",
                                     path_in(c.inputs, names[t]), shape_str(p.headers[t].shape)));
  if (p.shape.H % p.shape.HKV != 0)
    throw InputError(fmt::format("{}: q.npy has H={} heads, not a multiple of k.npy's HKV={} (expected H % HKV == 0)",
                                 kpath, p.shape.H, p.shape.HKV));
  agree_opt(c.seq, p.shape.S, "--seq");
  agree_opt(c.batch, p.shape.B, "--batch");
  agree_opt(c.heads, p.shape.H, "--heads");
  agree_opt(c.kv_heads, p.shape.HKV, "--kv-heads");
  agree_opt(c.head_dim, p.shape.D, "--head-dim");
  if (!c.dtype.empty() && c.dtype != core::dtype_name(p.dtype))
    throw InputError(fmt::format("--dtype {} contradicts the input files, which are {}", c.dtype,
                                 core::dtype_name(p.dtype)));
}

// Refuse a job whose per-rank memory cannot fit on this node, before allocating anything.
// Estimate per rank (element size p, L the largest shard): layout tables 20 S bytes; input
// shards, the ring's buffers and outputs ~ p B (L (4 H D + 6 HKV D + 4 H) + 8 Lmax HKV D); with
// --check the global float64 inputs and the reference's outputs ~ 8 B S (4 H D + 4 HKV D + H).
void check_memory(const JobConfig& c, const Plan& p, int N) {
  const Shape& s = p.shape;
  const double es = double(core::dtype_size(p.dtype));
  double Lmax = std::ceil(double(s.S) / N);
  for (Index n : c.partition) Lmax = std::max(Lmax, double(n));
  const double B = double(s.B), H = double(s.H), HKV = double(s.HKV), D = double(s.D), S = double(s.S);
  double bytes = 20.0 * S + es * B * (Lmax * (4 * H * D + 6 * HKV * D + 4 * H) + 8 * Lmax * HKV * D);
  if (c.check) bytes += 8.0 * B * S * (4 * H * D + 4 * HKV * D + H);
  double local_ranks = 1;
  if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) local_ranks = std::max(1, std::atoi(v));
  double limit = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE)) / local_ranks;
  rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) limit = std::min(limit, double(rl.rlim_cur));
  if (bytes > limit) {
    const std::string what = !c.inputs.empty() ? path_in(c.inputs, "q.npy") : fmt::format("--seq {}", s.S);
    throw InputError(fmt::format("{}: {} ({}) needs about {:.1f} GiB per rank, more than the {:.1f} GiB available to "
                                 "each of this node's {} ranks (expected a smaller shape or more ranks{})",
                                 what, s.str(), core::dtype_name(p.dtype), bytes / 1073741824.0, limit / 1073741824.0,
                                 local_ranks, c.check ? ", or no --check" : ""));
  }
}

Plan make_plan(const comm::Comm& comm, const JobConfig& c) {
  Plan p;
  if (!c.inputs.empty()) {
    shape_from_files(c, p);
  } else {
    shape_from_options(c, p.shape, p.dtype);
  }
  p.shape.validate();
  if (c.rope) core::validate_rope(*c.rope, p.shape.D);
  const Shape& s = p.shape;
  check_memory(c, p, comm.size());
  static_cast<RingOptions&>(p) = ring_options(c, s, comm.size());
  return p;
}

template <class T>
struct Shard {
  std::vector<T> q, k, v, dout;
  std::vector<T>* get(int t) { return t == 0 ? &q : t == 1 ? &k : t == 2 ? &v : &dout; }
};

// First non-finite value of a local tensor [outer, L, inner], reported by global index.
template <class T>
void check_finite(const std::vector<T>& x, const TensorSpec& spec, const core::Layout& layout, int rank,
                  const std::string& file) {
  const Index L = layout.size(rank), S = layout.seq();
  auto pos = layout.positions(rank);
  for (Index n = 0; n < static_cast<Index>(x.size()); ++n) {
    if (std::isfinite(x[n])) continue;
    const Index a = n / (L * spec.inner), i = (n / spec.inner) % L, e = n % spec.inner;
    const Index flat = (a * S + pos[i]) * spec.inner + e;
    // unravel the flat index over the tensor's shape
    std::vector<Index> idx(spec.shape.size());
    Index rest = flat;
    for (int d = static_cast<int>(spec.shape.size()) - 1; d >= 0; --d) {
      idx[d] = rest % spec.shape[d];
      rest /= spec.shape[d];
    }
    throw InputError(fmt::format("{}: non-finite value {} at index {} (expected finite inputs)", file,
                                 static_cast<double>(x[n]), shape_str(idx)));
  }
}

template <class T>
Shard<T> load_shard(const comm::Comm& comm, const JobConfig& c, const Plan& p) {
  Shard<T> sh;
  const int r = comm.rank();
  const Index L = p.layout.size(r);
  const auto runs = p.layout.runs(r);
  const auto specs = input_specs(p.shape);
  for (int t = 0; t < 4; ++t) {
    const TensorSpec& spec = specs[t];
    std::vector<T>& dst = *sh.get(t);
    dst.resize(spec.outer * L * spec.inner);
    if (!c.inputs.empty()) {
      if (t == 3 && !p.have_dout) continue;  // zeros
      const std::string path = path_in(c.inputs, std::string(spec.name) + ".npy");
      io::read_npy_positions<T>(path, p.headers[t], spec.pos_axis, runs, L, dst.data());
      check_finite(dst, spec, p.layout, r, path);
    } else {
      core::generate_positions<T>(c.seed, spec.id, spec.outer, p.shape.S, spec.inner, runs, L, dst.data());
    }
  }
  return sh;
}

template <class T>
struct Outputs {
  std::vector<T> o, lse, dq, dk, dv;
};

template <class T>
io::CheckReport run_check(const comm::Comm& comm, const JobConfig& c, const Plan& p, const Outputs<T>& out) {
  // Rank 0 alone builds the global float64 inputs and the dense reference, the whole O(S^2) cost
  // of a check; every rank sends it its outputs, and rank 0 broadcasts the errors. Failures on
  // rank 0 are agreed, so no rank waits in a collective.
  const Shape& s = p.shape;
  const int r = comm.rank();
  const Index qi = s.H * s.D, ki = s.HKV * s.D;
  struct Tensor {
    const std::vector<T>* local;
    Index outer, inner;
  };
  std::vector<Tensor> tensors = {{&out.o, s.B, qi}, {&out.lse, s.B * s.H, 1}};
  if (c.backward) tensors.insert(tensors.end(), {{&out.dq, s.B, qi}, {&out.dk, s.B, ki}, {&out.dv, s.B, ki}});
  std::vector<std::vector<double>> gathered;  // rank 0: global [outer, S, inner]
  for (const Tensor& t : tensors)
    gathered.push_back(gather_positions(comm, std::vector<double>(t.local->begin(), t.local->end()), t.outer,
                                        t.inner, p.layout, /*root_only=*/true));

  // [o, lse, dq, dk, dv] relative errors, NaN where not computed
  std::vector<double> err(5, std::numeric_limits<double>::quiet_NaN());
  agreed(comm, [&] {
    if (r != 0) return;
    const auto specs = input_specs(s);
    std::vector<double> g[4];
    for (int t = 0; t < 4; ++t) {
      if (!c.inputs.empty()) {
        if (t == 3 && !p.have_dout) g[t].assign(s.B * s.S * s.H * s.D, 0.0);
        else g[t] = io::read_npy<double>(path_in(c.inputs, std::string(specs[t].name) + ".npy"), p.headers[t]);
      } else {
        const core::Run all{0, 0, s.S};
        g[t].resize(specs[t].outer * s.S * specs[t].inner);
        core::generate_positions<double>(c.seed, specs[t].id, specs[t].outer, s.S, specs[t].inner, {&all, 1}, s.S,
                                         g[t].data());
        if (p.dtype == DType::f32)  // the ranks computed on float inputs: check against those
          for (double& x : g[t]) x = static_cast<double>(static_cast<float>(x));
      }
    }
    const core::DenseResult ref =
        c.rope ? core::reference_attention_rope(s, p.mask, p.scale, *c.rope, g[0], g[1], g[2], g[3], c.backward)
               : core::reference_attention(s, p.mask, p.scale, g[0], g[1], g[2], g[3], c.backward);
    const std::vector<double>* refs[5] = {&ref.o, &ref.lse, &ref.dq, &ref.dk, &ref.dv};
    for (std::size_t k = 0; k < tensors.size(); ++k) err[k] = core::max_rel_error(gathered[k], *refs[k]);
  });
  comm.broadcast(err, 0);
  io::CheckReport cr;
  cr.tolerance = check_tolerance(p.dtype);
  cr.o = err[0];
  cr.lse = err[1];
  cr.dq = err[2];
  cr.dk = err[3];
  cr.dv = err[4];
  const double tol = cr.tolerance;  // NaN or inf never passes
  cr.passed = cr.o <= tol && cr.lse <= tol && (!c.backward || (cr.dq <= tol && cr.dk <= tol && cr.dv <= tol));
  return cr;
}

// What `run --out` writes: the outputs, and the inputs when they were generated from --seed.
template <class T>
std::vector<typename StagedOutputs<T>::File> output_files(const JobConfig& c, const Shape& s, const Shard<T>& in,
                                                          const Outputs<T>& out) {
  const std::vector<Index> query{s.B, s.S, s.H, s.D}, kv{s.B, s.S, s.HKV, s.D};
  std::vector<typename StagedOutputs<T>::File> files = {{"o", query, 1, out.o}, {"lse", {s.B, s.H, s.S}, 2, out.lse}};
  if (c.backward) {
    files.push_back({"dq", query, 1, out.dq});
    files.push_back({"dk", kv, 1, out.dk});
    files.push_back({"dv", kv, 1, out.dv});
  }
  if (c.inputs.empty()) {
    files.push_back({"q", query, 1, in.q});
    files.push_back({"k", kv, 1, in.k});
    files.push_back({"v", kv, 1, in.v});
    files.push_back({"dout", query, 1, in.dout});
  }
  return files;
}

io::Json config_json(const JobConfig& c, const Plan& p, int N) {
  return run_config_json(c, p.shape, p.dtype, p.mask, p.layout, p.scale, N);
}

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.2f} {}", b, unit[u]);
}

std::string ms(double s) { return fmt::format("{:.3f} ms", s * 1e3); }

void print_summary(const JobConfig& c, const Plan& p, const io::Report& rep) {
  const Shape& s = p.shape;
  const int N = static_cast<int>(rep.ranks.size());
  fmt::print("ringattn run: {} {}, mask {}, layout {} over N={} ranks\n", s.str(), core::dtype_name(p.dtype),
             p.mask.describe(), core::layout_name(p.layout.kind()), N);
  fmt::print("  time (slowest rank, median of {}): forward {}  backward {}\n", c.iters, ms(rep.forward_s),
             c.backward ? ms(rep.backward_s) : std::string("-"));
  fmt::print("  {:>4} {:>9} {:>11} {:>11} {:>11} {:>11} {:>7} {:>11} {:>11} {:>10} {:>9} {:>9}\n", "rank", "positions",
             "forward", "backward", "compute", "wait", "wait%", "sent", "received", "tile pairs", "GFLOP", "GFLOP/s");
  double sent = 0, recv = 0, flops = 0;
  for (const io::RankReport& r : rep.ranks) {
    const double total = r.forward_s + r.backward_s;
    const double bs = double(r.ledger.send_elems() * Index(rep.elem_size));
    const double br = double(r.ledger.recv_elems() * Index(rep.elem_size));
    sent += bs;
    recv += br;
    flops += r.work.flops;
    fmt::print("  {:>4} {:>9} {:>11} {:>11} {:>11} {:>11} {:>6.2f}% {:>11} {:>11} {:>10} {:>9.3f} {:>9.2f}\n", r.rank,
               r.positions, ms(r.forward_s), ms(r.backward_s), ms(r.compute_s), ms(r.wait_s),
               total > 0 ? 100 * r.wait_s / total : 0.0, human_bytes(bs), human_bytes(br), r.work.tile_pairs,
               r.work.flops * 1e-9, total > 0 ? r.work.flops / total * 1e-9 : 0.0);
  }
  Index rss = 0, budget = 0;
  for (const io::RankReport& r : rep.ranks) {
    rss = std::max(rss, r.peak_rss_bytes);
    budget = std::max(budget, r.budget_bytes);
  }
  fmt::print("  bytes moved: {} sent, {} received (all ranks); loss {:.10g}\n", human_bytes(sent), human_bytes(recv),
             rep.loss);
  const double mean = flops / std::max<std::size_t>(1, rep.ranks.size());
  double max_flops = 0;
  for (const io::RankReport& r : rep.ranks) max_flops = std::max(max_flops, r.work.flops);
  fmt::print("  work imbalance (max/mean flops): {:.3f}; for causal contiguous shards the seed's block model gives "
             "2N/(N+1) = {:.3f}, visible pairs only (2N-1)/N = {:.3f}\n",
             mean > 0 ? max_flops / mean : 1.0, 2.0 * N / (N + 1), (2.0 * N - 1) / N);
  fmt::print("  memory per rank (largest): ring buffers {}, peak RSS {}; total {:.2f} GFLOP\n", human_bytes(double(budget)),
             human_bytes(double(rss)), flops * 1e-9);
  if (rep.check) {
    const io::CheckReport& k = *rep.check;
    auto e = [](double x) { return std::isnan(x) ? std::string("-") : fmt::format("{:.2e}", x); };
    fmt::print("  check vs float64 reference (max rel err, tol {:.0e}): o {} lse {} dq {} dk {} dv {} -> {}\n",
               k.tolerance, e(k.o), e(k.lse), e(k.dq), e(k.dk), e(k.dv), k.passed ? "PASSED" : "FAILED");
  }
}

void write_trace(const comm::Comm& comm, const std::string& path, const std::vector<StepRecord>& steps) {
  std::vector<double> mine;
  for (const StepRecord& s : steps)
    mine.insert(mine.end(), {double(s.pass), double(s.step), double(s.src), s.compute_s, s.wait_s, double(s.bytes)});
  const std::vector<double> all = comm.gather(mine);
  agreed_runtime(comm, [&] {
    if (comm.rank() != 0) return;
    std::string text;
    const std::size_t per = mine.size();
    for (int r = 0; r < comm.size(); ++r)
      for (std::size_t k = 0; k < per; k += 6) {
        const double* x = &all[r * per + k];
        text += fmt::format(
            "{{\"rank\": {}, \"pass\": \"{}\", \"step\": {}, \"src\": {}, \"compute_s\": {:.9g}, \"wait_s\": {:.9g}, "
            "\"bytes\": {}}}\n",
            r, x[0] == 0 ? "forward" : "backward", int(x[1]), int(x[2]), x[3], x[4], std::int64_t(x[5]));
      }
    io::write_text_atomically(path, text);
  });
}

// Progress of long runs on rank 0's stderr: a live line on a terminal; in logs at most one line
// every few seconds. Silent for the first two seconds so short jobs print nothing.
class ProgressLine {
 public:
  ProgressLine(int iterations) : tty_(::isatty(STDERR_FILENO) != 0), iterations_(iterations), t0_(comm::wtime()) {}
  void iteration(int it) { it_ = it; }
  void operator()(int pass, int done, int steps) {
    const double now = comm::wtime();
    if (done == 0) {  // a pass starts
      pass_t0_ = now;
      return;
    }
    // nothing for the first 2 s; then a live line on a terminal, at most one line per 5 s in a log
    if (now - t0_ < 2.0 || (!tty_ && now - last_ < 5.0)) return;
    const double per_step = (now - pass_t0_) / done;
    const std::string line =
        fmt::format("ringattn: iteration {}/{} {} step {}/{}  elapsed {:.1f} s  pass remaining ~{:.1f} s", it_ + 1,
                    iterations_, pass == 0 ? "forward" : "backward", done, steps, now - t0_, per_step * (steps - done));
    if (tty_) fmt::print(stderr, "\r{:<100}{}", line, done == steps ? "\n" : "");
    else fmt::print(stderr, "{}\n", line);
    std::fflush(stderr);
    last_ = now;
  }

 private:
  bool tty_;
  int iterations_, it_ = 0;
  double t0_, pass_t0_ = 0, last_ = -1e9;
};

template <class T>
int run_typed(const comm::Comm& comm, const JobConfig& c, const Plan& p) {
  const int r = comm.rank(), N = comm.size();
  Shard<T> in;
  agreed(comm, [&] { in = load_shard<T>(comm, c, p); });

  RingSetup setup = ring_setup(c, p.shape, p);
  ProgressLine progress(c.warmup + c.iters);
  if (r == 0) setup.on_step = [&progress](int pass, int done, int steps) { progress(pass, done, steps); };
  RingAttention<T> ring(comm, setup);
  // --rope: the ring attends q and k rotated at their global positions; `in` keeps them as given.
  std::optional<core::ShardRope<T>> rope;
  if (c.rope) rope.emplace(*c.rope, p.shape, p.layout.positions(r), in.q.data(), in.k.data());
  ring.load(rope ? rope->q() : in.q.data(), rope ? rope->k() : in.k.data(), in.v.data(),
            c.backward ? in.dout.data() : nullptr);

  std::vector<double> fwd, bwd, comp, wait, fwd_slow, bwd_slow;
  PassStats pf, pb;
  for (int it = 0; it < c.warmup + c.iters; ++it) {
    progress.iteration(it);
    comm.barrier();
    pf = ring.forward();
    pb = c.backward ? ring.backward() : PassStats{};
    const double slow_f = comm.max(pf.total_s), slow_b = comm.max(pb.total_s);
    if (it < c.warmup) continue;
    fwd.push_back(pf.total_s);
    bwd.push_back(pb.total_s);
    comp.push_back(pf.compute_s + pb.compute_s);
    wait.push_back(pf.wait_s + pb.wait_s);
    fwd_slow.push_back(slow_f);
    bwd_slow.push_back(slow_b);
  }

  const Index L = ring.local_size();
  const Shape& s = p.shape;
  Outputs<T> out;
  out.o.resize(s.B * L * s.H * s.D);
  out.lse.resize(s.B * s.H * L);
  if (c.backward) {
    out.dq.resize(s.B * L * s.H * s.D);
    out.dk.resize(s.B * L * s.HKV * s.D);
    out.dv.resize(s.B * L * s.HKV * s.D);
  }
  ring.outputs(out.o.data(), out.lse.data(), c.backward ? out.dq.data() : nullptr,
               c.backward ? out.dk.data() : nullptr, c.backward ? out.dv.data() : nullptr);
  if (rope && c.backward) rope->backward(out.dq.data(), out.dk.data());  // gradients of q, k as given

  double loss = 0;  // sum dout . O, accumulated in double
  for (std::size_t n = 0; n < out.o.size(); ++n) loss += double(in.dout[n]) * double(out.o[n]);
  loss = comm.sum(loss);

  io::Report rep;
  rep.config = config_json(c, p, N);
  rep.loss = loss;
  rep.forward_s = median(fwd_slow);
  rep.backward_s = median(bwd_slow);
  rep.elem_size = sizeof(T);
  if (c.check) rep.check = run_check(comm, c, p, out);

  // Per-rank figures travel to rank 0 in one gather.
  core::Work work = pf.work;
  work += pb.work;
  io::RankReport mine{r,           L,           ring.ledger(), median(fwd),           median(bwd),
                      median(comp), median(wait), work,          ring.resident_bytes(), peak_rss_bytes()};
  const std::vector<double> all = comm.gather(io::to_row(mine));
  if (r == 0)
    for (int q = 0; q < N; ++q) rep.ranks.push_back(io::from_row(&all[q * io::kRankReportFields], q));

  // Outputs become visible last, only when the trace and the report were written too.
  StagedOutputs<T> staged(comm, c.out, p.dtype, p.layout);
  if (!c.out.empty()) staged.stage(output_files(c, p.shape, in, out));
  if (!c.trace.empty()) {
    std::vector<StepRecord> steps = pf.steps;
    steps.insert(steps.end(), pb.steps.begin(), pb.steps.end());
    write_trace(comm, c.trace, steps);
  }
  if (!c.report.empty())
    agreed_runtime(comm, [&] {
      if (r == 0) io::write_text_atomically(c.report, io::to_json(rep).dump(2) + "\n");
    });
  staged.commit();
  if (r == 0) print_summary(c, p, rep);
  return rep.check && !rep.check->passed ? kExitCheckFailed : kExitOk;
}

}  // namespace

// Root passes access(W_OK) even where nothing can be created (/proc, read-only mounts): create
// and remove a probe file instead.
static void probe_writable(const std::string& dir, const std::string& what) {
  const std::string probe = path_in(dir, fmt::format(".ringattn-probe-{}", ::getpid()));
  const int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0)
    throw InputError(fmt::format("{}: cannot create files in {}: {} (expected a writable directory)", what, dir,
                                 std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
}

void ensure_out_dir(const comm::Comm& comm, const std::string& dir) {
  agreed(comm, [&] {
    if (comm.rank() != 0) return;
    std::error_code ec;
    if (!std::filesystem::exists(dir, ec)) std::filesystem::create_directory(dir, ec);
    if (ec || !std::filesystem::is_directory(dir))
      throw InputError(fmt::format("--out {}: is not a directory and cannot be created (expected a writable "
                                   "directory)", dir));
    probe_writable(dir, "--out " + dir);
    // Temporary files of an earlier job that was killed outright (SIGKILL leaves them behind).
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 9 && name[0] == '.' && name.ends_with(".npy.partial")) std::filesystem::remove(e.path(), ec);
    }
  });
}

void check_writable_file(const comm::Comm& comm, const std::string& path, const char* opt) {
  agreed(comm, [&] {
    if (comm.rank() != 0 || path.empty()) return;
    const auto parent = std::filesystem::path(path).parent_path();
    const std::string dir = parent.empty() ? "." : parent.string();
    if (!std::filesystem::is_directory(dir))
      throw InputError(fmt::format("{} {}: directory {} does not exist (expected a writable directory)", opt, path, dir));
    probe_writable(dir, fmt::format("{} {}", opt, path));
  });
}

int run_job(const comm::Comm& comm, const JobConfig& c) {
  check_run_options(c);
  Plan p;
  agreed(comm, [&] { p = make_plan(comm, c); });
  if (!c.out.empty()) ensure_out_dir(comm, c.out);
  check_writable_file(comm, c.report, "--report");
  check_writable_file(comm, c.trace, "--trace");
  return p.dtype == DType::f32 ? run_typed<float>(comm, c, p) : run_typed<double>(comm, c, p);
}

}  // namespace ringattn::runtime
