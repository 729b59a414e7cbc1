// The job harness without MPI: ranks are threads sharing a comm::Group, the job is a stand-in
// whose every figure is known. What the harness reports, checks and writes must be exactly what
// each rank's job produced, from the right rank, in rank order.
#include "ringattn/runtime/harness.hpp"

#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "ringattn/core/median.hpp"
#include "ringattn/io/npy.hpp"
#include "ringattn/runtime/staged_outputs.hpp"

using namespace ringattn;
using namespace ringattn::runtime;
using core::Index;

namespace {

// N ranks as threads: every collective writes its part into the rank's slot, waits for all, reads.
class ThreadGroup final : public comm::Group {
 public:
  struct Shared {
    explicit Shared(int n) : N(n), bar(n), slots(n) {}
    int N;
    std::barrier<> bar;
    std::vector<std::vector<std::byte>> slots;
  };
  ThreadGroup(Shared& s, int rank) : s_(s), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_.N; }
  void barrier() const override { s_.bar.arrive_and_wait(); }
  void allreduce_max(std::span<double> v) const override { reduce(v, [](double a, double b) { return std::max(a, b); }); }
  void allreduce_sum(std::span<double> v) const override { reduce(v, [](double a, double b) { return a + b; }); }
  void allreduce_min(std::span<std::int64_t> v) const override {
    reduce(v, [](std::int64_t a, std::int64_t b) { return std::min(a, b); });
  }
  void allreduce_max(std::span<std::int64_t> v) const override {
    reduce(v, [](std::int64_t a, std::int64_t b) { return std::max(a, b); });
  }
  std::vector<std::byte> gather_bytes(std::span<const std::byte> mine, int root,
                                      std::vector<std::size_t>& counts) const override {
    post(mine);
    std::vector<std::byte> all;
    counts.clear();
    if (root < 0 || root == rank_)
      for (const auto& s : s_.slots) {
        all.insert(all.end(), s.begin(), s.end());
        counts.push_back(s.size());
      }
    barrier();
    return all;
  }
  void broadcast_bytes(std::span<std::byte> buf, int root) const override {
    post(buf);
    if (!buf.empty()) std::memcpy(buf.data(), s_.slots[root].data(), buf.size());
    barrier();
  }

 private:
  void post(std::span<const std::byte> b) const {
    s_.slots[rank_].assign(b.begin(), b.end());
    barrier();
  }
  template <class T, class Op>
  void reduce(std::span<T> v, Op op) const {
    post(std::as_bytes(v));
    for (int r = 0; r < s_.N; ++r) {
      const T* x = reinterpret_cast<const T*>(s_.slots[r].data());
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = r == 0 ? x[i] : op(v[i], x[i]);
    }
    barrier();
  }
  Shared& s_;
  int rank_;
};

// Runs fn on N thread-ranks.
void on_ranks(int N, const std::function<void(const comm::Group&)>& fn) {
  ThreadGroup::Shared shared(N);
  std::vector<std::thread> ts;
  for (int r = 0; r < N; ++r)
    ts.emplace_back([&, r] {
      ThreadGroup g(shared, r);
      fn(g);
    });
  for (auto& t : ts) t.join();
}

constexpr Index kS = 10;

// Every figure is a function of (rank, iteration): the positional output "o" holds each position's
// global index, the whole output "w" the numbers 1, 2, 3; a rank can be told to get one wrong.
class StandInJob final : public Job {
 public:
  StandInJob(int rank, const core::Layout& l, int wrong_rank, int wrong_whole_rank)
      : rank_(rank), layout_(l), wrong_(wrong_rank == rank), wrong_whole_(wrong_whole_rank == rank) {}
  IterationTimes iterate(bool timed) override {
    const double it = iterations_++;
    timed_ += timed ? 1 : 0;
    return {0.5 + rank_ + 0.125 * it, 2.0 * rank_ + 0.25 * it, 0.1 * rank_, 0.01 * it};
  }
  std::vector<OutputTensor> outputs() const override {
    o_.clear();
    for (Index p : layout_.positions(rank_)) o_.push_back(double(p));
    if (wrong_ && !o_.empty()) o_[0] += 0.5;
    w_ = {1.0, 2.0, wrong_whole_ ? 3.5 : 3.0};
    OutputTensor o{"o", {1, kS}, 1, o_, {}, core::DType::f64, true};
    OutputTensor w{"w", {3}, kWhole, w_, {}, core::DType::f64, true};
    return {o, w};
  }
  std::optional<double> local_loss() const override { return 1.0 + rank_; }
  io::RankRow rank_row() const override {
    io::RankRow r;
    r.positions = layout_.size(rank_);
    r.ledger.fwd_kv_send_elems = 100 + rank_;
    r.work.flops = 1000.0 * rank_;
    return r;
  }
  std::vector<StepRecord> steps() const override { return {StepRecord{Pass::forward, 0, rank_, 0.5, 0.25, 8}}; }
  std::vector<ReferenceTensor> reference() const override {
    std::vector<double> o(kS);
    for (Index p = 0; p < kS; ++p) o[p] = double(p);
    return {{"o", o, 0.0}, {"w", {1.0, 2.0, 3.0}, 0.0}};
  }
  void finish_report(const comm::Group&, io::Report& rep) override { rep.extras["stand_in"] = true; }
  int timed_ = 0, iterations_ = 0;

 private:
  int rank_;
  const core::Layout& layout_;
  bool wrong_, wrong_whole_;
  mutable std::vector<double> o_, w_;
};

struct Outcome {
  io::Report report;
  int exit = -1, timed = 0;
};

// Runs the harness on N thread-ranks; returns every rank's outcome.
std::vector<Outcome> run(int N, int warmup, int iters, int wrong_rank = -1, int wrong_whole = -1,
                         const std::string& out = "", const std::string& report = "") {
  const core::Layout layout = core::Layout::make(core::LayoutKind::striped, kS, N);
  std::vector<Outcome> res(N);
  on_ranks(N, [&](const comm::Group& g) {
    StandInJob job(g.rank(), layout, wrong_rank, wrong_whole);
    StagedOutputs staged(g, OutputPaths{out, report, "", {}, {}});
    HarnessOptions opt;
    opt.warmup = warmup;
    opt.iters = iters;
    opt.check = true;
    opt.tolerance = 1e-12;
    opt.layout = &layout;
    opt.report = !report.empty();
    Outcome& o = res[g.rank()];
    o.report = run_harness(g, job, staged, opt);
    o.exit = exit_code(o.report);
    o.timed = job.timed_;
  });
  return res;
}

}  // namespace

TEST(Harness, ReportHoldsEveryRanksRowInRankOrder) {
  const int N = 3, warmup = 2, iters = 3;
  const auto res = run(N, warmup, iters);
  const io::Report& rep = res[0].report;
  ASSERT_EQ(rep.ranks.size(), std::size_t(N));
  for (int r = 0; r < N; ++r) {
    const io::RankRow& row = rep.ranks[r];
    EXPECT_EQ(row.rank, r);
    EXPECT_EQ(row.positions, core::Layout::striped(kS, N).size(r));
    EXPECT_EQ(row.ledger.fwd_kv_send_elems, 100 + r);
    EXPECT_EQ(row.work.flops, 1000.0 * r);
    // this rank's median over the timed iterations (warmup 0, 1 left out): iterations 2, 3, 4
    EXPECT_DOUBLE_EQ(row.forward_s, 0.5 + r + 0.125 * 3);
    EXPECT_DOUBLE_EQ(row.backward_s, 2.0 * r + 0.25 * 3);
    EXPECT_EQ(res[r].timed, iters) << "rank " << r << ": the warm-up iterations are not timed";
  }
  // the job's time is the slowest rank's (rank N-1), median over the timed iterations
  EXPECT_DOUBLE_EQ(rep.forward_s, 0.5 + (N - 1) + 0.125 * 3);
  EXPECT_DOUBLE_EQ(rep.backward_s, 2.0 * (N - 1) + 0.25 * 3);
  ASSERT_TRUE(rep.loss.has_value());
  EXPECT_DOUBLE_EQ(*rep.loss, 1.0 + 2.0 + 3.0);  // every rank's part
  EXPECT_TRUE(rep.extras.find("stand_in"));
  for (int r = 1; r < N; ++r) EXPECT_TRUE(res[r].report.ranks.empty()) << "only rank 0 holds the rows";
}

TEST(Harness, CheckPassesOnlyWhenEveryRanksOutputsMatch) {
  for (const int N : {1, 2, 4}) {
    const auto good = run(N, 0, 1);
    for (const Outcome& o : good) {
      ASSERT_TRUE(o.report.check.has_value());
      EXPECT_TRUE(o.report.check->passed);
      EXPECT_EQ(o.exit, 0);
      EXPECT_EQ(o.report.check->error("o"), 0.0);
    }
  }
  // one wrong position on the last rank: every rank exits 1
  const auto bad = run(3, 0, 1, /*wrong_rank=*/2);
  for (const Outcome& o : bad) {
    EXPECT_EQ(o.exit, 1);
    EXPECT_NEAR(o.report.check->error("o"), 0.5 / 9.0, 1e-15);  // |0.5| / max |ref| = 9
  }
  // a whole output whose copy differs on one rank fails too, though rank 0's copy is right
  const auto split = run(3, 0, 1, -1, /*wrong_whole=*/1);
  for (const Outcome& o : split) {
    EXPECT_EQ(o.exit, 1);
    EXPECT_TRUE(std::isinf(o.report.check->error("w")));
  }
}

TEST(Harness, OutputsAndReportAreWrittenFromEveryRanksPositions) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "ringattn-harness-test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string out = (dir / "out").string(), report = (dir / "r.json").string();
  const auto res = run(3, 0, 1, -1, -1, out, report);
  EXPECT_EQ(res[0].exit, 0);
  const io::NpyHeader h = io::read_npy_header(out + "/o.npy");
  const std::vector<double> o = io::read_npy<double>(out + "/o.npy", h);
  ASSERT_EQ(o.size(), std::size_t(kS));
  for (Index p = 0; p < kS; ++p) EXPECT_EQ(o[p], double(p)) << "position " << p;
  std::ifstream f(report);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"stand_in\": true"), std::string::npos);
  EXPECT_NE(text.find("\"fwd_kv_send_elems\": 102"), std::string::npos) << "rank 2's row is in the report";
  for (const auto& e : std::filesystem::directory_iterator(out))
    EXPECT_NE(e.path().filename().string()[0], '.') << "left behind: " << e.path();
  std::filesystem::remove_all(dir);
}
