// The plan layer: every option's default and every rule between options, written once.
#include "ringattn/runtime/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <tuple>

#include "ringattn/comm/simulation.hpp"
#include "ringattn/core/cost_model.hpp"
#include "ringattn/core/head_split.hpp"
#include "ringattn/core/storage.hpp"

namespace ringattn::runtime {

using core::DType;
using core::Shape;

namespace {

constexpr std::array<const char*, kOptions> kTokens = {
    "seq",  "batch",    "heads", "kv_heads", "head_dim",       "dtype",   "causal", "window", "doc_lens", "layout",
    "partition", "scale", "rope", "strategy", "ulysses_degree", "timeout", "tile_q", "tile_k", "tile_strip", "traffic",
    "kv_head_group", "softcap", "sinks", "cu_seqlens", "precision", "merge", "capacity"};

std::string join(std::span<const Index> v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

// Throws OptionError(o) with `text` (tokens rendered in `names`' words).
[[noreturn]] void fail(const OptionNames& names, Option o, const std::string& text) {
  throw OptionError(o, names.render(text));
}


// "sum to X", or "sum past 2^63 - 1" where the sum of sizes >= 0 overflows (it must then not wrap
// around to a sum that looks right).
std::string sum_text(const std::vector<Index>& sizes, Index& sum) {
  sum = 0;
  for (Index x : sizes)
    if (__builtin_add_overflow(sum, x, &sum)) {
      sum = -1;
      return fmt::format("sum past {}", std::numeric_limits<Index>::max());
    }
  return fmt::format("sum to {}", sum);
}

void check_partition(const std::vector<Index>& partition, core::LayoutKind kind, int N, Index S,
                     const OptionNames& n) {
  if (partition.empty()) return;
  if (kind != core::LayoutKind::contiguous)
    fail(n, Option::partition, fmt::format("@partition: only applies to the contiguous layout, not {}",
                                           core::layout_name(kind)));
  if (static_cast<int>(partition.size()) != N)
    fail(n, Option::partition, fmt::format("@partition: has {} sizes for {} ranks (expected one per rank)",
                                           partition.size(), N));
  for (Index x : partition)
    if (x < 0) fail(n, Option::partition, fmt::format("@partition: size {} is negative (expected sizes >= 0)", x));
  Index sum = 0;
  const std::string sums = sum_text(partition, sum);
  if (sum != S)
    fail(n, Option::partition, fmt::format("@partition: sizes {} but S is {} (expected sum == S)", sums, S));
}

// The documents' lengths that doc_lens or cu_seqlens (offsets 0 = c0 <= c1 <= ... <= cn = S) give.
std::vector<Index> checked_documents(const PlanOptions& o, const OptionNames& n) {
  if (o.cu_seqlens.empty()) return o.doc_lens;
  if (!o.doc_lens.empty())
    fail(n, Option::cu_seqlens, "@cu_seqlens: given with @doc_lens (expected one of the two)");
  const auto& c = o.cu_seqlens;
  if (c.front() != 0)
    fail(n, Option::cu_seqlens, fmt::format("@cu_seqlens: starts at {} (expected offsets 0, ..., S)", c.front()));
  std::vector<Index> lens;
  for (std::size_t i = 1; i < c.size(); ++i) {
    if (c[i] < c[i - 1])
      fail(n, Option::cu_seqlens, fmt::format("@cu_seqlens: offset {} follows {} (expected nondecreasing offsets)",
                                              c[i], c[i - 1]));
    lens.push_back(c[i] - c[i - 1]);
  }
  if (c.back() != o.shape.S)
    fail(n, Option::cu_seqlens, fmt::format("@cu_seqlens: ends at {} but S is {} (expected the last offset == S)",
                                            c.back(), o.shape.S));
  return lens;
}

void check_mask(const PlanOptions& o, const OptionNames& n) {
  check_window(o.window, n);
  if (o.doc_lens.empty()) return;
  for (Index x : o.doc_lens)
    if (x < 0) fail(n, Option::doc_lens, fmt::format("@doc_lens: length {} is negative (expected lengths >= 0)", x));
  Index sum = 0;
  const std::string sums = sum_text(o.doc_lens, sum);
  if (sum != o.shape.S)
    fail(n, Option::doc_lens, fmt::format("@doc_lens: lengths {} but S is {} (expected sum == S)", sums, o.shape.S));
}

// Whether x log2 e is finite in the arithmetic of `dtype` (float32 unless the storage is f64), as
// the kernels compute it: they work in base 2, with the scale, a cap and a sink times log2 e.
bool finite_in_log2(double x, DType dtype) {
  const double y = x * core::kLog2e;
  return dtype == DType::f64 ? std::isfinite(y) : std::isfinite(static_cast<float>(y));
}

// The bound finite_in_log2 sets, rounded down to five digits for a message (every value up to the
// printed one is accepted).
double most_in_log2(DType dtype) {
  const double most = (dtype == DType::f64 ? std::numeric_limits<double>::max()
                                           : double(std::numeric_limits<float>::max())) / core::kLog2e;
  const double unit = std::pow(10.0, std::floor(std::log10(most)) - 4);
  return std::floor(most / unit) * unit;
}

const char* arithmetic(DType dtype) { return dtype == DType::f64 ? "float64" : "float32"; }

double checked_scale(const PlanOptions& o, DType dtype, const OptionNames& n) {
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(o.shape.D));
  if (!std::isfinite(scale)) fail(n, Option::scale, fmt::format("@scale: {} is not a finite number (expected a finite scale)", scale));
  // The scores are computed in the accumulation type, in base 2: scale log2 e must be finite there.
  if (!finite_in_log2(scale, dtype))
    fail(n, Option::scale,
         fmt::format("@scale: {:g} overflows {}'s {} arithmetic in base 2 (expected |scale| <= {:g})", scale,
                     core::dtype_name(dtype), arithmetic(dtype), most_in_log2(dtype)));
  return scale;
}

void check_rope(const PlanOptions& o, DType dtype, const OptionNames& n) {
  if (!o.rope_theta) return;
  if (!(std::isfinite(*o.rope_theta) && *o.rope_theta > 0))
    fail(n, Option::rope, fmt::format("@rope: theta {} is not a positive finite base (expected e.g. 10000)",
                                      *o.rope_theta));
  if (o.shape.D % 2 != 0)
    fail(n, Option::rope, fmt::format("@rope: head dim D = {} is odd (rotate-half RoPE pairs i with i + D/2; "
                                      "expected D even)", o.shape.D));
  // 16-bit storage would round the rotated q and k to 16 bits a second time, an error of one
  // 16-bit ulp on every score that the rounded-input reference does not have.
  if (dtype == DType::bf16 || dtype == DType::f16)
    fail(n, Option::rope, fmt::format("@rope: not supported with @dtype {} (the rotated q and k would be rounded to "
                                      "{} again; expected @dtype f32 or f64 with @rope, or q and k rotated before "
                                      "the call)", core::dtype_name(dtype), core::dtype_name(dtype)));
}

// 0 (none) as flash-attn's softcap=0.0; otherwise a positive finite cap in the scores' type.
double checked_softcap(const PlanOptions& o, DType dtype, const OptionNames& n) {
  if (!o.softcap) return 0;
  const double c = *o.softcap;
  if (!(std::isfinite(c) && c >= 0))
    fail(n, Option::softcap, fmt::format("@softcap: {} is not a cap (expected c > 0, or 0 for none)", c));
  if (!finite_in_log2(c, dtype))
    fail(n, Option::softcap, fmt::format("@softcap: {:g} overflows {}'s {} arithmetic in base 2 (expected c <= {:g})",
                                         c, core::dtype_name(dtype), arithmetic(dtype), most_in_log2(dtype)));
  // The kernels scale by c and by 1 / c: a cap that their arithmetic rounds to 0 (or whose inverse
  // overflows) would cap nothing, silently.
  const double least = dtype == DType::f64 ? 1e-300 : 1e-30;
  if (c > 0 && c < least)
    fail(n, Option::softcap, fmt::format("@softcap: {:g} is below the least cap {}'s arithmetic takes (expected c >= "
                                         "{:g}, or 0 for none)", c, core::dtype_name(dtype), least));
  return c;
}

// The strategy's rules: ulysses splits H over N; usp splits H and N over U.
int checked_ulysses_degree(StrategyKind k, std::optional<int> given, Index H, int N, const OptionNames& n) {
  if (given && *given < 1) fail(n, Option::ulysses_degree, fmt::format("@ulysses_degree: {} is not >= 1 (expected a group size U >= 1)", *given));
  if (given && k != StrategyKind::usp)
    fail(n, Option::ulysses_degree,
         fmt::format("@ulysses_degree: only applies with @strategy usp (@strategy {} uses U = {})", strategy_name(k),
                     ulysses_degree(k, *given, N)));
  const std::string why = strategy_rule_violation(k, given.value_or(0), H, N);
  if (!why.empty()) fail(n, why.rfind("@strategy", 0) == 0 ? Option::strategy : Option::ulysses_degree, why);
  return ulysses_degree(k, given.value_or(0), N);
}

// All-gather: G KV heads gathered at once, G dividing HKV; core::default_kv_head_group by default.
int checked_kv_head_group(StrategyKind k, std::optional<int> given, const Shape& s, DType dtype,
                          const OptionNames& n) {
  if (given && k != StrategyKind::allgather)
    fail(n, Option::kv_head_group, fmt::format("@kv_head_group: only applies with @strategy allgather (@strategy {} "
                                               "moves K/V otherwise)", strategy_name(k)));
  if (k != StrategyKind::allgather) return 1;
  if (given) {
    if (*given < 1 || s.HKV % *given != 0)
      fail(n, Option::kv_head_group, fmt::format("@kv_head_group: G={} does not divide HKV={} key/value heads "
                                                 "(expected a divisor of HKV)", *given, s.HKV));
    return *given;
  }
  return static_cast<int>(core::default_kv_head_group(s.B, s.S, s.HKV, s.D, double(core::dtype_size(dtype))));
}

// The ring's traffic plan. ulysses (rings of one rank) and allgather (every block to every rank)
// have no ring traffic to plan, so a plan other than the default is refused there, not ignored.
core::Traffic checked_traffic(StrategyKind k, const std::string& name, const OptionNames& n) {
  core::Traffic t = core::Traffic::aware;
  if (name == "full") t = core::Traffic::full;
  else if (name == "skip-empty") t = core::Traffic::skip_empty_grads;
  else if (name != "aware")
    fail(n, Option::traffic, fmt::format("@traffic: unknown plan '{}' (expected full, aware or skip-empty)", name));
  if (t != core::Traffic::aware && !has_ring_traffic(k))
    fail(n, Option::traffic, fmt::format("@traffic: only applies with @strategy ring or usp (@strategy {} {})",
                                         strategy_name(k), k == StrategyKind::allgather ? "gathers every K/V block"
                                                                                        : "moves heads, not K/V blocks"));
  return t;
}

void check_tiles(const core::Tiling& t, const OptionNames& n) {
  for (const auto& [o, v] : {std::pair{Option::tile_q, t.q_rows}, std::pair{Option::tile_k, t.k_cols},
                             std::pair{Option::tile_strip, t.strip_rows}})
    if (v < 0 || v > 65536)
      fail(n, o, fmt::format("@{}: {} is outside 0..65536 (a tile size; 0: {})", kTokens[size_t(o)], v,
                             o == Option::tile_strip ? "no strips" : "the SIMD target's default"));
}

Index largest_shard(core::LayoutKind kind, Index S, int N, const std::vector<Index>& partition) {
  if (!partition.empty()) return *std::max_element(partition.begin(), partition.end());
  auto ceil_div = [](Index a, Index b) { return a / b + (a % b != 0); };  // (a + b - 1) / b overflows near 2^63
  if (kind == core::LayoutKind::zigzag) {  // two chunks of ceil(S / 2N), never more than S
    const Index c = ceil_div(S, 2 * Index(N));
    return c > S / 2 ? S : 2 * c;
  }
  return ceil_div(S, N);
}

// Everything one attention allocates on its most loaded rank (L positions), before anything is
// allocated. Computed in double: an absurd shape must be refused, not overflow.
void attention_memory(MemoryPlan& m, const AttentionPlan& p, const core::Tiling& given, int N, Index Lmax) {
  const Shape& s = p.shape;
  const double es = double(core::dtype_size(p.dtype)), ea = double(core::dtype_size(core::accum_dtype(p.dtype)));
  const double B = double(s.B), H = double(s.H), HKV = double(s.HKV), D = double(s.D), S = double(s.S);
  const double L = double(Lmax);
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
  if (p.backward) ring += es * q + ea * (rows + q + block) + (R > 1 ? ea * 3 * block : 0.0);
  const core::Tiling t = core::resolve_tiling(given, s.D, std::min<Index>(Lmax * U, Index(1) << 40), hs.Gu);
  const double scratch =
      double(p.dtype == DType::f64 ? core::Workspace<double>::bytes(t, s.D)
                                    : core::Workspace<float>::bytes(t, s.D, p.precision));
  if (p.strategy == StrategyKind::allgather) m.add("tile scratch", scratch);
  else m.add("ring buffers and tile scratch", ring + scratch);
  if (p.strategy == StrategyKind::allgather) {  // two gathered groups; the backward's contributions
    const double G = double(p.kv_head_group), groups = HKV / G;
    m.add("all-gather buffers", es * (2 * 2 * B * G * S * D + 2 * B * G * L * D) +
                                    (p.backward ? ea * (2 * B * G * S * D + double(N) * 2 * B * G * L * D) : 0.0));
    m.add("per-group query rows and state", groups * (es * B * L * (H / groups) * D * (p.backward ? 2 : 1) +
                                                       ea * B * L * (H / groups) * (D * (p.backward ? 2 : 1) + 4)));
  } else if (p.strategy != StrategyKind::ring) {  // send, receive and group tensors; their outputs
    const double qkv = B * Lr * (Hr + 2 * HKVr) * D, ret = B * Lr * std::max(Hr + 2 * HKVr, Hr + Hr / D) * D;
    double a2a = es * 3 * qkv + ea * (2 * ret + B * Lr * Hr * (D + 1)) + ea * B * L * H * (D + 1);
    if (p.backward) a2a += es * 3 * B * Lr * Hr * D + ea * (qkv + B * L * (H + 2 * HKV) * D);
    m.add("all-to-all buffers", a2a);
  }
  m.add("outputs", ea * B * L * (2 * H * D + H + 2 * HKV * D));
  if (p.rope_theta) m.add("rotated q and k", es * B * L * (H + HKV) * D);
}

// The option a memory error names: the one furthest above its usual size.
std::string memory_culprit(const Shape& s, const OptionNames& n, const PlanExtras& extras) {
  const std::pair<Option, double> ratio[] = {
      {Option::seq, double(s.S) / kDefaultSeq},     {Option::batch, double(s.B) / kDefaultBatch},
      {Option::heads, double(s.H) / kDefaultHeads}, {Option::kv_heads, double(s.HKV) / kDefaultHeads},
      {Option::head_dim, double(s.D) / kDefaultHeadDim}};
  const auto worst = std::max_element(std::begin(ratio), std::end(ratio),
                                      [](const auto& a, const auto& b) { return a.second < b.second; });
  const Index value[] = {s.S, s.B, s.H, s.HKV, s.D};
  std::string name = fmt::format("{} {}", n[worst->first], value[worst - std::begin(ratio)]);
  double most = worst->second;
  for (const auto& [other, r] : extras.culprits)
    if (r > most) std::tie(name, most) = std::pair{other, r};
  return name;
}

}  // namespace

std::string OptionNames::render(std::string_view text) const {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    if (text[i] == '@') {
      std::size_t j = i + 1;
      while (j < text.size() && (std::islower(static_cast<unsigned char>(text[j])) || text[j] == '_')) ++j;
      const std::string_view token = text.substr(i + 1, j - i - 1);
      const auto at = std::find(kTokens.begin(), kTokens.end(), token);
      if (at != kTokens.end()) {
        out += name[at - kTokens.begin()];
        i = j;
        continue;
      }
    }
    out += text[i++];
  }
  return out;
}

const OptionNames& cli_names() {
  // The command line has no cu_seqlens (--doc-lens says the same) and no capacity (decode sizes its cache
  // from --cache-len, --steps and --new-tokens).
  static const OptionNames n{{"--seq", "--batch", "--heads", "--kv-heads", "--head-dim", "--dtype", "--causal",
                              "--window", "--doc-lens", "--layout", "--partition", "--scale", "--rope", "--strategy",
                              "--ulysses-degree", "--timeout", "--tile-q", "--tile-k", "--tile-strip", "--traffic",
                              "--kv-head-group", "--softcap", "--sinks", "cu_seqlens", "--precision", "--merge",
                              "capacity"}};
  return n;
}

const OptionNames& cpp_names() {
  static const OptionNames n{{"shape.S", "shape.B", "shape.H", "shape.HKV", "shape.D", "dtype", "causal", "window",
                              "doc_lens", "layout", "partition", "scale", "rope_theta", "strategy", "ulysses_degree",
                              "timeout_s", "tiling.q_rows", "tiling.k_cols", "tiling.strip_rows", "traffic",
                              "kv_head_group", "softcap", "sinks", "cu_seqlens", "precision", "merge", "capacity"}};
  return n;
}

const OptionNames& python_names() {
  // B, H, HKV and D come from the shapes of q and k.
  static const OptionNames n{{"seq_len", "q's B", "q's H", "k's HKV", "q's D", "dtype", "causal", "window",
                              "doc_lens", "layout", "partition", "scale", "rope", "strategy", "ulysses_degree",
                              "timeout", "tile_q", "tile_k", "tile_strip", "traffic", "kv_head_group", "softcap",
                              "sinks", "cu_seqlens", "precision", "merge", "capacity"}};
  return n;
}

namespace {
OptionNames with_cache_shape(OptionNames n, std::array<const char*, 5> shape) {
  for (std::size_t i = 0; i < shape.size(); ++i) n.name[i] = shape[i];  // seq, batch, heads, kv_heads, head_dim
  return n;
}
}  // namespace

const OptionNames& cli_cache_names() {
  static const OptionNames n =
      with_cache_shape(cli_names(), {"--cache-len", "--batch", "--heads", "--kv-heads", "--head-dim"});
  return n;
}

const OptionNames& cpp_cache_names() {
  static const OptionNames n = with_cache_shape(cpp_names(), {"prompt_len", "batch", "heads", "kv_heads", "head_dim"});
  return n;
}

const OptionNames& python_cache_names() {
  static const OptionNames n =
      with_cache_shape(python_names(), {"prompt_len", "batch", "heads", "kv_heads", "head_dim"});
  return n;
}

const char* precision_name(core::Precision p) { return p == core::Precision::bf16 ? "bf16" : "f32"; }

core::Precision parse_precision(const std::string& name, DType dtype, const OptionNames& n) {
  if (name == "f32") return core::Precision::f32;
  if (name != "bf16")
    fail(n, Option::precision, fmt::format("@precision: unknown precision '{}' (expected f32 or bf16)", name));
  // Rounding P and dS to bf16 pays only where the other operand is bf16 already: then every product
  // runs on bf16 dot products. With wider storage it would only lose accuracy.
  if (dtype != DType::bf16)
    fail(n, Option::precision, fmt::format("@precision bf16 needs @dtype bf16 (it rounds P and dS to bf16 to "
                                           "multiply them with bf16 K, V, Q and dO; @dtype is {})",
                                           core::dtype_name(dtype)));
  return core::Precision::bf16;
}

void check_merge(const std::string& name, const OptionNames& n) {
  if (name != "allreduce" && name != "gather")
    fail(n, Option::merge, fmt::format("@merge: '{}' is not a merge (expected allreduce or gather)", name));
}

void check_sinks(std::span<const double> sinks, Index H, DType dtype, const OptionNames& n) {
  if (static_cast<Index>(sinks.size()) != H)
    fail(n, Option::sinks, fmt::format("@sinks: {} values for H = {} query heads (expected one sink logit per query "
                                       "head)", sinks.size(), H));
  for (std::size_t h = 0; h < sinks.size(); ++h) {
    const double x = sinks[h];
    if (std::isnan(x) || x == std::numeric_limits<double>::infinity())
      fail(n, Option::sinks, fmt::format("@sinks: {} for head {} is not a logit (expected a finite number, or -inf "
                                         "for no sink)", x, h));
    // the kernels merge a sink in log2 units (x log2 e)
    if (std::isfinite(x) && !finite_in_log2(x, dtype))
      fail(n, Option::sinks, fmt::format("@sinks: {:g} for head {} overflows {}'s {} arithmetic in base 2 (expected "
                                         "|sink| <= {:g})", x, h, core::dtype_name(dtype), arithmetic(dtype),
                                         most_in_log2(dtype)));
  }
}

DType parse_dtype(const std::string& name, const OptionNames& n) {
  if (const auto t = core::dtype_from_name(name)) return *t;
  fail(n, Option::dtype, fmt::format("@dtype: unknown dtype '{}' (expected bf16, f16, f32 or f64)", name));
}

void check_shape(const Shape& s, const OptionNames& n) {
  const std::pair<Option, Index> sizes[] = {{Option::batch, s.B}, {Option::seq, s.S}, {Option::heads, s.H},
                                            {Option::kv_heads, s.HKV}, {Option::head_dim, s.D}};
  for (const auto& [o, v] : sizes)
    if (v < 1) fail(n, o, fmt::format("@{}: {} is not a positive size (expected >= 1)", kTokens[size_t(o)], v));
  if (s.H % s.HKV != 0)
    fail(n, Option::kv_heads, fmt::format("@kv_heads: H={} is not a multiple of HKV={} (expected H % HKV == 0)",
                                          s.H, s.HKV));
}

StrategyKind parse_strategy(const std::string& name, const OptionNames& n) {
  for (StrategyKind k : {StrategyKind::ring, StrategyKind::ulysses, StrategyKind::usp, StrategyKind::allgather})
    if (name == strategy_name(k)) return k;
  fail(n, Option::strategy,
       fmt::format("@strategy: unknown strategy '{}' (expected ring, ulysses, usp or allgather)", name));
}

double check_tolerance(DType t, core::Precision p) {
  if (p == core::Precision::bf16) return 1e-2;
  return t == DType::f64 ? 1e-10 : 3e-4;
}

void check_window(std::optional<Index> window, const OptionNames& n) {
  if (window && *window < 1)
    fail(n, Option::window, fmt::format("@window: {} is not a window (expected W >= 1, or none)", *window));
}

core::LayoutKind resolve_layout(const std::string& name, bool causal, Index window, bool partitioned,
                                const OptionNames& n) {
  if (name == "auto")
    return causal && window == 0 && !partitioned ? core::LayoutKind::zigzag : core::LayoutKind::contiguous;
  if (const auto k = core::layout_from_name(name)) return *k;
  fail(n, Option::layout,
       fmt::format("@layout: unknown layout '{}' (expected auto, contiguous, striped or zigzag)", name));
}

core::Layout make_layout(const std::string& name, Index S, int N, const std::vector<Index>& partition, bool causal,
                         Index window, const OptionNames& n) {
  if (S < 1) fail(n, Option::seq, fmt::format("@seq: {} is not a positive size (expected >= 1)", S));
  const core::LayoutKind kind = resolve_layout(name, causal, window, !partition.empty(), n);
  check_partition(partition, kind, N, S, n);
  return core::Layout::make(kind, S, N, partition);
}

double default_timeout(const Shape& s, Index largest_shard, bool backward, double extra_flops) {
  const double L = double(largest_shard), S = double(s.S), HD = double(s.H) * double(s.D);
  const double flops = 4.0 * double(s.B) * L * S * HD * (backward ? 3.5 : 1.0) + extra_flops;
  return 300.0 + 10.0 * flops / 1e9;
}

AttentionPlan make_attention_plan(const PlanOptions& o, int N, const OptionNames& n, const PlanExtras& extras) {
  AttentionPlan p;
  check_shape(o.shape, n);
  p.shape = o.shape;
  p.dtype = parse_dtype(o.dtype, n);
  p.backward = o.backward;
  check_rope(o, p.dtype, n);
  p.rope_theta = o.rope_theta;
  check_mask(o, n);
  p.doc_lens = checked_documents(o, n);
  p.softcap = checked_softcap(o, p.dtype, n);
  p.precision = parse_precision(o.precision, p.dtype, n);
  if (!o.sinks.empty()) check_sinks(o.sinks, o.shape.H, p.dtype, n);
  p.sinks = o.sinks;
  const core::LayoutKind kind = resolve_layout(o.layout, o.causal, o.window.value_or(0), !o.partition.empty(), n);
  check_partition(o.partition, kind, N, o.shape.S, n);
  p.strategy = parse_strategy(o.strategy, n);
  p.ulysses_degree = checked_ulysses_degree(p.strategy, o.ulysses_degree, o.shape.H, N, n);
  p.kv_head_group = checked_kv_head_group(p.strategy, o.kv_head_group, o.shape, p.dtype, n);
  p.scale = checked_scale(o, p.dtype, n);
  p.traffic = checked_traffic(p.strategy, o.traffic, n);
  check_tiles(o.tiling, n);
  p.tiling = o.tiling;
  if (o.timeout_s && !(std::isfinite(*o.timeout_s) && *o.timeout_s >= 0))
    fail(n, Option::timeout, fmt::format("@timeout: {} is not a time (expected seconds >= 0; 0 disables the "
                                         "watchdog)", *o.timeout_s));
  // Before anything of size S is built.
  const Index Lmax = largest_shard(kind, o.shape.S, N, o.partition);
  if (extras.admit_memory) {
    MemoryPlan m;
    attention_memory(m, p, o.tiling, N, Lmax);
    if (extras.memory) extras.memory(m, Lmax);
    admit_memory(m, extras.culprit.empty() ? memory_culprit(o.shape, n, extras) : extras.culprit,
                 fmt::format("{} ({})", p.shape.str(), core::dtype_name(p.dtype)), extras.memory_hint);
  }
  p.layout = core::Layout::make(kind, o.shape.S, N, o.partition);
  p.mask = core::Mask::make(o.shape.S, o.causal, o.window.value_or(0), p.doc_lens);
  p.timeout_s = o.timeout_s ? *o.timeout_s : default_timeout(p.shape, Lmax, o.backward, extras.flops);
  if (comm::simulated()) p.timeout_s = 0;  // simulated time: no watchdog (see comm::Comm::set_timeout)
  return p;
}

core::Tiling kernel_tiling(const AttentionPlan& p) {
  const int U = p.ulysses_degree;
  if (U <= 1) return core::resolve_tiling(p.tiling, p.shape.D, p.layout.max_size(), p.shape.G());
  return core::resolve_tiling(p.tiling, p.shape.D, core::Layout::grouped(p.layout, U).max_size(),
                              core::split_heads(p.shape, U).Gu);
}

StrategySetup strategy_setup(const AttentionPlan& p) {
  StrategySetup s;
  s.shape = p.shape;
  s.layout = &p.layout;
  s.mask = &p.mask;
  s.scale = p.scale;
  s.tiling = kernel_tiling(p);
  s.traffic = p.traffic;
  s.sinks = p.sinks.empty() ? nullptr : p.sinks.data();
  s.softcap = p.softcap;
  s.precision = p.precision;
  s.kind = p.strategy;
  s.ulysses_degree = p.ulysses_degree;
  s.kv_head_group = p.kv_head_group;
  return s;
}

namespace {
std::string sink_text(const std::vector<double>& sinks) {
  if (sinks.empty()) return "off";
  std::string t;
  for (std::size_t h = 0; h < sinks.size(); ++h) t += fmt::format("{}{:.17g}", h ? "," : "", sinks[h]);
  return t;
}
}  // namespace

std::vector<PlanField> plan_fields(const AttentionPlan& p, const PlanOptions& o, const OptionNames& n) {
  auto num = [](double v) { return fmt::format("{:.17g}", v); };
  auto named = [&](Option opt, const char* what) { return fmt::format("{} ({})", what, n[opt]); };
  const Shape& s = p.shape;
  return {{named(Option::seq, "S"), std::to_string(s.S)},
          {named(Option::batch, "B"), std::to_string(s.B)},
          {named(Option::heads, "H"), std::to_string(s.H)},
          {named(Option::kv_heads, "HKV"), std::to_string(s.HKV)},
          {named(Option::head_dim, "D"), std::to_string(s.D)},
          {named(Option::dtype, "the dtype"), core::dtype_name(p.dtype)},
          {n[Option::causal], o.causal ? "on" : "off"},
          {n[Option::window], std::to_string(o.window.value_or(0))},
          {n[Option::doc_lens], join(p.doc_lens)},
          {n[Option::softcap], p.softcap > 0 ? num(p.softcap) : "off"},
          {n[Option::sinks], sink_text(p.sinks)},
          {n[Option::precision], precision_name(p.precision)},
          {named(Option::layout, "the layout"), core::layout_name(p.layout.kind())},
          {named(Option::partition, "the shard sizes"), join(p.layout.sizes())},
          {n[Option::scale], num(p.scale)},
          {n[Option::strategy], strategy_name(p.strategy)},
          {named(Option::ulysses_degree, "the Ulysses degree"), std::to_string(p.ulysses_degree)},
          {named(Option::kv_head_group, "the KV-head group"), std::to_string(p.kv_head_group)},
          {n[Option::traffic], o.traffic},
          {n[Option::rope], p.rope_theta ? num(*p.rope_theta) : "off"},
          {"the backward", p.backward ? "on" : "off"},
          {n[Option::tile_q], std::to_string(o.tiling.q_rows)},
          {n[Option::tile_k], std::to_string(o.tiling.k_cols)},
          {n[Option::tile_strip], std::to_string(o.tiling.strip_rows)},
          {n[Option::timeout], num(p.timeout_s)}};
}

}  // namespace ringattn::runtime
