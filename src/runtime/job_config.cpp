#include "ringattn/runtime/job_config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "ringattn/comm/simulation.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/core/head_split.hpp"
#include "ringattn/core/rope.hpp"
#include "ringattn/core/simd.hpp"
#include "ringattn/io/json.hpp"
#include "ringattn/runtime/paths.hpp"
#include "ringattn/runtime/ring_attention.hpp"

namespace ringattn::runtime {

using core::DType;
using core::Shape;

double check_tolerance(DType t) { return t == DType::f64 ? 1e-10 : 3e-4; }  // bf16, f16: f32 arithmetic

std::string path_in(const std::string& dir, const std::string& file) {
  return (std::filesystem::path(dir) / file).string();
}

std::string join(std::span<const Index> v, const char* sep) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += sep;
    s += std::to_string(v[i]);
  }
  return s;
}

std::vector<double> gather_positions(const comm::Group& g, std::span<const double> mine, Index outer, Index inner,
                                     const core::Layout& l, int root) {
  const auto parts = g.gatherv(mine, root);
  if (parts.empty()) return {};
  const Index S = l.seq();
  std::vector<double> out(outer * S * inner);
  for (int r = 0; r < g.size(); ++r) {
    const Index L = l.size(r);
    const auto pos = l.positions(r);
    for (Index a = 0; a < outer; ++a)
      for (Index i = 0; i < L; ++i) std::copy_n(&parts[r][(a * L + i) * inner], inner, &out[(a * S + pos[i]) * inner]);
  }
  return out;
}

std::string shape_str(const std::vector<Index>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

void check_run_options(const JobConfig& c) {
  if (c.iters < 1) throw InputError(fmt::format("--iters: {} is not >= 1", c.iters));
  if (c.warmup < 0) throw InputError(fmt::format("--warmup: {} is negative", c.warmup));
  if (c.timeout && !(std::isfinite(*c.timeout) && *c.timeout >= 0))
    throw InputError(fmt::format("--timeout: {} is not a time (expected SEC >= 0; 0 disables the watchdog)", *c.timeout));
  if (c.timing_only) {
    if (!comm::simulated())
      throw InputError("--timing-only: only the SimGrid/SMPI simulation build charges counted flops (scripts/simulate.sh)");
    for (const auto& [option, given] : {std::pair{"--check", c.check}, std::pair{"--out", !c.out.empty()},
                                        std::pair{"--inputs", !c.inputs.empty()}, std::pair{"--layer", c.layer},
                                        std::pair{"--rope", c.rope.has_value()}})
      if (given)
        throw InputError(fmt::format("{}: not with --timing-only (a timing-only run computes no values, so there is "
                                     "nothing to read, rotate, write or check)", option));
  }
  for (const auto& [option, value] : {std::pair{"--tile-q", c.tiling.q_rows}, std::pair{"--tile-k", c.tiling.k_cols},
                                      std::pair{"--tile-strip", c.tiling.strip_rows}})
    if (value < 0 || value > 65536)
      throw InputError(fmt::format("{}: {} is outside 0..65536 (a tile size; 0: the SIMD target's default)", option,
                                   value));
}

namespace {

DType dtype_from_option(const std::string& name) {
  if (name.empty()) return DType::f32;
  if (const auto t = core::dtype_from_name(name)) return *t;
  throw InputError(fmt::format("--dtype: unknown dtype '{}' (expected bf16, f16, f32 or f64)", name));
}

// Attention mode: q, k, v, dout [B, S, heads, D].
void attention_specs(JobPlan& p) {
  const Shape& s = p.shape;
  p.inputs.specs = {{"q", core::InputTensor::q, {s.B, s.S, s.H, s.D}},
                    {"k", core::InputTensor::k, {s.B, s.S, s.HKV, s.D}},
                    {"v", core::InputTensor::v, {s.B, s.S, s.HKV, s.D}},
                    {"dout", core::InputTensor::dout, {s.B, s.S, s.H, s.D}}};
}

// Layer mode: x, dy [B, S, M] by position; the weights whole. Generated weights are scaled by
// 1/sqrt(fan_in) so that Q, K, V and Y stay of order one.
void layer_specs(JobPlan& p) {
  const Shape& s = p.shape;
  const Index M = p.model_dim, HD = s.H * s.D, KD = s.HKV * s.D;
  const double in = 1.0 / std::sqrt(double(M)), out = 1.0 / std::sqrt(double(HD));
  p.inputs.specs = {{"x", core::InputTensor::x, {s.B, s.S, M}},
                    {"wq", core::InputTensor::wq, {M, HD}, kWhole, in},
                    {"wk", core::InputTensor::wk, {M, KD}, kWhole, in},
                    {"wv", core::InputTensor::wv, {M, KD}, kWhole, in},
                    {"wo", core::InputTensor::wo, {HD, M}, kWhole, out},
                    {"dy", core::InputTensor::dy, {s.B, s.S, M}}};
}

void attention_from_files(const JobConfig& c, JobPlan& p) {
  const char* four = "4: [B, S, heads, D]";
  p.inputs.headers = read_headers(c.inputs, {{"q", 4, four}, {"k", 4, four}, {"v", 4, four},
                                             {"dout", 4, four, !c.backward}});
  const auto& q = p.inputs.headers[0]->shape;
  const auto& k = p.inputs.headers[1]->shape;
  p.shape = Shape{q[0], q[1], q[2], k[2], q[3]};
  p.dtype = p.inputs.headers[0]->dtype;
  const char* names[] = {"q.npy", "k.npy", "v.npy", "dout.npy"};
  for (std::size_t t = 1; t < 4; ++t) {
    if (!p.inputs.headers[t]) continue;
    const std::vector<Index> want = (t == 3) ? q : std::vector<Index>{q[0], q[1], k[2], q[3]};
    if (p.inputs.headers[t]->shape != want)
      throw InputError(fmt::format("{}: shape {} does not match q.npy {} (expected {})",
                                   path_in(c.inputs, names[t]), shape_str(p.inputs.headers[t]->shape),
                                   shape_str(q), shape_str(want)));
  }
  if (p.shape.H % p.shape.HKV != 0)
    throw InputError(fmt::format("{}: q.npy has H={} heads, not a multiple of k.npy's HKV={} (expected H % HKV == 0)",
                                 path_in(c.inputs, "k.npy"), p.shape.H, p.shape.HKV));
  agree_opt(c.head_dim, p.shape.D, "--head-dim");
  agree_opt(c.heads, p.shape.H, "--heads");
}

// The weights give H*D and HKV*D; --heads or --head-dim splits them.
void layer_from_files(const JobConfig& c, JobPlan& p) {
  const char* three = "3: [B, S, M]";
  const char* two = "2: a weight matrix";
  p.inputs.headers = read_headers(c.inputs, {{"x", 3, three}, {"wq", 2, two}, {"wk", 2, two}, {"wv", 2, two},
                                             {"wo", 2, two}, {"dy", 3, three, !c.backward}});
  const auto& h = p.inputs.headers;
  const auto& x = h[0]->shape;
  p.dtype = h[0]->dtype;
  p.model_dim = x[2];
  const Index HD = h[1]->shape[1], KD = h[2]->shape[1];
  Index D = 0;
  if (c.head_dim) {
    D = *c.head_dim;
  } else if (c.heads) {
    if (*c.heads < 1 || HD % *c.heads != 0)
      throw InputError(fmt::format("--heads {} does not divide wq.npy's H*D = {}", *c.heads, HD));
    D = HD / *c.heads;
  } else {
    throw InputError(fmt::format("--layer --inputs: wq.npy gives H*D = {}; give --heads or --head-dim to split it", HD));
  }
  if (D < 1 || HD % D != 0 || KD % D != 0)
    throw InputError(fmt::format("--layer --inputs: head dim D = {} does not divide wq.npy's H*D = {} and wk.npy's "
                                 "HKV*D = {}", D, HD, KD));
  p.shape = Shape{x[0], x[1], HD / D, KD / D, D};
  layer_specs(p);
  for (std::size_t f = 1; f < h.size(); ++f) {
    if (!h[f]) continue;
    if (h[f]->shape != p.inputs.specs[f].shape)
      throw InputError(fmt::format("{}.npy: shape {} does not match x.npy {} and wq.npy {} (expected {})",
                                   p.inputs.specs[f].name, shape_str(h[f]->shape), shape_str(x),
                                   shape_str(h[1]->shape), shape_str(p.inputs.specs[f].shape)));
  }
  agree_opt(c.heads, p.shape.H, "--heads");
  agree_opt(c.model_dim, p.model_dim, "--model-dim");
}

// The option a memory error should name: the given shape option furthest above its default, or
// the first input file.
std::string memory_culprit(const JobConfig& c, const JobPlan& p) {
  if (!c.inputs.empty()) return path_in(c.inputs, c.layer ? "x.npy" : "q.npy");
  struct Opt {
    const char* name;
    std::optional<Index> v;
    double def;
  };
  const Opt opts[] = {{"--seq", c.seq, double(kDefaultSeq)},      {"--batch", c.batch, double(kDefaultBatch)},
                      {"--heads", c.heads, double(kDefaultHeads)},  {"--kv-heads", c.kv_heads, double(kDefaultHeads)},
                      {"--head-dim", c.head_dim, double(kDefaultHeadDim)}, {"--model-dim", c.model_dim, 64.0}};
  const Opt* worst = nullptr;
  for (const Opt& o : opts)
    if (o.v && (!worst || double(*o.v) / o.def > double(*worst->v) / worst->def)) worst = &o;
  if (!worst) return fmt::format("--seq {}", p.shape.S);
  return fmt::format("{} {}", worst->name, *worst->v);
}

// Everything the job allocates on its most loaded rank, before anything is allocated. Computed
// in double: an absurd shape must be refused, not overflow.
MemoryPlan memory_plan(const JobConfig& c, const JobPlan& p, int N, Index Lmax) {
  const Shape& s = p.shape;
  const double es = double(core::dtype_size(p.dtype)), ea = double(core::dtype_size(core::accum_dtype(p.dtype)));
  const double B = double(s.B), H = double(s.H), HKV = double(s.HKV), D = double(s.D), S = double(s.S);
  const double L = double(Lmax), M = double(p.model_dim);
  MemoryPlan m;
  m.add("layout tables", 20.0 * S);
  m.add("input shards", es * B * L * (2 * H + 2 * HKV) * D);
  // The ring's shards, two remote K/V buffers, state, gradient buffers and tile scratch. A
  // head-parallel strategy runs the ring over groups of U ranks (U times the positions, H/U query
  // heads and the kv heads they read) between all-to-alls.
  const int U = p.ulysses_degree;
  const core::HeadSplit hs = core::split_heads(s, U);
  const double Lr = L * U, Hr = double(hs.Hu), HKVr = double(hs.HKVu), R = double(N / U);
  const double block = 2 * B * HKVr * D * Lr, q = B * Hr * D * Lr, rows = B * Hr * Lr;
  double ring = es * (q + block) + ea * (3 * rows + q) + (R > 1 ? es * 2 * block : 0.0);
  if (c.backward) ring += es * q + ea * (rows + q + block) + (R > 1 ? ea * 3 * block : 0.0);
  const core::Tiling t =
      core::resolve_tiling(c.tiling, s.D, std::min<Index>(Lmax * U, Index(1) << 40), hs.Gu);
  ring += double(p.dtype == DType::f64 ? core::Workspace<double>::bytes(t, s.D)
                                       : core::Workspace<float>::bytes(t, s.D));
  m.add("ring buffers and tile scratch", ring);
  if (p.strategy != StrategyKind::ring) {  // send, receive and group tensors; their outputs
    const double qkv = B * Lr * (Hr + 2 * HKVr) * D, ret = B * Lr * std::max(Hr + 2 * HKVr, Hr + Hr / D) * D;
    double a2a = es * 3 * qkv + ea * (2 * ret + B * Lr * Hr * (D + 1)) + ea * B * L * H * (D + 1);
    if (c.backward) a2a += es * 3 * B * Lr * Hr * D + ea * (qkv + B * L * (H + 2 * HKV) * D);
    m.add("all-to-all buffers", a2a);
  }
  m.add("outputs", ea * B * L * (2 * H * D + H + 2 * HKV * D));
  if (c.rope) m.add("rotated q and k", es * B * L * (H + HKV) * D);
  if (c.layer) {
    const double w = M * (2 * H + 2 * HKV) * D;
    m.add("layer weights and their gradients", ea * 3 * w);
    m.add("layer activations", ea * B * L * (4 * M + 4 * H * D + 4 * HKV * D));
  }
  if (c.check) {  // rank 0: global float64 inputs, outputs gathered, the reference's outputs and rows
    double g = 8.0 * B * S * (4 * H * D + 4 * HKV * D + H) * 2 + 8.0 * 2 * std::min(256.0, S) * S;
    if (c.layer) g += 8.0 * (4 * B * S * M + 3 * M * (2 * H + 2 * HKV) * D);
    m.add("--check reference", g);
  }
  return m;
}

Index largest_shard(core::LayoutKind kind, Index S, int N, const std::vector<Index>& partition) {
  if (!partition.empty()) return *std::max_element(partition.begin(), partition.end());
  if (kind == core::LayoutKind::zigzag) return 2 * ((S + 2 * N - 1) / (2 * Index(N)));
  return (S + N - 1) / N;
}

}  // namespace

JobPlan make_plan(const JobConfig& c, int N) {
  JobPlan p;
  p.inputs.dir = c.inputs;
  p.inputs.seed = c.seed;
  if (c.layer && !c.inputs.empty()) {
    layer_from_files(c, p);
  } else if (!c.inputs.empty()) {
    attention_from_files(c, p);
  } else {
    p.shape = Shape{c.batch.value_or(kDefaultBatch), c.seq.value_or(kDefaultSeq), c.heads.value_or(kDefaultHeads), 0,
                    c.head_dim.value_or(kDefaultHeadDim)};
    p.shape.HKV = c.kv_heads.value_or(p.shape.H);
    p.dtype = dtype_from_option(c.dtype);
    if (c.layer) {
      if (!c.model_dim) throw InputError("--layer: needs --model-dim M (or --inputs with x.npy)");
      p.model_dim = *c.model_dim;
    }
  }
  if (!c.inputs.empty()) {
    agree_opt(c.seq, p.shape.S, "--seq");
    agree_opt(c.batch, p.shape.B, "--batch");
    agree_opt(c.kv_heads, p.shape.HKV, "--kv-heads");
    // Another dtype than the files': values are converted on load, rounded to nearest even when
    // the new type is narrower (or another 16-bit kind); the inputs as used are then written out.
    if (!c.dtype.empty()) {
      const DType files = p.dtype;
      p.dtype = dtype_from_option(c.dtype);
      p.inputs.rounded = p.dtype != files && core::dtype_size(p.dtype) <= core::dtype_size(files);
    }
  }
  if (c.layer && p.model_dim < 1) throw InputError(fmt::format("--model-dim: {} is not >= 1", p.model_dim));
  p.shape.validate();
  if (c.rope) core::validate_rope(*c.rope, p.shape.D);
  const bool half = p.dtype == DType::bf16 || p.dtype == DType::f16;
  if (half && c.layer)
    throw InputError(fmt::format("--layer: not supported with --dtype {} (the projections' Q, K and V would be rounded "
                                 "to {} between the GEMMs and the attention, which no reference here models; "
                                 "expected --dtype f32 or f64 with --layer)", core::dtype_name(p.dtype),
                                 core::dtype_name(p.dtype)));
  if (half && c.rope)
    throw InputError(fmt::format("--rope: not supported with --dtype {} (the rotated q and k would be rounded to {} "
                                 "again; expected --dtype f32 or f64 with --rope)", core::dtype_name(p.dtype),
                                 core::dtype_name(p.dtype)));
  if (c.layer) layer_specs(p);
  else attention_specs(p);

  // auto: zigzag balances a causal triangle; a window or documents keep contiguous shards, whose
  // bytes then scale with what is visible; explicit sizes are contiguous.
  const bool automatic = c.layout == "auto";
  const core::LayoutKind kind = automatic
                                    ? (c.causal && c.window == 0 && c.partition.empty() ? core::LayoutKind::zigzag
                                                                                         : core::LayoutKind::contiguous)
                                    : core::parse_layout_kind(c.layout);
  if (!c.partition.empty()) {
    if (kind != core::LayoutKind::contiguous)
      throw InputError(fmt::format("--partition: only applies to --layout contiguous, not {}", c.layout));
    if (static_cast<int>(c.partition.size()) != N)
      throw InputError(
          fmt::format("--partition: has {} sizes for {} ranks (expected one per rank)", c.partition.size(), N));
    Index sum = 0;
    for (Index n : c.partition) {
      if (n < 0) throw InputError(fmt::format("--partition: size {} is negative (expected sizes >= 0)", n));
      sum += n;
    }
    if (sum != p.shape.S)
      throw InputError(fmt::format("--partition: sizes sum to {} but S is {} (expected sum == S)", sum, p.shape.S));
  }
  p.strategy = parse_strategy(c.strategy);
  if (c.ulysses_degree && *c.ulysses_degree < 1)
    throw InputError(fmt::format("--ulysses-degree: {} is not >= 1", *c.ulysses_degree));
  check_strategy(p.strategy, c.ulysses_degree.value_or(0), p.shape.H, N);
  p.ulysses_degree = ulysses_degree(p.strategy, c.ulysses_degree.value_or(0), N);
  // Before anything of size S is built.
  const Index Lmax = largest_shard(kind, p.shape.S, N, c.partition);
  if (!c.timing_only)  // a timing-only run folds its large buffers onto shared pages
    admit_memory(memory_plan(c, p, N, Lmax), memory_culprit(c, p), fmt::format("{} ({})", p.shape.str(),
               core::dtype_name(p.dtype)), c.check ? "a smaller shape, more ranks, or no --check"
                                                   : "a smaller shape or more ranks");
  p.layout = core::Layout::make(kind, p.shape.S, N, c.partition);
  if (c.window < 0) throw InputError(fmt::format("--window: {} is negative (expected W >= 1)", c.window));
  p.mask = core::Mask::make(p.shape.S, c.causal, c.window, c.doc_lens);
  if (c.traffic == "aware") p.traffic = core::Traffic::aware;
  else if (c.traffic == "full") p.traffic = core::Traffic::full;
  else if (c.traffic == "skip-empty") p.traffic = core::Traffic::skip_empty_grads;
  else throw InputError(fmt::format("--traffic: unknown plan '{}' (expected full, aware or skip-empty)", c.traffic));
  p.scale = c.scale ? *c.scale : 1.0 / std::sqrt(double(p.shape.D));
  if (!std::isfinite(p.scale)) throw InputError(fmt::format("--scale: {} is not a finite number", p.scale));
  // The scores are computed in the accumulation type: the scale must be a finite number there too.
  if (p.dtype != DType::f64 && !std::isfinite(static_cast<float>(p.scale)))
    throw InputError(fmt::format("--scale: {:g} overflows {}'s float32 arithmetic (expected |scale| <= {:g})", p.scale,
                                 core::dtype_name(p.dtype), double(std::numeric_limits<float>::max())));
  p.timeout_s = c.timeout ? *c.timeout : default_timeout(c, p);
  if (comm::simulated()) p.timeout_s = 0;  // simulated time: no watchdog (see comm::Comm::set_timeout)
  return p;
}

StrategySetup strategy_setup(const JobConfig& c, const JobPlan& p) {
  StrategySetup s;
  s.shape = p.shape;
  s.layout = &p.layout;
  s.mask = &p.mask;
  s.scale = p.scale;
  // A head-parallel strategy resolves the tiles for the shape its ring attends.
  s.tiling = p.strategy == StrategyKind::ring
                 ? core::resolve_tiling(c.tiling, p.shape.D, p.layout.max_size(), p.shape.G())
                 : c.tiling;
  s.traffic = p.traffic;
  s.kind = p.strategy;
  s.ulysses_degree = p.ulysses_degree;
  s.hooks = c.hooks;
  s.timing_only = c.timing_only;
  s.on_step = c.progress.step;
  return s;
}

double default_timeout(const JobConfig& c, const JobPlan& p) {
  const Shape& s = p.shape;
  const double L = double(p.layout.max_size()), S = double(s.S), HD = double(s.H) * double(s.D);
  double flops = 4.0 * double(s.B) * L * S * HD * (c.backward ? 3.5 : 1.0);
  if (c.layer) flops += 2.0 * double(s.B) * L * double(p.model_dim) * HD * 8;
  if (c.check) flops += 4.0 * double(s.B) * S * S * HD * 3.5;
  return 300.0 + 10.0 * flops / 1e9;
}

std::vector<PlanField> plan_fields(const JobConfig& c, const JobPlan& p) {
  const Shape& s = p.shape;
  auto num = [](double v) { return fmt::format("{:.17g}", v); };
  std::vector<PlanField> f = {
      {"S (--seq or the input files)", std::to_string(s.S)},
      {"B (--batch or the input files)", std::to_string(s.B)},
      {"H (--heads or the input files)", std::to_string(s.H)},
      {"HKV (--kv-heads or the input files)", std::to_string(s.HKV)},
      {"D (--head-dim or the input files)", std::to_string(s.D)},
      {"the dtype (--dtype or the input files)", core::dtype_name(p.dtype)},
      {"--layer", c.layer ? "on" : "off"},
      {"M (--model-dim or the input files)", std::to_string(p.model_dim)},
      {"--causal", c.causal ? "on" : "off"},
      {"--window", std::to_string(c.window)},
      {"--doc-lens", join(c.doc_lens)},
      {"the layout (--layout)", core::layout_name(p.layout.kind())},
      {"the shard sizes (--partition and the layout)", join(p.layout.sizes())},
      {"--scale", num(p.scale)},
      {"--strategy", strategy_name(p.strategy)},
      {"the Ulysses degree (--ulysses-degree and the strategy)", std::to_string(p.ulysses_degree)},
      {"--traffic", c.traffic},
      {"--rope", c.rope ? num(*c.rope) : "off"},
      {"--no-backward", c.backward ? "off" : "on"},
      {"--check", c.check ? "on" : "off"},
      {"--warmup", std::to_string(c.warmup)},
      {"--iters", std::to_string(c.iters)},
      {"--tile-q", std::to_string(c.tiling.q_rows)},
      {"--tile-k", std::to_string(c.tiling.k_cols)},
      {"--tile-strip", std::to_string(c.tiling.strip_rows)},
      {"--seed", std::to_string(c.seed)},
      {"--inputs", c.inputs},
      {"--out", c.out},
      {"--report", c.report},
      {"--trace", c.trace},
      {"--timeout", num(p.timeout_s)},
#ifdef RINGATTN_SMPI
      {"--timing-only", c.timing_only ? "on" : "off"},
#endif
      {"the test hooks", fmt::format("{} {} {} {} {}", c.hooks.drop_grad_step, c.hooks.stall_rank, c.hooks.stall_s,
                                     c.average_weight_grads, c.rope_local_positions)}};
  for (std::size_t t = 0; t < p.inputs.specs.size(); ++t)
    if (p.inputs.from_files())
      f.push_back({p.inputs.specs[t].name + ".npy's header",
                   p.inputs.headers[t] ? io::describe(p.inputs.headers[t]->dtype, p.inputs.headers[t]->shape)
                                       : "(absent)"});
  return f;
}

io::Json config_json(const JobConfig& c, const JobPlan& p, int N) {
  io::Json j = io::Json::object();
  const Shape& shape = p.shape;
  j["ranks"] = N;
  j["seq"] = shape.S;
  j["batch"] = shape.B;
  j["heads"] = shape.H;
  j["kv_heads"] = shape.HKV;
  j["head_dim"] = shape.D;
  j["dtype"] = core::dtype_name(p.dtype);
  j["causal"] = p.mask.causal();
  j["window"] = c.window;
  io::Json docs = io::Json::array();
  for (Index n : c.doc_lens) docs.push_back(n);
  j["doc_lens"] = docs;
  j["layout"] = core::layout_name(p.layout.kind());
  io::Json part = io::Json::array();
  for (Index n : p.layout.sizes()) part.push_back(n);
  j["partition"] = part;
  j["scale"] = p.scale;
  j["seed"] = static_cast<std::int64_t>(c.seed);
  j["inputs"] = c.inputs;
  j["out"] = c.out;
  j["check"] = c.check;
  j["report"] = c.report;
  j["trace"] = c.trace;
  j["backward"] = c.backward;
  j["warmup"] = c.warmup;
  j["iters"] = c.iters;
  j["timeout"] = p.timeout_s;
  const core::Tiling t = core::resolve_tiling(c.tiling, shape.D, p.layout.max_size(), shape.G());
  j["tile_q"] = t.q_rows;
  j["tile_k"] = t.k_cols;
  j["tile_strip"] = t.strip_rows;
  j["simd"] = core::simd::current();
  j["mask"] = p.mask.describe();
  j["traffic"] = c.traffic;
  j["rope"] = c.rope ? io::Json(*c.rope) : io::Json();
  j["strategy"] = strategy_name(p.strategy);
  j["ulysses_degree"] = p.ulysses_degree;
  if (c.timing_only) j["timing_only"] = true;  // simulated, counted flops charged: no values
  if (c.layer) {
    j["layer"] = true;
    j["model_dim"] = p.model_dim;
  }
  return j;
}

}  // namespace ringattn::runtime
