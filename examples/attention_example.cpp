// Distributed attention from an application's own MPI program, through ringattn/ringattn.hpp.
//   mpirun -np N attention_example
// Every rank builds the whole q, k, v, dout from one seed, keeps its shard (the positions the
// layout gives it), runs the forward and backward with its peers, and checks its own outputs
// against the dense float64 reference over the whole sequence (tolerances: f64 1e-10, f32 3e-4,
// relative to max |ref|). A bad option must raise the same InputError on every rank. Exit 0 when
// every check on every rank passes, 1 otherwise.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "ringattn/ringattn.hpp"

namespace {

using ringattn::Index;

std::vector<double> random_tensor(Index n, std::mt19937_64& gen) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> x(n);
  for (double& v : x) v = u(gen);
  return x;
}

// Rows of this rank's positions from a global [B, S, heads*D] tensor, as T.
template <class T>
std::vector<T> shard(const std::vector<double>& global, Index B, Index S, Index row, std::span<const Index> pos) {
  std::vector<T> out;
  out.reserve(B * pos.size() * row);
  for (Index b = 0; b < B; ++b)
    for (Index p : pos)
      for (Index i = 0; i < row; ++i) out.push_back(static_cast<T>(global[(b * S + p) * row + i]));
  return out;
}

// max |x - ref| / max |ref| over this rank's entries.
template <class A>
double rel_error(const std::vector<A>& x, const std::vector<double>& ref) {
  double err = 0, peak = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::abs(double(x[i]) - ref[i]));
    peak = std::max(peak, std::abs(ref[i]));
  }
  return std::isfinite(err) ? err / std::max(peak, 1e-300) : INFINITY;
}

// One configuration: forward + backward on every rank, each rank's outputs against the reference.
template <class S>
bool run_case(const std::string& name, ringattn::AttentionOptions opt, int rank) {
  using A = S;  // f32 and f64 accumulate in their own type
  opt.dtype = sizeof(S) == 8 ? "f64" : "f32";
  const double tol = sizeof(S) == 8 ? 1e-10 : 3e-4;
  const ringattn::core::Shape& s = opt.shape;
  ringattn::Attention att(ringattn::communicator(MPI_COMM_WORLD), opt);

  // The whole problem, identical on every rank; stored as S so the reference sees what the ranks see.
  std::mt19937_64 gen(1234);
  auto q = random_tensor(s.B * s.S * s.H * s.D, gen), k = random_tensor(s.B * s.S * s.HKV * s.D, gen);
  auto v = random_tensor(s.B * s.S * s.HKV * s.D, gen), dout = random_tensor(s.B * s.S * s.H * s.D, gen);
  for (auto* t : {&q, &k, &v, &dout})
    for (double& x : *t) x = static_cast<double>(static_cast<S>(x));

  const auto pos = att.positions();
  const Index L = att.local_size();
  att.load(shard<S>(q, s.B, s.S, s.H * s.D, pos), shard<S>(k, s.B, s.S, s.HKV * s.D, pos),
           shard<S>(v, s.B, s.S, s.HKV * s.D, pos));
  att.forward();
  att.backward(shard<S>(dout, s.B, s.S, s.H * s.D, pos));
  std::vector<A> o(s.B * L * s.H * s.D), dq(o.size()), dk(s.B * L * s.HKV * s.D), dv(dk.size());
  std::vector<A> lse(s.B * s.H * L);
  att.outputs(ringattn::Outputs<A>{o, lse, dq, dk, dv});

  const ringattn::core::DenseResult ref =
      ringattn::core::reference_attention(s, att.mask(), att.scale(), q, k, v, dout, true);
  // LSE is [B, H, S]: this rank's positions of each (b, h) row.
  std::vector<double> ref_lse;
  for (Index bh = 0; bh < s.B * s.H; ++bh)
    for (Index p : pos) ref_lse.push_back(ref.lse[bh * s.S + p]);
  const double err[] = {rel_error(o, shard<double>(ref.o, s.B, s.S, s.H * s.D, pos)),
                        rel_error(lse, ref_lse),
                        rel_error(dq, shard<double>(ref.dq, s.B, s.S, s.H * s.D, pos)),
                        rel_error(dk, shard<double>(ref.dk, s.B, s.S, s.HKV * s.D, pos)),
                        rel_error(dv, shard<double>(ref.dv, s.B, s.S, s.HKV * s.D, pos))};
  double worst = 0;
  for (double e : err) worst = std::max(worst, std::isnan(e) ? INFINITY : e);
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const ringattn::AttentionReport rep = att.report();
  if (rank == 0)
    std::printf("%-34s N=%d  max rel error %.2e (tol %.0e)  rank 0 sent %lld B  %s\n", name.c_str(), att.ranks(),
                worst, tol, static_cast<long long>(rep.ledger.send_bytes), worst <= tol ? "ok" : "WRONG");
  return worst <= tol;
}

// A bad option on every rank (H not a multiple of HKV) must throw InputError on every rank.
bool bad_option_raises_everywhere(int rank, int N) {
  ringattn::AttentionOptions opt;
  opt.shape = {1, 16, 4, 3, 8};
  int raised = 0;
  std::string msg;
  try {
    ringattn::Attention att(ringattn::communicator(MPI_COMM_WORLD), opt);
  } catch (const ringattn::InputError& e) {
    raised = 1;
    msg = e.what();
  }
  int all = 0;
  MPI_Allreduce(&raised, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  const bool ok = all == N && msg.find("H % HKV == 0") != std::string::npos;
  if (rank == 0) std::printf("%-34s raised on %d of %d ranks: %s  %s\n", "bad option (H=4, HKV=3)", all, N, msg.c_str(),
                             ok ? "ok" : "WRONG");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, N = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &N);
  bool ok = true;
  try {
    ringattn::AttentionOptions causal;  // grouped-query, causal, zigzag shards, odd S
    causal.shape = {2, 37, 4, 2, 16};
    causal.causal = true;
    causal.layout = "zigzag";
    ok &= run_case<double>("causal zigzag GQA B=2 S=37 f64", causal, rank);
    ok &= run_case<float>("causal zigzag GQA B=2 S=37 f32", causal, rank);

    ringattn::AttentionOptions window;  // sliding window over contiguous shards
    window.shape = {1, 40, 2, 1, 8};
    window.window = 6;
    ok &= run_case<double>("window 6 contiguous S=40 f64", window, rank);

    ringattn::AttentionOptions docs;  // packed documents, striped shards, not causal
    docs.shape = {1, 30, 2, 2, 8};
    docs.doc_lens = {11, 0, 19};
    docs.layout = "striped";
    ok &= run_case<float>("documents striped S=30 f32", docs, rank);

    ok &= bad_option_raises_everywhere(rank, N);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    ok = false;
  }
  int bad = ok ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf("%s\n", bad ? "FAILED" : "all checks passed");
  MPI_Finalize();
  return bad ? 1 : 0;
}
