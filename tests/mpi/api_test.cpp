// The library API (ringattn/ringattn.hpp) on every rank: results against the dense float64
// reference, and every misuse raising the same InputError on every rank instead of hanging.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"
#include "ringattn/core/layer_reference.hpp"
#include "ringattn/ringattn.hpp"

namespace ringattn {
namespace {

using core::InputTensor;
using test_util::global_input;
using test_util::local_slice;
using test_util::world;

// The message every rank caught (empty when nothing was thrown), the same on every rank or not.
template <class Fn>
std::string caught(Fn&& fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

void expect_same_everywhere(const std::string& msg) {
  const auto all = world().all_gatherv(std::span<const char>(msg.data(), msg.size()));
  for (const auto& m : all) EXPECT_EQ(std::string(m.begin(), m.end()), msg);
}

// Forward + backward of one plan on `comm`; every output of this rank against the reference.
void check_against_reference(comm::Comm comm, const AttentionOptions& opt) {
  const core::Shape& s = opt.shape;
  Attention att(std::move(comm), opt);
  const int r = att.rank();
  const core::Layout& l = att.layout();
  const auto q = global_input<double>(21, InputTensor::q, s.B, s.S, s.H * s.D);
  const auto k = global_input<double>(21, InputTensor::k, s.B, s.S, s.HKV * s.D);
  const auto v = global_input<double>(21, InputTensor::v, s.B, s.S, s.HKV * s.D);
  const auto dout = global_input<double>(21, InputTensor::dout, s.B, s.S, s.H * s.D);
  att.load(local_slice<double>(q, s.B, s.H * s.D, l, r), local_slice<double>(k, s.B, s.HKV * s.D, l, r),
           local_slice<double>(v, s.B, s.HKV * s.D, l, r));
  att.forward();
  att.backward(local_slice<double>(dout, s.B, s.H * s.D, l, r));
  const Index L = att.local_size();
  std::vector<double> o(s.B * L * s.H * s.D), dq(o.size()), dk(s.B * L * s.HKV * s.D), dv(dk.size());
  att.outputs(Outputs<double>{o, {}, dq, dk, dv, {}});
  const core::DenseResult ref =
      opt.rope_theta ? core::reference_attention_rope(s, att.mask(), att.scale(), *opt.rope_theta, q, k, v, dout)
                     : core::reference_attention(s, att.mask(), att.scale(), q, k, v, dout);
  auto mine = [&](const std::vector<double>& g, Index inner) { return local_slice<double>(g, s.B, inner, l, r); };
  EXPECT_LE(core::max_rel_error(o, mine(ref.o, s.H * s.D)), 1e-10);
  EXPECT_LE(core::max_rel_error(dq, mine(ref.dq, s.H * s.D)), 1e-10);
  EXPECT_LE(core::max_rel_error(dk, mine(ref.dk, s.HKV * s.D)), 1e-10);
  EXPECT_LE(core::max_rel_error(dv, mine(ref.dv, s.HKV * s.D)), 1e-10);
  EXPECT_GT(att.report().forward.flops, 0);
}

AttentionOptions small(const char* layout) {
  AttentionOptions opt;
  opt.shape = {2, 23, 4, 2, 8};
  opt.causal = true;
  opt.layout = layout;
  opt.dtype = "f64";
  opt.timeout_s = 60;
  return opt;
}

TEST(LibraryApi, MatchesTheDenseReferenceWithRopeOnEveryLayout) {
  for (const char* layout : {"contiguous", "striped", "zigzag"}) {
    SCOPED_TRACE(layout);
    AttentionOptions opt = small(layout);
    opt.rope_theta = 10000;
    check_against_reference(comm::Comm::world(), opt);
  }
}

TEST(LibraryApi, RunsOnASubCommunicator) {
  // Even and odd ranks: two independent jobs, each checked against its own reference.
  check_against_reference(world().split(world().rank() % 2, world().rank()), small("zigzag"));
}

TEST(LibraryApi, AWrongShardSizeOnOneRankThrowsOnEveryRank) {
  const AttentionOptions opt = small("contiguous");
  const core::Shape& s = opt.shape;
  Attention att(comm::Comm::world(), opt);
  const Index L = att.local_size();
  const bool last = att.rank() == att.ranks() - 1;
  std::vector<double> q(s.B * L * s.H * s.D + (last ? 1 : 0)), kv(s.B * L * s.HKV * s.D);
  const std::string msg = caught([&] { att.load(q, kv, kv); });
  EXPECT_NE(msg.find("q: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("elements on this rank"), std::string::npos) << msg;
  expect_same_everywhere(msg);
  // Nothing was loaded: the forward refuses on every rank; a good load then runs.
  const std::string early = caught([&] { att.forward(); });
  EXPECT_EQ(early, "forward: called before load()");
  expect_same_everywhere(early);
  q.resize(s.B * L * s.H * s.D);
  att.load(q, kv, kv);
  att.forward();
}

TEST(LibraryApi, MisuseThrowsTheSameMessageOnEveryRank) {
  AttentionOptions bad = small("zigzag");
  bad.partition = {23};
  std::string msg = caught([&] { Attention att(comm::Comm::world(), bad); });
  EXPECT_NE(msg.find("partition: only applies to the contiguous layout"), std::string::npos) << msg;
  expect_same_everywhere(msg);

  bad = small("contiguous");
  bad.dtype = "f16x";
  msg = caught([&] { Attention att(comm::Comm::world(), bad); });
  EXPECT_NE(msg.find("dtype: unknown dtype 'f16x'"), std::string::npos) << msg;
  expect_same_everywhere(msg);

  if (world().size() > 1) {  // one rank with another window: the plans differ
    bad = small("contiguous");
    bad.window = world().rank() == 1 ? std::optional<Index>(4) : std::nullopt;
    msg = caught([&] { Attention att(comm::Comm::world(), bad); });
    EXPECT_NE(msg.find("ranks disagree on window"), std::string::npos) << msg;
    expect_same_everywhere(msg);
  }

  Attention att(comm::Comm::world(), small("contiguous"));
  std::vector<float> wrong(8);
  msg = caught([&] { att.load(wrong, wrong, wrong); });
  EXPECT_NE(msg.find("load: f32 data given to a plan of dtype f64"), std::string::npos) << msg;
  expect_same_everywhere(msg);
  msg = caught([&] { att.backward(std::vector<double>(8)); });
  EXPECT_EQ(msg, "backward: called before forward()");
  expect_same_everywhere(msg);
}

}  // namespace
}  // namespace ringattn

namespace ringattn {
namespace {

TEST(LibraryApi, AMovedFromAttentionThrowsInsteadOfCrashing) {
  Attention from(comm::Comm::world(), small("contiguous"));
  Attention to = std::move(from);
  const std::string msg = caught([&] { from.forward(); });
  EXPECT_NE(msg.find("used after it was moved from"), std::string::npos) << msg;
  EXPECT_EQ(caught([&] { (void)from.local_size(); }), msg);
  EXPECT_EQ(caught([&] { (void)from.report(); }), msg);
  EXPECT_EQ(to.local_size(), to.layout().size(to.rank()));  // the plan moved whole
}

}  // namespace
}  // namespace ringattn

// ---- the KV cache ----------------------------------------------------------------------------------

namespace ringattn {
namespace {

// Rows [B, positions, inner] of a global [B, S, inner] tensor, as T.
template <class T>
std::vector<T> rows(const std::vector<double>& g, Index B, Index S, Index inner, const std::vector<Index>& pos) {
  std::vector<T> x;
  for (Index b = 0; b < B; ++b)
    for (Index p : pos)
      for (Index e = 0; e < inner; ++e) x.push_back(core::value_cast<T>(g[(b * S + p) * inner + e]));
  return x;
}

// A prompt of S0 positions, then K steps of T tokens: every O and LSE equals the rows of dense
// causal (windowed) attention over all S0 + K T positions, and every rank's decode O is the same.
template <class S>
void expect_cache_matches_reference(const std::string& dtype, Index window, double tol) {
  using A = core::accum_t<S>;
  const Index B = 2, H = 4, HKV = 2, D = 8, S0 = 29, T = 3, K = 4, Sall = S0 + K * T;
  KVCacheOptions co;
  co.batch = B, co.heads = H, co.kv_heads = HKV, co.head_dim = D, co.dtype = dtype;
  if (window) co.window = window;
  KVCache<S> cache(comm::Comm::world(), co);
  auto rounded = [](std::vector<double> g) {  // the values a cache of S holds
    for (double& x : g) x = core::value_cast<double>(core::value_cast<S>(x));
    return g;
  };
  const auto q = rounded(global_input<double>(5, InputTensor::q, B, Sall, H * D));
  const auto k = rounded(global_input<double>(5, InputTensor::k, B, Sall, HKV * D));
  const auto v = rounded(global_input<double>(5, InputTensor::v, B, Sall, HKV * D));
  const core::Shape s{B, Sall, H, HKV, D};
  const core::DenseResult ref =
      core::reference_attention(s, core::Mask::make(Sall, true, window, {}), 1 / std::sqrt(double(D)), q, k, v,
                                std::vector<double>(q.size()), false);
  double peak = 0, err = 0;
  for (double x : ref.o) peak = std::max(peak, std::abs(x));
  auto compare = [&](const std::vector<A>& o, const std::vector<A>& lse, const std::vector<Index>& pos) {
    const auto want = rows<double>(ref.o, B, Sall, H * D, pos);
    for (std::size_t n = 0; n < want.size(); ++n) err = std::max(err, std::abs(double(o[n]) - want[n]) / peak);
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h)
        for (std::size_t i = 0; i < pos.size(); ++i) {
          const double want_lse = ref.lse[(b * H + h) * Sall + pos[i]];
          const double got_lse = lse[(b * H + h) * pos.size() + i];
          err = std::max(err, std::abs(got_lse - want_lse) / std::max(1.0, std::abs(want_lse)));
        }
  };
  const std::vector<Index> pos = cache.positions(S0);
  const Index L = Index(pos.size());
  std::vector<A> o(B * L * H * D), lse(B * H * L);
  cache.prefill(S0, rows<S>(q, B, Sall, H * D, pos), rows<S>(k, B, Sall, HKV * D, pos),
                rows<S>(v, B, Sall, HKV * D, pos), o, lse);
  compare(o, lse, pos);
  for (Index step = 0; step < K; ++step) {
    std::vector<Index> new_pos(T);
    for (Index t = 0; t < T; ++t) new_pos[t] = S0 + step * T + t;
    std::vector<A> od(B * T * H * D), ld(B * H * T);
    cache.decode(rows<S>(q, B, Sall, H * D, new_pos), rows<S>(k, B, Sall, HKV * D, new_pos),
                 rows<S>(v, B, Sall, HKV * D, new_pos), od, ld);
    compare(od, ld, new_pos);
    const auto all = world().all_gatherv(std::span<const A>(od));
    for (const auto& x : all) EXPECT_TRUE(std::equal(x.begin(), x.end(), od.begin(), od.end())) << "step " << step;
  }
  EXPECT_EQ(cache.length(), Sall);
  EXPECT_LE(err, tol) << dtype << ", window " << window;
  EXPECT_GT(peak, 0);
}

TEST(LibraryKVCache, PrefillAndDecodeMatchTheDenseReference) {
  expect_cache_matches_reference<double>("f64", 0, 1e-12);
  expect_cache_matches_reference<float>("f32", 7, 3e-6);
  expect_cache_matches_reference<core::bf16>("bf16", 0, 3e-6);  // computed in f32 on bf16 inputs
}

TEST(LibraryKVCache, BadInputThrowsTheSameMessageOnEveryRank) {
  KVCacheOptions co;
  co.batch = 1, co.heads = 2, co.kv_heads = 1, co.head_dim = 4, co.dtype = "f32";
  std::string msg = caught([&] { KVCache<double> wrong(comm::Comm::world(), co); });
  EXPECT_NE(msg.find("is not this KVCache's storage"), std::string::npos) << msg;
  expect_same_everywhere(msg);
  co.merge = "tree";
  msg = caught([&] { KVCache<float> bad(comm::Comm::world(), co); });
  EXPECT_NE(msg.find("merge: 'tree' is not a merge"), std::string::npos) << msg;
  expect_same_everywhere(msg);
  co.merge = world().rank() == world().size() - 1 ? "tree" : "allreduce";  // on one rank only
  msg = caught([&] { KVCache<float> bad(comm::Comm::world(), co); });
  EXPECT_NE(msg.find("merge: 'tree' is not a merge"), std::string::npos) << msg;
  expect_same_everywhere(msg);
  co.merge = "allreduce";
  KVCache<float> cache(comm::Comm::world(), co);
  const Index L = Index(cache.positions(10).size());
  const bool last = world().rank() == world().size() - 1;
  std::vector<float> q(L * 2 * 4 + (last ? 1 : 0)), kv(L * 4);
  msg = caught([&] { cache.prefill(10, q, kv, kv); });  // one rank's q is one element long
  EXPECT_NE(msg.find("q: "), std::string::npos) << msg;
  expect_same_everywhere(msg);
  q.resize(L * 2 * 4);
  cache.prefill(10, q, kv, kv);
  std::vector<float> q1(8), kv1(4), o1(8);
  msg = caught([&] { cache.decode(std::span<const float>(), kv1, kv1, o1); });
  EXPECT_NE(msg.find("T = 0"), std::string::npos) << msg;
  expect_same_everywhere(msg);
  msg = caught([&] { cache.decode(q1, kv1, kv1, std::span<float>(o1).first(4)); });
  EXPECT_NE(msg.find("o: "), std::string::npos) << msg;
  expect_same_everywhere(msg);
  cache.decode(q1, kv1, kv1, o1);
  EXPECT_EQ(cache.length(), 11);
}

}  // namespace
}  // namespace ringattn
