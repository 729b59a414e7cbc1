// The plan layer (runtime/plan.hpp) without MPI: every rule between options, its option id, and
// its message in each front end's words.
#include "ringattn/runtime/plan.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

using namespace ringattn;
using namespace ringattn::runtime;

namespace {

PlanOptions small() {
  PlanOptions o;
  o.shape = core::Shape{1, 16, 4, 2, 8};
  return o;
}

// The option id and message a plan of `o` on N ranks is refused with, in `names`' words.
std::pair<Option, std::string> refusal(const PlanOptions& o, int N, const OptionNames& names = cli_names()) {
  try {
    make_attention_plan(o, N, names);
  } catch (const OptionError& e) {
    return {e.option, e.what()};
  }
  return {Option::count, ""};
}

void expect_refused(const PlanOptions& o, int N, Option id, const std::string& cli_prefix) {
  const auto [got, msg] = refusal(o, N);
  EXPECT_EQ(int(got), int(id)) << msg;
  EXPECT_EQ(msg.rfind(cli_prefix, 0), 0u) << msg;
}

}  // namespace

TEST(Plan, DefaultsAreTheCommandLines) {
  const PlanOptions o = small();
  EXPECT_EQ(o.layout, "auto");
  EXPECT_EQ(o.strategy, "ring");
  EXPECT_EQ(o.dtype, "f32");
  EXPECT_EQ(o.traffic, "aware");
  const AttentionPlan p = make_attention_plan(o, 2, cli_names());
  EXPECT_EQ(p.layout.kind(), core::LayoutKind::contiguous);  // auto, no causal mask
  EXPECT_DOUBLE_EQ(p.scale, 1 / std::sqrt(8.0));
  EXPECT_GE(p.timeout_s, 300);  // the default watchdog is on
  EXPECT_EQ(p.ulysses_degree, 1);
}

TEST(Plan, AutoLayoutIsZigzagForACausalMaskOnly) {
  PlanOptions o = small();
  o.causal = true;
  EXPECT_EQ(make_attention_plan(o, 2, cli_names()).layout.kind(), core::LayoutKind::zigzag);
  o.window = 4;
  EXPECT_EQ(make_attention_plan(o, 2, cli_names()).layout.kind(), core::LayoutKind::contiguous);
  o.window.reset();
  o.partition = {6, 10};
  EXPECT_EQ(make_attention_plan(o, 2, cli_names()).layout.kind(), core::LayoutKind::contiguous);
  EXPECT_EQ(resolve_layout("auto", true, 0, false, cli_names()), core::LayoutKind::zigzag);
}

TEST(Plan, EveryRuleNamesItsOption) {
  PlanOptions o = small();
  o.shape.S = 0;
  expect_refused(o, 2, Option::seq, "--seq: 0 is not a positive size");
  o = small();
  o.shape.HKV = 3;
  expect_refused(o, 2, Option::kv_heads, "--kv-heads: H=4 is not a multiple of HKV=3");
  o = small();
  o.dtype = "f8";
  expect_refused(o, 2, Option::dtype, "--dtype: unknown dtype 'f8'");
  o = small();
  o.layout = "diagonal";
  expect_refused(o, 2, Option::layout, "--layout: unknown layout 'diagonal'");
  o = small();
  o.layout = "zigzag";
  o.partition = {8, 8};
  expect_refused(o, 2, Option::partition, "--partition: only applies to the contiguous layout");
  o = small();
  o.partition = {8, 7};
  expect_refused(o, 2, Option::partition, "--partition: sizes sum to 15 but S is 16");
  o = small();
  o.partition = {8, 8, 0};
  expect_refused(o, 2, Option::partition, "--partition: has 3 sizes for 2 ranks");
  o = small();
  o.window = 0;
  expect_refused(o, 2, Option::window, "--window: 0 is not a window");
  o = small();
  o.doc_lens = {4, 4};
  expect_refused(o, 2, Option::doc_lens, "--doc-lens: lengths sum to 8 but S is 16");
  o = small();
  o.scale = 1e300;
  expect_refused(o, 2, Option::scale, "--scale: 1e+300 overflows f32's float32 arithmetic in base 2");
  o.scale = 2.4e38;  // finite in float32, but not times log2 e: q = 0 would give 0 inf = NaN scores
  expect_refused(o, 2, Option::scale, "--scale: 2.4e+38 overflows f32's float32 arithmetic in base 2");
  o.scale = 2.3e38;
  EXPECT_NO_THROW(make_attention_plan(o, 2, cli_names()));
  o.dtype = "f64";
  o.scale = 1.5e308;
  expect_refused(o, 2, Option::scale, "--scale: 1.5e+308 overflows f64's float64 arithmetic in base 2");
  o = small();
  o.rope_theta = 10000;
  o.dtype = "bf16";
  expect_refused(o, 2, Option::rope, "--rope: not supported with --dtype bf16");
  o.dtype = "f16";
  expect_refused(o, 2, Option::rope, "--rope: not supported with --dtype f16");
  o = small();
  o.rope_theta = 10000;
  o.shape.D = 7;
  expect_refused(o, 2, Option::rope, "--rope: head dim D = 7 is odd");
  o = small();
  o.strategy = "ulysses";
  o.shape = core::Shape{1, 16, 3, 1, 8};
  expect_refused(o, 2, Option::strategy, "--strategy ulysses: H=3 query heads do not split over N=2 ranks");
  o = small();
  o.strategy = "usp";
  expect_refused(o, 4, Option::strategy, "--strategy usp: needs --ulysses-degree U");
  o.ulysses_degree = 3;
  expect_refused(o, 4, Option::ulysses_degree, "--ulysses-degree: U=3 does not divide N=4 ranks");
  o = small();
  o.ulysses_degree = 2;
  expect_refused(o, 2, Option::ulysses_degree, "--ulysses-degree: only applies with --strategy usp");
  o = small();
  o.kv_head_group = 1;
  expect_refused(o, 2, Option::kv_head_group, "--kv-head-group: only applies with --strategy allgather");
  o.strategy = "allgather";
  o.kv_head_group = 3;
  expect_refused(o, 2, Option::kv_head_group, "--kv-head-group: G=3 does not divide HKV=2");
  o = small();
  o.timeout_s = -1;
  expect_refused(o, 2, Option::timeout, "--timeout: -1 is not a time");
  o = small();
  o.tiling.q_rows = 70000;
  expect_refused(o, 2, Option::tile_q, "--tile-q: 70000 is outside 0..65536");
  o = small();
  o.traffic = "some";
  expect_refused(o, 2, Option::traffic, "--traffic: unknown plan 'some'");
  // ulysses and allgather have no ring traffic to plan: another plan than the default is refused
  for (const char* s : {"ulysses", "allgather"}) {
    o.strategy = s;
    o.traffic = "full";
    expect_refused(o, 2, Option::traffic, "--traffic: only applies with --strategy ring or usp");
    o.traffic = "aware";
    EXPECT_EQ(make_attention_plan(o, 2, cli_names()).traffic, core::Traffic::aware);
  }
  o.strategy = "usp";
  o.ulysses_degree = 2;
  o.traffic = "skip-empty";
  EXPECT_EQ(make_attention_plan(o, 4, cli_names()).traffic, core::Traffic::skip_empty_grads);
}

// The tiles the report names are the ones the kernels run with: resolved for the ring a strategy
// attends (a head-parallel strategy's ring holds U ranks' positions and H/U query heads).
TEST(Plan, KernelTilingIsResolvedForTheStrategysRing) {
  PlanOptions o = small();  // S=16, H=4, HKV=2 (G=2), D=8
  o.tiling.q_rows = 64;
  o.tiling.k_cols = 64;
  core::Tiling t = kernel_tiling(make_attention_plan(o, 4, cli_names()));
  EXPECT_EQ(t.q_rows, 4 * 2);  // ring: 4 positions of G=2 rows
  EXPECT_EQ(t.k_cols, 4);
  o.strategy = "ulysses";  // rings of one rank over 16 positions, H/U = 1 query head per KV head
  t = kernel_tiling(make_attention_plan(o, 4, cli_names()));
  EXPECT_EQ(t.q_rows, 16);
  EXPECT_EQ(t.k_cols, 16);
  o.strategy = "usp";
  o.ulysses_degree = 2;  // groups of 2 ranks: 8 positions; H/U = 2 query heads over HKV/U = 1
  t = kernel_tiling(make_attention_plan(o, 4, cli_names()));
  EXPECT_EQ(t.q_rows, 8 * 2);
  EXPECT_EQ(t.k_cols, 8);
}

TEST(Plan, MessagesAreInEachFrontEndsWords) {
  PlanOptions o = small();
  o.strategy = "usp";
  EXPECT_EQ(refusal(o, 4, cli_names()).second.rfind("--strategy usp: needs --ulysses-degree U", 0), 0u);
  EXPECT_EQ(refusal(o, 4, cpp_names()).second.rfind("strategy usp: needs ulysses_degree U", 0), 0u);
  EXPECT_EQ(refusal(o, 4, python_names()).second.rfind("strategy usp: needs ulysses_degree U", 0), 0u);
  o = small();
  o.shape.S = 0;
  EXPECT_EQ(refusal(o, 2, cpp_names()).second.rfind("shape.S: 0", 0), 0u);
  EXPECT_EQ(refusal(o, 2, python_names()).second.rfind("seq_len: 0", 0), 0u);
  o = small();
  o.rope_theta = 1e4;
  o.dtype = "bf16";
  EXPECT_EQ(refusal(o, 2, cpp_names()).second.rfind("rope_theta: not supported with dtype bf16", 0), 0u);
  // A token that names no option is left as it is.
  EXPECT_EQ(cli_names().render("@seq and @nothing"), "--seq and @nothing");
}

TEST(Plan, AllGatherGroupDefaultsByMemory) {
  PlanOptions o = small();
  o.strategy = "allgather";
  o.shape = core::Shape{1, 64, 8, 4, 8};
  EXPECT_EQ(make_attention_plan(o, 2, cli_names()).kv_head_group, 2);  // the largest G leaving two groups
  o.shape = core::Shape{1, 64, 8, 1, 8};
  EXPECT_EQ(make_attention_plan(o, 2, cli_names()).kv_head_group, 1);
}

TEST(Plan, ShapesThatCannotFitAreRefusedBeforeAnythingIsBuilt) {
  PlanOptions o = small();
  o.shape.S = Index(1) << 40;
  try {
    make_attention_plan(o, 2, cli_names());
    ADD_FAILURE() << "admitted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("needs about"), std::string::npos) << e.what();
  }
}

TEST(Plan, CuSeqlensGiveTheDocumentsOfTheEquivalentDocLens) {
  PlanOptions a = small(), b = small();
  a.doc_lens = {5, 0, 11};
  b.cu_seqlens = {0, 5, 5, 16};
  const AttentionPlan pa = make_attention_plan(a, 2, cli_names()), pb = make_attention_plan(b, 2, cli_names());
  EXPECT_EQ(pa.doc_lens, pb.doc_lens);
  for (Index i = 0; i < 16; ++i)
    for (Index j = 0; j < 16; ++j) EXPECT_EQ(pa.mask.visible(i, j), pb.mask.visible(i, j)) << i << " " << j;
}

TEST(Plan, CuSeqlensRefusalsNameThem) {
  PlanOptions o = small();
  o.cu_seqlens = {1, 16};
  expect_refused(o, 2, Option::cu_seqlens, "cu_seqlens: starts at 1");
  o.cu_seqlens = {0, 9, 4, 16};
  expect_refused(o, 2, Option::cu_seqlens, "cu_seqlens: offset 4 follows 9");
  o.cu_seqlens = {0, 10};
  expect_refused(o, 2, Option::cu_seqlens, "cu_seqlens: ends at 10 but S is 16");
  o.cu_seqlens = {0, 16};
  o.doc_lens = {16};
  const auto [id, msg] = refusal(o, 2, python_names());
  EXPECT_EQ(int(id), int(Option::cu_seqlens));
  EXPECT_EQ(msg, "cu_seqlens: given with doc_lens (expected one of the two)");
}

TEST(Plan, SinksOnePerQueryHeadAndLogits) {
  PlanOptions o = small();
  o.sinks = {0.5, -1.0, 2.0, -INFINITY};  // -inf: no sink for that head
  EXPECT_EQ(make_attention_plan(o, 1, cli_names()).sinks, o.sinks);
  o.sinks = {0.5, 1.0};
  expect_refused(o, 1, Option::sinks, "--sinks: 2 values for H = 4 query heads");
  o.sinks = {0.0, NAN, 0.0, 0.0};
  expect_refused(o, 1, Option::sinks, "--sinks: nan for head 1 is not a logit");
  o.sinks = {0.0, 0.0, INFINITY, 0.0};
  expect_refused(o, 1, Option::sinks, "--sinks: inf for head 2 is not a logit");
  o.sinks = {0.0, 0.0, 0.0, 1e300};
  expect_refused(o, 1, Option::sinks, "--sinks: 1e+300 for head 3 overflows f32");
  o.dtype = "f64";
  EXPECT_NO_THROW(make_attention_plan(o, 1, cli_names()));
  o.sinks = {0.0, 0.0, 0.0, 1.5e308};
  expect_refused(o, 1, Option::sinks, "--sinks: 1.5e+308 for head 3 overflows f64's float64 arithmetic");
}

TEST(Plan, SoftcapZeroIsNoneAndANegativeOrVanishingOneIsRefused) {
  PlanOptions o = small();
  o.softcap = 0.0;  // flash-attn's softcap=0.0: no capping
  EXPECT_EQ(make_attention_plan(o, 1, cli_names()).softcap, 0.0);
  o.softcap = -1.0;
  expect_refused(o, 1, Option::softcap, "--softcap: -1 is not a cap");
  o.softcap = INFINITY;
  expect_refused(o, 1, Option::softcap, "--softcap: inf is not a cap");
  o.softcap = 1e-46;  // 0 in float32: it would cap nothing
  expect_refused(o, 1, Option::softcap, "--softcap: 1e-46 is below the least cap f32's arithmetic takes");
  o.softcap = 1e-30;
  EXPECT_EQ(make_attention_plan(o, 1, cli_names()).softcap, 1e-30);
  o.softcap = 2.4e38;  // finite in float32, but not times log2 e: every capped score would be NaN
  expect_refused(o, 1, Option::softcap, "--softcap: 2.4e+38 overflows f32's float32 arithmetic in base 2");
  o.softcap = 2.3e38;
  EXPECT_EQ(make_attention_plan(o, 1, cli_names()).softcap, 2.3e38);
  o.dtype = "f64";
  o.softcap = 1e-100;
  EXPECT_EQ(make_attention_plan(o, 1, cli_names()).softcap, 1e-100);
}

// f32 (the default) or bf16; bf16 only with bf16 storage, where it reaches the strategy's setup.
TEST(Plan, PrecisionIsF32OrBf16WithBf16StorageOnly) {
  PlanOptions o = small();
  EXPECT_EQ(o.precision, "f32");
  EXPECT_EQ(make_attention_plan(o, 2, cli_names()).precision, core::Precision::f32);
  o.dtype = "bf16";
  o.precision = "bf16";
  const AttentionPlan p = make_attention_plan(o, 2, cli_names());
  EXPECT_EQ(p.precision, core::Precision::bf16);
  EXPECT_EQ(strategy_setup(p).precision, core::Precision::bf16);
  EXPECT_GT(check_tolerance(p.dtype, p.precision), check_tolerance(p.dtype));  // P and dS rounded as well
  bool listed = false;  // the plan's fields, which every rank must hold the same, include it
  for (const PlanField& f : plan_fields(p, o, cli_names()))
    listed = listed || (f.name == "--precision" && f.value == "bf16");
  EXPECT_TRUE(listed);
  for (const char* dtype : {"f32", "f16", "f64"}) {
    o.dtype = dtype;
    expect_refused(o, 2, Option::precision, "--precision bf16 needs --dtype bf16 (");
    EXPECT_NE(refusal(o, 2).second.find(std::string("--dtype is ") + dtype), std::string::npos) << refusal(o, 2).second;
  }
  o.dtype = "f32";
  EXPECT_EQ(refusal(o, 2, cpp_names()).second.rfind("precision bf16 needs dtype bf16 (", 0), 0u);
  EXPECT_EQ(refusal(o, 2, python_names()).second.rfind("precision bf16 needs dtype bf16 (", 0), 0u);
  o.dtype = "bf16";
  o.precision = "fp8";
  expect_refused(o, 2, Option::precision, "--precision: unknown precision 'fp8' (expected f32 or bf16)");
  EXPECT_EQ(refusal(o, 2, python_names()).second, "precision: unknown precision 'fp8' (expected f32 or bf16)");
}

// The KV cache's merge is one of two names, refused in each front end's words.
TEST(Plan, MergeIsAllreduceOrGather) {
  EXPECT_NO_THROW(check_merge("allreduce", cli_names()));
  EXPECT_NO_THROW(check_merge("gather", python_names()));
  for (const auto& [names, prefix] : {std::pair{&cli_names(), "--merge: 'tree'"}, std::pair{&cpp_names(), "merge: 'tree'"},
                                      std::pair{&python_names(), "merge: 'tree'"}}) {
    try {
      check_merge("tree", *names);
      ADD_FAILURE() << "tree accepted";
    } catch (const OptionError& e) {
      EXPECT_EQ(int(e.option), int(Option::merge));
      EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << e.what();
    }
  }
}
