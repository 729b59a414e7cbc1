#pragma once
// The plan: one attention call's options in, one validated plan out. Every entry point (the
// command line's run, run --layer, probe and lab, the C++ API, the Python binding) builds its work
// from make_attention_plan, so each default and each rule between options is written here once.
//
// Errors carry the id of the option at fault (Option). Their text names options by token
// (@seq, @layout, ...), and each entry point renders the tokens in its own words: `--seq` on the
// command line, `shape.S` in C++, `seq_len` in Python (OptionNames).
#include <array>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/core/layout.hpp"
#include "ringattn/core/mask.hpp"
#include "ringattn/core/ring_plan.hpp"
#include "ringattn/core/shape.hpp"
#include "ringattn/runtime/agreement.hpp"
#include "ringattn/runtime/input_plan.hpp"
#include "ringattn/runtime/strategy.hpp"

namespace ringattn::runtime {

// Every option a plan takes. The token of each is its name in this list (@seq, @kv_heads, ...).
enum class Option {
  seq, batch, heads, kv_heads, head_dim, dtype, causal, window, doc_lens, layout, partition, scale, rope,
  strategy, ulysses_degree, timeout, tile_q, tile_k, tile_strip, traffic, kv_head_group, softcap, sinks, cu_seqlens,
  precision,
  merge, capacity,  // the KV cache's (decode)
  count
};
inline constexpr std::size_t kOptions = static_cast<std::size_t>(Option::count);

// How one entry point names the options in its messages.
struct OptionNames {
  std::array<const char*, kOptions> name;
  const char* operator[](Option o) const { return name[static_cast<std::size_t>(o)]; }
  // `text` with every @token of an option replaced by this entry point's name for it.
  std::string render(std::string_view text) const;
};
const OptionNames& cli_names();     // --seq, --kv-heads, --ulysses-degree, ...
const OptionNames& cpp_names();     // shape.S, shape.HKV, ulysses_degree, ... (AttentionOptions' members)
const OptionNames& python_names();  // seq_len, H, ulysses_degree, ... (ringattn.attention's arguments)
// The same for the KV cache, whose shape is its own arguments (batch, heads, kv_heads, head_dim) and
// whose length is the prompt's: `ringattn decode` (--cache-len), KVCacheOptions, ringattn.KVCache.
const OptionNames& cli_cache_names();
const OptionNames& cpp_cache_names();
const OptionNames& python_cache_names();

// An InputError about one option, its message already in the entry point's words.
struct OptionError : InputError {
  OptionError(Option o, const std::string& message) : InputError(message), option(o) {}
  Option option;
};

// The shape where neither the options nor input files give it (the command line's defaults).
inline constexpr Index kDefaultSeq = 1024, kDefaultBatch = 1, kDefaultHeads = 4, kDefaultHeadDim = 64;

// One attention call as given. Names as in the Python package; AttentionOptions in the C++ API.
struct PlanOptions {
  core::Shape shape;                  // the whole problem: B, S, H, HKV, D
  std::string layout = "auto";        // auto | contiguous | striped | zigzag (auto: see resolve_layout)
  std::vector<Index> partition;       // contiguous only: every rank's number of positions (sum S)
  bool causal = false;
  std::optional<Index> window;        // W >= 1: causal sliding window, i - W < j <= i; empty: none
  std::vector<Index> doc_lens;        // packed documents (sum S): attention stays within each
  std::vector<Index> cu_seqlens;      // the same as offsets (flash-attn's): 0, ..., S; instead of doc_lens
  std::optional<double> scale;        // default 1/sqrt(D)
  std::optional<double> rope_theta;   // RoPE (rotate-half) on q and k at their global positions
  std::optional<double> softcap;      // c > 0: each scaled score s becomes c tanh(s / c); empty or 0: none
  std::vector<double> sinks;          // [H] attention-sink logits, one per query head; empty: none
  std::string strategy = "ring";      // ring | ulysses | usp | allgather
  std::optional<int> ulysses_degree;  // usp: ranks per all-to-all group
  std::optional<int> kv_head_group;   // allgather: KV heads gathered at once (divides HKV); empty: by memory
  std::string dtype = "f32";          // storage type of q, k, v, dout: f32 | f64 | bf16 | f16
  std::string precision = "f32";      // f32 | bf16: P and dS rounded to bf16 before their products (bf16 dtype only)
  std::optional<double> timeout_s;    // watchdog on every wait (seconds); 0: none; empty: default_timeout
  core::Tiling tiling;                // kernel tiles (zero q_rows, k_cols: the SIMD target's; see core::Tiling)
  std::string traffic = "aware";      // full | aware | skip-empty (see core::Traffic); the others with ring and usp only
  bool backward = true;               // whether a backward follows (memory and the default watchdog)
};

// What the job around the attention adds to the plan's admission and watchdog (the command line's
// --layer and --check); empty for a plain attention call.
struct PlanExtras {
  std::function<void(MemoryPlan&, Index largest_shard)> memory;  // adds the job's own items
  double flops = 0;                 // the job's own work per iteration, for default_timeout
  std::string culprit;              // the option a memory error names; empty: the largest shape option
  // More candidates for that name: an option of the job as "NAME VALUE", and its value over its
  // usual size (the shape's are S/1024, B, H/4, HKV/4, D/64).
  std::vector<std::pair<std::string, double>> culprits;
  std::string memory_hint = "a smaller shape or more ranks";
  bool admit_memory = true;         // false: a timing-only simulation, which allocates no values
};

// The validated plan. The layout and mask are built; everything is resolved to one value.
struct AttentionPlan {
  core::Shape shape;
  core::DType dtype = core::DType::f32;
  core::Layout layout = core::Layout::contiguous(1, 1);
  core::Mask mask;
  StrategyKind strategy = StrategyKind::ring;
  int ulysses_degree = 1;  // ranks per all-to-all group: ring 1, ulysses N, usp U
  int kv_head_group = 1;   // allgather: KV heads per gathered group
  double scale = 1;
  std::optional<double> rope_theta;
  double softcap = 0;             // 0: none
  core::Precision precision = core::Precision::f32;
  std::vector<double> sinks;      // [H], or empty
  std::vector<Index> doc_lens;    // the documents, from doc_lens or cu_seqlens; empty: none
  core::Tiling tiling;     // as given (zero tiles: the target's, resolved per strategy in setup())
  core::Traffic traffic = core::Traffic::aware;
  double timeout_s = 0;    // the watchdog
  bool backward = true;
};

// The layout `name` means for this mask: auto is zigzag for a causal mask without a window or an
// explicit partition (it balances the causal triangle), contiguous otherwise.
core::LayoutKind resolve_layout(const std::string& name, bool causal, Index window, bool partitioned,
                                const OptionNames& names);

// The layout of S positions over N ranks that `name` (resolve_layout) and `partition` give, checked.
core::Layout make_layout(const std::string& name, Index S, int N, const std::vector<Index>& partition, bool causal,
                         Index window, const OptionNames& names);

// A window, when given, of at least one position; OptionError otherwise.
void check_window(std::optional<Index> window, const OptionNames& names);

// Every size >= 1 and H % HKV == 0; OptionError otherwise.
void check_shape(const core::Shape& s, const OptionNames& names);

// The storage type `name` names (bf16, f16, f32, f64); OptionError otherwise.
core::DType parse_dtype(const std::string& name, const OptionNames& names);

// The strategy `name` names; OptionError otherwise.
StrategyKind parse_strategy(const std::string& name, const OptionNames& names);

// Checks every option and every rule between them, then builds the layout and the mask. Throws
// OptionError in `names`' words. N is the number of ranks. Allocates nothing of size S before the
// memory admission has passed.
AttentionPlan make_attention_plan(const PlanOptions& o, int N, const OptionNames& names, const PlanExtras& extras = {});

// The watchdog when none is given: generous enough that a quiet machine never trips it. 300 s,
// plus ten times the time the busiest rank's share of one iteration (and extra_flops) would take
// at 1 GFLOP/s, a hundredth of one core of today's CPUs.
double default_timeout(const core::Shape& s, Index largest_shard, bool backward, double extra_flops);

// Sink logits for H query heads: one per head, each a number or -inf (no sink for that head), and
// within float32's range for a @dtype other than f64. OptionError(sinks) otherwise.
void check_sinks(std::span<const double> sinks, Index H, core::DType dtype, const OptionNames& names);

// The products' precision `name` names (f32, bf16; core::Precision) for storage type `dtype`: bf16
// only with bf16 storage. OptionError(precision) otherwise.
core::Precision parse_precision(const std::string& name, core::DType dtype, const OptionNames& names);
const char* precision_name(core::Precision p);

// The KV cache's merge of partial states, `name`: allreduce or gather; OptionError(merge) otherwise.
void check_merge(const std::string& name, const OptionNames& names);

// The strategy's setup for this plan; it points into `p`, which must outlive the strategy.
StrategySetup strategy_setup(const AttentionPlan& p);

// The tiles the kernels run with: the plan's, resolved (core::resolve_tiling) for the shape the
// strategy's ring attends. A head-parallel strategy (ulysses, usp) runs its ring over groups of U
// ranks: their positions, with H/U query heads.
core::Tiling kernel_tiling(const AttentionPlan& p);

// What every rank must hold the same, named in `names`' words.
std::vector<PlanField> plan_fields(const AttentionPlan& p, const PlanOptions& o, const OptionNames& names);

// Relative tolerance against the float64 reference: f32 3e-4 (a few hundred ulps of float after
// exp amplifies score rounding by |S|, and sums over S keys), f64 1e-10; bf16 and f16 compute in
// f32 on rounded inputs, so their reference is the one of the rounded inputs and f32's bound holds.
// Precision bf16 rounds P and dS as well (unit roundoff 2^-8, about 4e-3): o's error is at most that
// times max|v| (its natural magnitude), and the gradients sum such rounded terms over many rows, so
// their bound is a few roundoffs: 1e-2.
double check_tolerance(core::DType t, core::Precision p = core::Precision::f32);

}  // namespace ringattn::runtime
