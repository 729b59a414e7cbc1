// Block kernel throughput against the Eigen GEMM rate measured on the same shapes in the same
// run. One core (Eigen is built single-threaded). Flops as FlashAttention counts them:
// forward 4*L*L*D, backward 2.5x that; GEMM 2*M*N*K. Each kernel's yardstick is the same GEMMs
// it does, on the same tiles, without the softmax: BM_GemmForwardTiles and BM_GemmBackwardTiles.
// BM_PairedForward/Backward alternate each kernel with the best GEMM every ~50 ms and report the
// ratio per repetition, which a VM's slow spells hit alike (scripts/bench_kernel.sh prints both).
//
//   build/tests/bench/kernel_bench --benchmark_min_time=2 --benchmark_repetitions=3
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <chrono>
#include <random>

#include "ringattn/core/block_attention.hpp"

using namespace ringattn::core;

namespace {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T>
AlignedVector<T> randn(Index n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d;
  AlignedVector<T> x(n);
  for (T& v : x) v = static_cast<T>(d(gen));
  return x;
}

// GFLOP/s as Google Benchmark reports it: `flops` per iteration over the measured time.
void report_rate(benchmark::State& st, double flops) {
  st.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

// S = Q K^T tile by tile (tq x D times D x tk into one cached tile): the best Eigen GEMM here.
template <class T>
void gemm_tiles(const T* q, const T* k, Index L, Index D, Index TQ, Index TK, T* s) {
  for (Index r0 = 0; r0 < L; r0 += TQ)
    for (Index c0 = 0; c0 < L; c0 += TK) {
      Eigen::Map<const Mat<T>> Q(q + r0 * D, TQ, D), K(k + c0 * D, TK, D);
      Eigen::Map<Mat<T>> S(s, TQ, TK);
      S.noalias() = Q * K.transpose();
      benchmark::DoNotOptimize(s);
    }
}

// The ceiling: Q K^T of one head, L x D times D x L, as one Eigen GEMM.
template <class T>
void BM_GemmQK(benchmark::State& st) {
  const Index L = st.range(0), D = st.range(1);
  auto q = randn<T>(L * D, 1), k = randn<T>(L * D, 2);
  Eigen::Map<const Mat<T>> Q(q.data(), L, D), K(k.data(), L, D);
  Mat<T> S(L, L);
  for (auto _ : st) {
    S.noalias() = Q * K.transpose();
    benchmark::DoNotOptimize(S.data());
  }
  report_rate(st, 2.0 * L * L * D);
}

// The same GEMM cut into the kernel's tiles (tq x D times D x tk into a cached tile).
template <class T>
void BM_GemmTiles(benchmark::State& st) {
  const Index L = st.range(0), D = st.range(1), TQ = st.range(2), TK = st.range(3);
  auto q = randn<T>(L * D, 1), k = randn<T>(L * D, 2);
  AlignedVector<T> s(TQ * TK);
  for (auto _ : st) gemm_tiles(q.data(), k.data(), L, D, TQ, TK, s.data());
  report_rate(st, 2.0 * L * L * D);
}

// The GEMMs of the forward kernel alone, on its tiles: S = Q K^T (tq x D by D x tk) and
// A += S V (tq x tk by tk x D), the softmax left out. 4*L*L*D flops, as the forward counts.
template <class T>
void BM_GemmForwardTiles(benchmark::State& st) {
  const Index L = st.range(0), D = st.range(1), TQ = st.range(2), TK = st.range(3);
  auto q = randn<T>(L * D, 1), k = randn<T>(L * D, 2), v = randn<T>(L * D, 3);
  AlignedVector<T> s(TQ * TK), a(L * D);
  for (auto _ : st) {
    for (Index r0 = 0; r0 < L; r0 += TQ) {
      Eigen::Map<Mat<T>> A(a.data() + r0 * D, TQ, D);
      for (Index c0 = 0; c0 < L; c0 += TK) {
        Eigen::Map<const Mat<T>> Q(q.data() + r0 * D, TQ, D), K(k.data() + c0 * D, TK, D), V(v.data() + c0 * D, TK, D);
        Eigen::Map<Mat<T>> S(s.data(), TQ, TK);
        S.noalias() = Q * K.transpose();
        A.noalias() += S * V;
      }
    }
    benchmark::DoNotOptimize(a.data());
  }
  report_rate(st, 4.0 * L * L * D);
}

// The five GEMMs of the backward kernel alone, in its loop order (K/V tile outer): P = Q K^T,
// dV += P^T dO, dP = dO V^T, dQ += dS K, dK += dS^T Q. 10*L*L*D flops, as the backward counts.
template <class T>
void BM_GemmBackwardTiles(benchmark::State& st) {
  const Index L = st.range(0), D = st.range(1), TQ = st.range(2), TK = st.range(3);
  auto q = randn<T>(L * D, 1), k = randn<T>(L * D, 2), v = randn<T>(L * D, 3), o = randn<T>(L * D, 4);
  AlignedVector<T> p(TQ * TK), ds(TQ * TK), dq(L * D), dk(L * D), dv(L * D);
  for (auto _ : st) {
    for (Index c0 = 0; c0 < L; c0 += TK) {
      Eigen::Map<const Mat<T>> K(k.data() + c0 * D, TK, D), V(v.data() + c0 * D, TK, D);
      Eigen::Map<Mat<T>> dK(dk.data() + c0 * D, TK, D), dV(dv.data() + c0 * D, TK, D);
      for (Index r0 = 0; r0 < L; r0 += TQ) {
        Eigen::Map<const Mat<T>> Q(q.data() + r0 * D, TQ, D), dO(o.data() + r0 * D, TQ, D);
        Eigen::Map<Mat<T>> dQ(dq.data() + r0 * D, TQ, D), P(p.data(), TQ, TK), dS(ds.data(), TQ, TK);
        P.noalias() = Q * K.transpose();
        dV.noalias() += P.transpose() * dO;
        dS.noalias() = dO * V.transpose();
        dQ.noalias() += dS * K;
        dK.noalias() += dS.transpose() * Q;
      }
    }
    benchmark::DoNotOptimize(dk.data());
  }
  report_rate(st, 10.0 * L * L * D);
}

struct Problem {
  Index L, D;
  Packing pq, pk;
  std::vector<Index> pos;
  AlignedVector<float> q, k, v, dout, m, l, lse, acc, delta, dq, dk, dv;
};

Problem make_problem(Index L, Index D) {
  Problem p{L, D, Packing{1, 1, 1, L, D}, Packing{1, 1, 1, L, D}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  p.pos.resize(L);
  for (Index i = 0; i < L; ++i) p.pos[i] = i;
  p.q = randn<float>(L * D, 1);
  p.k = randn<float>(L * D, 2);
  p.v = randn<float>(L * D, 3);
  p.dout = randn<float>(L * D, 4);
  p.m.resize(L);
  p.l.resize(L);
  p.lse.resize(L);
  p.acc.resize(L * D);
  p.delta.resize(L);
  p.dq.resize(L * D);
  p.dk.resize(L * D);
  p.dv.resize(L * D);
  return p;
}

// What the backward starts from: one forward over the problem, its LSE and delta.
GradQueryShard<float> forward_for_backward(Problem& p, Workspace<float>& ws) {
  const QueryShard<float> qs{p.pq, p.pos, p.q.data()};
  OnlineState<float> s{p.m.data(), p.l.data(), p.acc.data()};
  init_online_state(p.pq, s);
  block_forward(qs, KVBlock<float>{p.pk, p.pos, p.k.data(), p.v.data()}, Mask{}, 0.125f, s, ws);
  finalize_forward(p.pq, s, p.lse.data());
  compute_delta(p.pq, p.dout.data(), p.acc.data(), p.delta.data());
  return GradQueryShard<float>{qs, p.dout.data(), p.m.data(), p.l.data(), p.delta.data(), p.dq.data()};
}

void BM_BlockForward(benchmark::State& st) {
  const Index L = st.range(0), D = st.range(1);
  Problem p = make_problem(L, D);
  Workspace<float> ws(Tiling{st.range(2), st.range(3)}, D);
  const QueryShard<float> qs{p.pq, p.pos, p.q.data()};
  const KVBlock<float> kv{p.pk, p.pos, p.k.data(), p.v.data()};
  const Mask none;
  double flops = 0;
  for (auto _ : st) {
    OnlineState<float> s{p.m.data(), p.l.data(), p.acc.data()};
    init_online_state(p.pq, s);
    flops = block_forward(qs, kv, none, 0.125f, s, ws).flops;
    benchmark::DoNotOptimize(p.acc.data());
  }
  report_rate(st, flops);
}

void BM_BlockBackward(benchmark::State& st) {
  const Index L = st.range(0), D = st.range(1);
  Problem p = make_problem(L, D);
  Workspace<float> ws(Tiling{st.range(2), st.range(3)}, D);
  const KVBlock<float> kv{p.pk, p.pos, p.k.data(), p.v.data()};
  const Mask none;
  const GradQueryShard<float> gq = forward_for_backward(p, ws);
  double flops = 0;
  for (auto _ : st) {
    flops = block_backward(gq, kv, none, 0.125f, p.dk.data(), p.dv.data(), ws).flops;
    benchmark::DoNotOptimize(p.dk.data());
  }
  report_rate(st, flops);
}

// Paired: each iteration runs the kernel and then the best Eigen GEMM of this file (the Q K^T
// tiles, gemm_tiles), back to back on the same shapes, each timed on its own. A VM's slow
// phases last seconds, these alternate every ~50 ms, so the ratio of the two rates within one
// repetition is what the kernel makes of the GEMM rate at that moment; repetitions give its spread.
template <bool kBackward>
void BM_PairedWithGemm(benchmark::State& st) {
  using clock = std::chrono::steady_clock;
  const Index L = st.range(0), D = st.range(1), TQ = st.range(2), TK = st.range(3);
  Problem p = make_problem(L, D);
  Workspace<float> ws(Tiling{TQ, TK}, D);
  const QueryShard<float> qs{p.pq, p.pos, p.q.data()};
  const KVBlock<float> kv{p.pk, p.pos, p.k.data(), p.v.data()};
  const Mask none;
  const GradQueryShard<float> gq = forward_for_backward(p, ws);
  OnlineState<float> s{p.m.data(), p.l.data(), p.acc.data()};
  AlignedVector<float> tile(TQ * TK);
  double kernel_s = 0, gemm_s = 0, flops = 0;
  for (auto _ : st) {
    const auto t0 = clock::now();
    if constexpr (kBackward) {
      flops = block_backward(gq, kv, none, 0.125f, p.dk.data(), p.dv.data(), ws).flops;
    } else {
      init_online_state(p.pq, s);
      flops = block_forward(qs, kv, none, 0.125f, s, ws).flops;
    }
    const auto t1 = clock::now();
    gemm_tiles(p.q.data(), p.k.data(), L, D, TQ, TK, tile.data());
    const auto t2 = clock::now();
    kernel_s += std::chrono::duration<double>(t1 - t0).count();
    gemm_s += std::chrono::duration<double>(t2 - t1).count();
  }
  const double n = static_cast<double>(st.iterations()), kernel = n * flops / kernel_s,
               gemm = n * 2.0 * L * L * D / gemm_s;
  st.counters["kernel_GFLOPs"] = kernel * 1e-9;
  st.counters["gemm_GFLOPs"] = gemm * 1e-9;
  st.counters["of_gemm"] = kernel / gemm;
}

}  // namespace

BENCHMARK(BM_GemmQK<float>)->Args({4096, 64})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmTiles<float>)->Args({4096, 64, 128, 256})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmForwardTiles<float>)->Args({4096, 64, 128, 256})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmBackwardTiles<float>)->Args({4096, 64, 128, 256})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BlockForward)
    ->Args({4096, 64, 128, 256})
    ->Args({4096, 64, 64, 256})
    ->Args({4096, 64, 128, 512})
    ->Args({4096, 64, 256, 256})
    ->Args({4096, 64, 64, 512})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BlockBackward)
    ->Args({4096, 64, 128, 256})
    ->Args({4096, 64, 64, 256})
    ->Args({4096, 64, 128, 512})
    ->Args({4096, 64, 256, 128})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PairedWithGemm<false>)->Name("BM_PairedForward")->Args({4096, 64, 128, 256})->Args({8192, 64, 128, 256})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PairedWithGemm<true>)->Name("BM_PairedBackward")->Args({4096, 64, 128, 256})->Args({8192, 64, 128, 256})->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
