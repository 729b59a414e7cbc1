// The library API (ringattn/ringattn.hpp) on every rank: results against the dense float64
// reference, and every misuse raising the same InputError on every rank instead of hanging.
#include <gtest/gtest.h>

#include <string>

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
