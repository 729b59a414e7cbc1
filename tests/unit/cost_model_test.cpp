#include "ringattn/core/cost_model.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "ringattn/core/errors.hpp"
#include "ringattn/core/head_split.hpp"

using namespace ringattn;
using namespace ringattn::core;

namespace {
// The cost model's worked example is quoted to 3 significant digits; 0.5% of the value is within that print
// precision for every figure below (and well within 1%).
void expect_close(double got, double want, const char* what, double rel = 5e-3) {
  EXPECT_NEAR(got, want, rel * std::abs(want)) << what;
}

// The cost model's worked example: S=262144, N=8, H=32, HKV=8 (GQA 4), D=128, B=1, bf16, A100 312e12 FLOP/s,
// NVLink one-way 300e9 B/s. These are CostInputs' defaults.
const CostInputs kModelExample{};
}  // namespace

TEST(CostModel, DefaultsAreTheModelExample) {
  EXPECT_EQ(kModelExample.S, 262144);
  EXPECT_EQ(kModelExample.N, 8);
  EXPECT_EQ(kModelExample.H, 32);
  EXPECT_EQ(kModelExample.HKV, 8);
  EXPECT_EQ(kModelExample.D, 128);
  EXPECT_EQ(kModelExample.B, 1);
  EXPECT_EQ(kModelExample.bytes, 2);
  EXPECT_EQ(kModelExample.flops, 312e12);
  EXPECT_EQ(kModelExample.bandwidth, 300e9);
}

// Section 4 and 4.1: 0.94 GB received (7 blocks of 134 MB), 451 ms compute, 3.13 ms comm, 0.69%.
TEST(CostModel, ModelExampleLayerFigures) {
  const CostEstimate e = estimate_cost(kModelExample);
  EXPECT_DOUBLE_EQ(e.recv_bytes, 7.0 / 8.0 * 262144 * 2 * 8 * 128 * 2);  // 939,524,096 B exactly
  expect_close(e.recv_bytes, 0.94e9, "recv 0.94 GB");
  EXPECT_DOUBLE_EQ(e.send_bytes, e.recv_bytes);
  expect_close(e.work_flops, 140.7e12, "W 140.7 TFLOP");
  expect_close(e.compute_s, 0.451, "compute 451 ms");
  expect_close(e.comm_s, 3.13e-3, "comm 3.13 ms");
  expect_close(e.comm_ratio, 0.0069, "comm/compute 0.69%", 1e-2);  // printed to 2 digits: 0.694%
}

// Section 4: I_step = (H/HKV) S/N = 131,072 and I = (H/HKV) S/(N-1) = 149,797 FLOP/byte; beta 1040.
TEST(CostModel, ModelExampleIntensities) {
  const CostEstimate e = estimate_cost(kModelExample);
  EXPECT_DOUBLE_EQ(e.step_intensity, 131072.0);
  EXPECT_NEAR(e.layer_intensity, 149797.0, 0.5);
  EXPECT_DOUBLE_EQ(e.beta, 1040.0);
  // the two differ by (N-1)/N
  EXPECT_DOUBLE_EQ(e.step_intensity, 7.0 / 8.0 * e.layer_intensity);
  EXPECT_EQ(e.verdict, Verdict::overlap_has_room);
}

// Section 4.1 table: one step computes 56.4 ms and receives one 134 MB block in 0.447 ms (0.79%).
TEST(CostModel, ModelExampleStepFigures) {
  const CostEstimate e = estimate_cost(kModelExample);
  expect_close(e.step_compute_s, 56.4e-3, "step compute 56.4 ms");
  expect_close(e.step_comm_s, 0.447e-3, "step comm 0.447 ms");
  expect_close(e.step_comm_ratio, 0.0079, "step comm/compute 0.79%", 1e-2);
  // beta / I_step is the same ratio, read from the intensities
  EXPECT_NEAR(e.step_comm_ratio, e.beta / e.step_intensity, 1e-15);
  // N steps of compute, N-1 receives
  EXPECT_NEAR(e.compute_s, 8 * e.step_compute_s, 1e-12);
  EXPECT_NEAR(e.comm_s, 7 * e.step_comm_s, 1e-15);
}

// Section 4.2 and 13: Ulysses moves 0.587 GB, tensor parallelism 8.59 GB for the same layer.
TEST(CostModel, ModelExampleUlyssesAndTensorParallelBytes) {
  const CostEstimate e = estimate_cost(kModelExample);
  EXPECT_DOUBLE_EQ(e.ulysses_recv_bytes, 587202560.0);
  expect_close(e.ulysses_recv_bytes, 0.587e9, "Ulysses 0.587 GB");
  EXPECT_DOUBLE_EQ(e.tp_bytes, 8589934592.0);
  expect_close(e.tp_bytes, 8.59e9, "TP 8.59 GB");
  expect_close(e.ulysses_recv_bytes / e.recv_bytes, 0.63, "Ulysses / ring 0.63", 1e-2);
}

// Section 6: (N+1)/2N is 56.3% at N = 8 (75, 62.5, 53.1, 51.6% at 2, 4, 16, 32); N/(2N-1) 53.3%.
TEST(CostModel, CausalUtilizationOfContiguousShards) {
  expect_close(estimate_cost(kModelExample).causal_utilization, 0.563, "56.3%", 1e-3);
  expect_close(estimate_cost(kModelExample).causal_utilization_tri, 0.533, "53.3%", 1e-3);
  const double want[][2] = {{2, 0.75}, {4, 0.625}, {16, 0.531}, {32, 0.516}};
  for (const auto& w : want) {
    CostInputs in = kModelExample;
    in.N = Index(w[0]);
    expect_close(estimate_cost(in).causal_utilization, w[1], "(N+1)/2N", 1e-3);
  }
  CostInputs one = kModelExample;
  one.N = 1;
  EXPECT_DOUBLE_EQ(estimate_cost(one).causal_utilization, 1.0);
  EXPECT_DOUBLE_EQ(estimate_cost(one).causal_utilization_tri, 1.0);
}

// Section 4: across nodes on 400 Gb/s IB (50 GB/s per GPU) the same layer takes 18.8 ms, 4.2%.
TEST(CostModel, ModelExampleInfiniBandVariant) {
  CostInputs in = kModelExample;
  in.bandwidth = 50e9;
  const CostEstimate e = estimate_cost(in);
  expect_close(e.comm_s, 18.8e-3, "comm 18.8 ms");
  expect_close(e.comm_ratio, 0.042, "4.2%", 1e-2);
  expect_close(e.step_comm_s, 2.68e-3, "step comm 2.68 ms");
  EXPECT_EQ(e.verdict, Verdict::overlap_has_room);  // 4.8% per step
}

// Section 4: N <= (H/HKV) S / beta with beta = 19,780 and GQA 4: 128K -> 26.5, 32K -> 6.6, 8K -> 1.7.
TEST(CostModel, MaxRanksIsTheLargestNWithStepIntensityAtLeastBeta) {
  CostInputs in = kModelExample;
  in.flops = 19780e9;
  in.bandwidth = 1e9;
  const struct {
    Index S;
    double bound;
    Index ranks;
  } want[] = {{131072, 26.5, 26}, {32768, 6.6, 6}, {8192, 1.7, 1}};
  for (const auto& w : want) {
    in.S = w.S;
    const CostEstimate e = estimate_cost(in);
    EXPECT_NEAR(e.max_ranks_bound, w.bound, 0.05) << "printed to one decimal";
    EXPECT_EQ(e.max_ranks, w.ranks) << "S=" << w.S;
    // the definition: I_step >= beta at max_ranks and not one rank further
    CostInputs at = in;
    at.N = e.max_ranks;
    if (e.max_ranks_bound >= 1) {
      EXPECT_GE(estimate_cost(at).step_intensity, e.beta);
    }
    at.N = e.max_ranks + 1;
    EXPECT_LT(estimate_cost(at).step_intensity, e.beta);
  }
  in.S = 4;  // beta far above any I_step: one device, which never communicates, still qualifies
  EXPECT_EQ(estimate_cost(in).max_ranks, 1);
}

// Section 8's counter-example: 8K, GQA 4, N = 8 across IB: I_step 4096 against beta 19,780.
TEST(CostModel, ShortSequenceAcrossNodesIsNotNegligible) {
  CostInputs in = kModelExample;
  in.S = 8192;
  in.flops = 19780e9;
  in.bandwidth = 1e9;
  const CostEstimate e = estimate_cost(in);
  EXPECT_DOUBLE_EQ(e.step_intensity, 4096.0);
  EXPECT_EQ(e.verdict, Verdict::not_negligible);
}

// Section 4 end: causal halves the useful work (and the intensities), not the bytes.
TEST(CostModel, CausalHalvesWorkAndIntensityButNotBytes) {
  CostInputs in = kModelExample;
  in.causal = true;
  const CostEstimate c = estimate_cost(in), f = estimate_cost(kModelExample);
  EXPECT_DOUBLE_EQ(c.recv_bytes, f.recv_bytes);
  EXPECT_DOUBLE_EQ(c.comm_s, f.comm_s);
  EXPECT_DOUBLE_EQ(c.compute_s, 0.5 * f.compute_s);
  EXPECT_DOUBLE_EQ(c.step_compute_s, 0.5 * f.step_compute_s);
  EXPECT_DOUBLE_EQ(c.step_intensity, 0.5 * f.step_intensity);
  EXPECT_DOUBLE_EQ(c.layer_intensity, 0.5 * f.layer_intensity);
  EXPECT_DOUBLE_EQ(c.comm_ratio, 2 * f.comm_ratio);
  EXPECT_DOUBLE_EQ(c.max_ranks_bound, 0.5 * f.max_ranks_bound);
  EXPECT_DOUBLE_EQ(c.tp_bytes, f.tp_bytes);
}

// The element size enters only through the bytes: I_step = (H/HKV)(S/N)(2/p).
TEST(CostModel, ElementSizeScalesBytesAndIntensity) {
  CostInputs in = kModelExample;
  in.bytes = 4;  // f32
  const CostEstimate e = estimate_cost(in), f = estimate_cost(kModelExample);
  EXPECT_DOUBLE_EQ(e.recv_bytes, 2 * f.recv_bytes);
  EXPECT_DOUBLE_EQ(e.step_intensity, 0.5 * f.step_intensity);
  EXPECT_DOUBLE_EQ(e.layer_intensity, 0.5 * f.layer_intensity);
  EXPECT_DOUBLE_EQ(e.compute_s, f.compute_s);
  EXPECT_DOUBLE_EQ(step_intensity(32768, 32, 8, 4, false), 65536.0);
}

// Batch and head dim cancel in both intensities (section 4: "与头维度 d 无关，与批大小 b 无关").
TEST(CostModel, IntensityIndependentOfBatchAndHeadDim) {
  CostInputs in = kModelExample;
  in.B = 3;
  in.D = 64;
  const CostEstimate e = estimate_cost(in), f = estimate_cost(kModelExample);
  EXPECT_DOUBLE_EQ(e.step_intensity, f.step_intensity);
  EXPECT_NEAR(e.layer_intensity, f.layer_intensity, 1e-9 * f.layer_intensity);
  EXPECT_NEAR(e.comm_ratio, f.comm_ratio, 1e-12);
}

TEST(CostModel, OneRankNeverCommunicates) {
  CostInputs in = kModelExample;
  in.N = 1;
  const CostEstimate e = estimate_cost(in);
  EXPECT_EQ(e.recv_bytes, 0);
  EXPECT_EQ(e.comm_s, 0);
  EXPECT_EQ(e.step_comm_s, 0);
  EXPECT_EQ(e.ulysses_recv_bytes, 0);
  EXPECT_TRUE(std::isinf(e.layer_intensity));
  EXPECT_EQ(e.verdict, Verdict::no_communication);
}

TEST(CostModel, VerdictThresholdsAreFiveAndFifteenPercent) {
  EXPECT_EQ(verdict_for(0.0499), Verdict::overlap_has_room);
  EXPECT_EQ(verdict_for(0.05), Verdict::depends_on_implementation);
  EXPECT_EQ(verdict_for(0.15), Verdict::depends_on_implementation);
  EXPECT_EQ(verdict_for(0.1501), Verdict::not_negligible);
  EXPECT_EQ(verdict_for(0.5, false), Verdict::no_communication);
  EXPECT_STREQ(verdict_text(Verdict::overlap_has_room), "overlap has room");
  EXPECT_STREQ(verdict_text(Verdict::depends_on_implementation), "depends on the implementation");
  EXPECT_STREQ(verdict_text(Verdict::not_negligible), "communication is not negligible");
}

TEST(CostModel, RejectsBadInputsNamingTheOption) {
  auto message = [](CostInputs in) -> std::string {
    try {
      estimate_cost(in);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  CostInputs in = kModelExample;
  in.HKV = 5;  // the shape's rules are the plan's; the cost model refuses what the plan did not check
  EXPECT_NE(message(in).find("not checked by the plan"), std::string::npos) << message(in);
  in = kModelExample;
  in.N = 0;
  EXPECT_EQ(message(in).rfind("--ranks:", 0), 0u) << message(in);
  in = kModelExample;
  in.bandwidth = 0;
  EXPECT_EQ(message(in).rfind("--bandwidth:", 0), 0u) << message(in);
  in = kModelExample;
  in.flops = -1;
  EXPECT_EQ(message(in).rfind("--flops:", 0), 0u) << message(in);
  in = kModelExample;
  in.bytes = std::nan("");
  EXPECT_EQ(message(in).rfind("--bytes:", 0), 0u) << message(in);
}

// The strategies side by side: ulysses receives what the runtime's all-to-all ledger counts, the
// the cost model's 0.587 GB without LSE; the ring row is the ring's own figures; usp sits between.
TEST(CostModel, StrategiesSideBySide) {
  const std::vector<StrategyEstimate> st = estimate_strategies(kModelExample);
  ASSERT_EQ(st.size(), 5u);  // ring, ulysses, usp U=2, usp U=4, allgather
  const CostEstimate ring = estimate_cost(kModelExample);
  EXPECT_EQ(st[0].strategy, "ring");
  EXPECT_DOUBLE_EQ(st[0].recv_bytes, ring.recv_bytes);
  EXPECT_DOUBLE_EQ(st[0].step_intensity, ring.step_intensity);
  EXPECT_EQ(st[0].a2a_recv_elems, 0);
  EXPECT_EQ(st[1].strategy, "ulysses");
  EXPECT_DOUBLE_EQ(st[1].a2a_recv_elems * kModelExample.bytes, ring.ulysses_recv_bytes);
  EXPECT_EQ(st[1].ring_recv_bytes, 0);
  EXPECT_EQ(st[2].U, 2);
  EXPECT_EQ(st[3].U, 4);
  for (const StrategyEstimate& e : st) EXPECT_TRUE(e.impossible.empty()) << e.strategy;
  EXPECT_GT(st[2].recv_bytes, st[1].recv_bytes);
  EXPECT_LT(st[2].recv_bytes, st[0].recv_bytes);
  EXPECT_EQ(predicted_best(st).strategy, "ring");  // NVLink hides the ring; the all-to-all is exposed
  // allgather receives the ring's bytes; at S = 256K one bf16 KV head per group already fills the
  // 256 MiB of two gathered groups (2 x 2 B S D p), so G = 1; the first group's gather is exposed.
  EXPECT_EQ(st[4].strategy, "allgather");
  EXPECT_DOUBLE_EQ(st[4].ag_recv_bytes, ring.recv_bytes);
  EXPECT_EQ(st[4].kv_head_group, 1);
  EXPECT_DOUBLE_EQ(st[4].gathered_bytes, 256.0 * 1048576.0);
  EXPECT_DOUBLE_EQ(st[4].exposed_gather_s, ring.recv_bytes / 8 / kModelExample.bandwidth);
}

// The number plan prints is the one the runtime's ledger counts (elements, LSE apart).
TEST(CostModel, UlyssesElementsAreTheLedgersClosedForm) {
  CostInputs in;
  in.S = 64;
  in.N = 4;
  in.H = 8;
  in.HKV = 4;
  in.D = 16;
  in.B = 2;
  const StrategyEstimate u = estimate_strategies(in)[1];
  const Ledger l = expected_a2a_ledger(Layout::contiguous(64, 4), Shape{2, 64, 8, 4, 16}, 4, 1, true, 4, 4);
  EXPECT_DOUBLE_EQ(u.a2a_recv_elems + u.lse_recv_elems, double(l.a2a_fwd_recv_elems));
  EXPECT_DOUBLE_EQ(u.a2a_recv_elems, double(l.a2a_bwd_recv_elems));
}

TEST(CostModel, StrategiesTheShapeForbidsAreNamed) {
  CostInputs in;
  in.N = 4;
  in.H = 6;
  in.HKV = 2;
  const std::vector<StrategyEstimate> st = estimate_strategies(in);
  ASSERT_EQ(st.size(), 4u);  // ring, ulysses, usp U=2, allgather
  EXPECT_TRUE(st[0].impossible.empty());
  EXPECT_TRUE(st[3].impossible.empty());  // allgather has no rule on the heads
  EXPECT_NE(st[1].impossible.find("H % N == 0"), std::string::npos) << st[1].impossible;
  EXPECT_TRUE(st[2].impossible.empty());  // usp U = 2 splits 6 heads
  in.H = 3;
  in.HKV = 1;
  EXPECT_NE(estimate_strategies(in)[2].impossible.find("H % U == 0"), std::string::npos);
  EXPECT_EQ(predicted_best(estimate_strategies(in)).strategy, "ring");
}

// The chosen G is the largest divisor of HKV leaving at least two groups whose gathered K/V fits
// in 256 MiB, 1 when none does: the rule by brute force over every G.
TEST(CostModel, DefaultKvHeadGroupIsTheLargestDivisorThatFits) {
  for (const Index S : {Index(1), Index(4096), Index(1) << 20, Index(1) << 24})
    for (Index HKV = 1; HKV <= 240; ++HKV) {
      const double per_head = 2.0 * 2.0 * double(S) * 64.0 * 2.0, budget = 256.0 * 1048576.0;
      Index want = 1;
      for (Index G = 1; G <= HKV; ++G)
        if (HKV % G == 0 && HKV / G >= 2 && double(G) * per_head <= budget) want = G;
      EXPECT_EQ(default_kv_head_group(1, S, HKV, 64, 2.0), want) << "S=" << S << " HKV=" << HKV;
    }
}

// Huge counts end at once: the usp rows come from N's divisor pairs, G from HKV's; N beyond MPI's
// int is refused.
TEST(CostModel, HugeCountsEndQuickly) {
  CostInputs in;
  in.N = (Index(1) << 31) - 1;  // prime: ring, ulysses and allgather only
  EXPECT_EQ(estimate_strategies(in).size(), 3u);
  in.N = Index(1) << 30;  // U = 2, 4, ..., 2^29
  const std::vector<StrategyEstimate> st = estimate_strategies(in);
  ASSERT_EQ(st.size(), 3u + 29u);
  for (std::size_t i = 2; i + 1 < st.size(); ++i) EXPECT_EQ(st[i].U, Index(1) << (i - 1));
  in.N = Index(1) << 31;
  EXPECT_THROW(estimate_cost(in), InputError);
  EXPECT_EQ(default_kv_head_group(1, 1, Index(1) << 40, 1, 64.0), Index(1) << 20);  // 256 bytes a head: 2^20 fit
  EXPECT_EQ(default_kv_head_group(1, 1, (Index(1) << 61) - 1, 1, 64.0), 1);  // a prime: 2^20 steps, not 2^61
}
