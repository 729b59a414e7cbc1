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
#include "ringattn/io/npy.hpp"
#include "ringattn/runtime/paths.hpp"
#include "ringattn/runtime/ring_attention.hpp"

namespace ringattn::runtime {

using core::DType;
using core::Shape;

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
  if (c.iters < 1) throw InputError(fmt::format("--iters: {} is not >= 1 (expected a number of timed iterations >= 1)", c.iters));
  if (c.warmup < 0) throw InputError(fmt::format("--warmup: {} is negative (expected a number of untimed iterations >= 0)", c.warmup));
  // The layer's reference and outputs have no soft-capping and no sink gradient; its projections
  // are f32 or f64, where bf16 products do not apply.
  for (const auto& [option, given] : {std::pair{"--softcap", c.softcap.value_or(0) != 0},
                                      std::pair{"--sinks", !c.sinks_file.empty()},
                                      std::pair{"--precision", c.precision == "bf16"}})
    if (given && c.layer)
      throw InputError(fmt::format("{}: not with --layer (expected it in attention mode, without --layer)", option));
  if (c.timing_only) {
    if (!comm::simulated())
      throw InputError("--timing-only: only the SimGrid/SMPI simulation build charges counted flops (scripts/simulate.sh)");
    for (const auto& [option, given] : {std::pair{"--check", c.check}, std::pair{"--out", !c.out.empty()},
                                        std::pair{"--inputs", !c.inputs.empty()}, std::pair{"--layer", c.layer},
                                        std::pair{"--rope", c.rope_theta.has_value()}})
      if (given)
        throw InputError(fmt::format("{}: not with --timing-only (a timing-only run computes no values, so there is "
                                     "nothing to read, rotate, write or check)", option));
  }
}

namespace {

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

// The layer's and the check's own memory, on the most loaded rank (L positions) and on rank 0.
void job_memory(const JobConfig& c, const JobPlan& p, MemoryPlan& m, Index Lmax) {
  const Shape& s = p.shape;
  const double ea = double(core::dtype_size(core::accum_dtype(p.dtype)));
  const double B = double(s.B), H = double(s.H), HKV = double(s.HKV), D = double(s.D), S = double(s.S);
  const double L = double(Lmax), M = double(p.model_dim);
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
    p.dtype = parse_dtype(c.dtype, cli_names());
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
    if (c.dtype_given) {
      const DType files = p.dtype;
      p.dtype = parse_dtype(c.dtype, cli_names());
      p.inputs.rounded = p.dtype != files && core::dtype_size(p.dtype) <= core::dtype_size(files);
    }
  }
  if (c.layer && p.model_dim < 1) throw InputError(fmt::format("--model-dim: {} is not >= 1", p.model_dim));
  const bool half = p.dtype == DType::bf16 || p.dtype == DType::f16;
  if (half && c.layer)
    throw InputError(fmt::format("--layer: not supported with --dtype {} (the projections' Q, K and V would be rounded "
                                 "to {} between the GEMMs and the attention, which no reference here models; "
                                 "expected --dtype f32 or f64 with --layer)", core::dtype_name(p.dtype),
                                 core::dtype_name(p.dtype)));

  // The attention's own rules, in the command line's words.
  PlanOptions o = c;
  o.shape = p.shape;
  o.dtype = core::dtype_name(p.dtype);
  if (!c.sinks_file.empty()) {  // [H] logits, read whole on every rank (the plan's fields compare them)
    const io::NpyHeader h = io::read_npy_header(c.sinks_file);
    if (h.shape.size() != 1)  // its length the plan checks
      throw OptionError(Option::sinks, fmt::format("--sinks {}: shape {} (expected [H] = [{}], one logit per query "
                                                   "head)", c.sinks_file, shape_str(h.shape), p.shape.H));
    o.sinks = io::read_npy<double>(c.sinks_file, h);
    if (o.sinks.empty()) check_sinks(o.sinks, p.shape.H, p.dtype, cli_names());  // [0]: refused, not "no sinks"
  }
  PlanExtras extras;
  extras.memory = [&](MemoryPlan& m, Index Lmax) { job_memory(c, p, m, Lmax); };
  if (c.layer) {
    const Shape& s = p.shape;
    extras.flops = 2.0 * double(s.B) * double(s.S) / N * double(p.model_dim) * double(s.H * s.D) * 8;
  }
  if (c.check) extras.flops += 4.0 * double(p.shape.B) * double(p.shape.S) * double(p.shape.S) *
                               double(p.shape.H * p.shape.D) * 3.5;
  if (!c.inputs.empty()) extras.culprit = path_in(c.inputs, c.layer ? "x.npy" : "q.npy");
  if (c.layer) extras.culprits.push_back({fmt::format("--model-dim {}", p.model_dim), double(p.model_dim) / 64});
  if (c.check) extras.memory_hint = "a smaller shape, more ranks, or no --check";
  extras.admit_memory = !c.timing_only;  // a timing-only run folds its large buffers onto shared pages
  static_cast<AttentionPlan&>(p) = make_attention_plan(o, N, cli_names(), extras);
  if (c.layer) layer_specs(p);
  else attention_specs(p);
  return p;
}

StrategySetup strategy_setup(const JobConfig& c, const JobPlan& p) {
  StrategySetup s = strategy_setup(static_cast<const AttentionPlan&>(p));
  s.hooks = c.hooks;
  s.timing_only = c.timing_only;
  s.on_step = c.progress.step;
  return s;
}

std::vector<PlanField> plan_fields(const JobConfig& c, const JobPlan& p) {
  std::vector<PlanField> f = runtime::plan_fields(p, c, cli_names());
  const std::vector<PlanField> job = {
      {"--layer", c.layer ? "on" : "off"},
      {"M (--model-dim or the input files)", std::to_string(p.model_dim)},
      {"--check", c.check ? "on" : "off"},
      {"--warmup", std::to_string(c.warmup)},
      {"--iters", std::to_string(c.iters)},
      {"--seed", std::to_string(c.seed)},
      {"--inputs", c.inputs},
      {"--out", c.out},
      {"--report", c.report},
      {"--trace", c.trace},
#ifdef RINGATTN_SMPI
      {"--timing-only", c.timing_only ? "on" : "off"},
#endif
      {"the test hooks", fmt::format("{} {} {} {} {}", c.hooks.drop_grad_step, c.hooks.stall_rank, c.hooks.stall_s,
                                     c.average_weight_grads, c.rope_local_positions)}};
  f.insert(f.end(), job.begin(), job.end());
  for (std::size_t t = 0; t < p.inputs.specs.size(); ++t)
    if (p.inputs.from_files())
      f.push_back({p.inputs.specs[t].name + ".npy's header",
                   p.inputs.headers[t] ? io::describe(p.inputs.headers[t]->dtype, p.inputs.headers[t]->shape)
                                       : "(absent)"});
  // The watchdog's default is derived from everything above (the shape, --check's flops), so it is
  // compared last: ranks that differ only on --check are told --check, not --timeout.
  const std::string timeout = cli_names()[Option::timeout];
  const auto at = std::find_if(f.begin(), f.end(), [&](const PlanField& x) { return x.name == timeout; });
  if (at != f.end()) std::rotate(at, at + 1, f.end());
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
  j["window"] = c.window.value_or(0);
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
  const core::Tiling t = kernel_tiling(p);
  j["tile_q"] = t.q_rows;
  j["tile_k"] = t.k_cols;
  j["tile_strip"] = t.strip_rows;
  j["simd"] = core::simd::kernels(p.dtype);
  j["mask"] = p.mask.describe();
  j["traffic"] = has_ring_traffic(p.strategy) ? io::Json(c.traffic) : io::Json();  // no ring to plan
  j["rope"] = c.rope_theta ? io::Json(*c.rope_theta) : io::Json();
  j["softcap"] = p.softcap > 0 ? io::Json(p.softcap) : io::Json();
  j["precision"] = precision_name(p.precision);
  j["sinks"] = c.sinks_file.empty() ? io::Json() : io::Json(c.sinks_file);
  j["strategy"] = strategy_name(p.strategy);
  j["ulysses_degree"] = p.ulysses_degree;
  // allgather's G, given or chosen; no other strategy gathers K/V heads in groups
  j["kv_head_group"] = p.strategy == StrategyKind::allgather ? io::Json(p.kv_head_group) : io::Json();
  if (c.timing_only) j["timing_only"] = true;  // simulated, counted flops charged: no values
  if (c.layer) {
    j["layer"] = true;
    j["model_dim"] = p.model_dim;
  }
  return j;
}

}  // namespace ringattn::runtime
