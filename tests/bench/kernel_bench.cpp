// The block kernels against the FMA peak of this core, measured in the same run, on each SIMD target.
//
//   kernel_bench [--targets default|all|NAME,...] [--seqs 4096,8192] [--heads 8] [--head-dims 64,128]
//                [--dtypes f32,f64,bf16] [--reps 5] [--causal] [--tile-q N] [--tile-k N] [--chunk N]
//                [--forward-only] [--best] [--pieces] [--softcap C] [--precision f32|bf16]
//
// One core. The targets: the one the kernels use by default (the best this CPU runs, or the one
// RINGATTN_SIMD names), every one this CPU runs (all), or those named. For each target, each shape
// and each pass, `reps` repetitions; each repetition measures the FMA peak (12 independent chains of
// fused multiply-adds for 0.2 s, the best 2 ms window's rate) right before the kernel, and the
// ratio is taken per repetition. The table shows medians; "best" is the best repetition's rate
// over the best peak (--best: every column from the best repetition, for tuning); "% sust" is the
// kernel's rate over the rate the same chains sustain for as long as the kernel ran, right after
// it: on a shared machine the other tenants slow both (the best window sees none of them), on an
// idle core the two peaks agree. The kernel
// computes one rank's queries against one block as `ringattn run --seq S` does at N=1: S queries x
// S keys x H heads (HKV = H), unmasked unless --causal. Flops as FlashAttention counts them: forward
// 4 S^2 H D, backward 2.5x that (halved work under --causal).
// bf16 stores Q, K, V, dO in bf16 and computes in f32: its score products run on AMX tiles or a
// bf16 dot-product instruction when the kernels use them (the dtype column says bf16+AMX,
// bf16+VDPBF16PS or bf16+BFDOT; RINGATTN_AMX=0 and RINGATTN_BF16DOT=0 turn them off), and its
// rates are set against the f32 FMA peak; on a dot-product instruction also against that
// instruction's peak, measured before each pass of each repetition (the last two columns, "f dot"
// and "b dot"). --precision bf16 (needs bf16 among --dtypes; the other dtypes stay f32) rounds
// bf16's P and dS to bf16 before their products (core::Precision::bf16), which then run there
// too: the dtype column says bf16r (bf16r+AMX, bf16r+VDPBF16PS).
// --pieces prints instead the passes of one forward piece undisturbed (see print_pieces).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "ringattn/core/block_attention.hpp"
#include "ringattn/core/median.hpp"
#include "ringattn/core/simd.hpp"

using namespace ringattn::core;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

template <class T>
AlignedVector<T> randn(Index n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d;
  AlignedVector<T> x(n);
  for (T& v : x) v = value_cast<T>(d(gen));
  return x;
}

bool g_best = false;
double g_softcap = 0;  // --softcap C: the kernels soft-cap the scores (0: none)
Precision g_precision = Precision::f32;  // --precision: P and dS as they enter their products

struct Rates {
  double fwd = 0, bwd = 0, fwd_peak = 0, bwd_peak = 0, fwd_ratio = 0, bwd_ratio = 0;
  double fwd_best = 0, bwd_best = 0;  // the best repetition's rate over the best peak
  double fwd_sust = 0, bwd_sust = 0;  // the ratio to the rate the FMA chains sustain right after
  double fwd_dot = 0, bwd_dot = 0;    // bf16 on a dot-product instruction: the ratio to its peak
};

// Whether bf16's products run on a dot-product instruction now (whose peak the rates then face too).
bool bf16_on_dot() {
  const std::string k = simd::kernels(DType::bf16);
  return k.find("+VDPBF16PS") != std::string::npos || k.find("+BFDOT") != std::string::npos;
}

template <class S_>
Rates measure(Index S, Index H, Index D, bool causal, int reps, const Tiling& tiling, bool forward_only) {
  using T = accum_t<S_>;
  const Packing pq{1, H, 1, S, D}, pk{1, H, 1, S, D};
  std::vector<Index> pos(S);
  for (Index i = 0; i < S; ++i) pos[i] = i;
  const auto q = randn<S_>(pq.q_elems(), 1), k = randn<S_>(pk.kv_elems(), 2), v = randn<S_>(pk.kv_elems(), 3),
             dout = randn<S_>(pq.q_elems(), 4);
  AlignedVector<T> m(pq.row_elems()), l(pq.row_elems()), lse(pq.row_elems()), acc(pq.q_elems()),
      delta(pq.row_elems()), dq(pq.q_elems()), dk(pk.kv_elems()), dv(pk.kv_elems());
  const Mask mask = causal ? Mask::make(S, true, 0, {}) : Mask::none();
  Workspace<T> ws(resolve_tiling(tiling, D, S, 1), D, std::is_same_v<S_, bf16> ? g_precision : Precision::f32);
  const QueryShard<S_> qs{pq, pos, q.data()};
  const KVBlock<S_> kv{pk, pos, k.data(), v.data()};
  const T scale = T(1.0 / std::sqrt(double(D)));
  const DType dt = sizeof(T) == 8 ? DType::f64 : DType::f32;
  std::vector<double> fr, br, fp, bp, fq, bq, fs, bs, fd, bd;
  const bool dot = std::is_same_v<S_, bf16> && bf16_on_dot();
  for (int r = 0; r < reps; ++r) {
    const double dot_f = dot ? simd::bf16_dot_peak(0.2) : 0;
    const double peak_f = simd::fma_peak(dt, 0.2);
    OnlineState<T> st{m.data(), l.data(), acc.data()};
    init_online_state(pq, st);
    double t0 = now();
    const Work wf = block_forward(qs, kv, mask, scale, st, ws, {}, T(g_softcap));
    const double tf = now() - t0;
    const double sust_f = simd::fma_sustained(dt, tf);
    finalize_forward(pq, st, lse.data());
    compute_delta(pq, dout.data(), acc.data(), delta.data());
    std::fill(dq.begin(), dq.end(), T(0));
    std::fill(dk.begin(), dk.end(), T(0));
    std::fill(dv.begin(), dv.end(), T(0));
    fr.push_back(wf.flops / tf);
    fp.push_back(peak_f);
    fq.push_back(wf.flops / tf / peak_f);
    fs.push_back(wf.flops / tf / sust_f);
    if (dot) fd.push_back(wf.flops / tf / dot_f);
    if (forward_only) continue;
    const double dot_b = dot ? simd::bf16_dot_peak(0.2) : 0;
    const double peak_b = simd::fma_peak(dt, 0.2);
    t0 = now();
    const Work wb = block_backward(GradQueryShard<S_>{qs, dout.data(), m.data(), l.data(), delta.data(), dq.data()}, kv,
                                   mask, scale, dk.data(), dv.data(), ws, {}, T(g_softcap));
    const double tb = now() - t0;
    const double sust_b = simd::fma_sustained(dt, tb);
    br.push_back(wb.flops / tb);
    bp.push_back(peak_b);
    bq.push_back(wb.flops / tb / peak_b);
    bs.push_back(wb.flops / tb / sust_b);
    if (dot) bd.push_back(wb.flops / tb / dot_b);
  }
  // Noise from other tenants only slows a repetition, the kernel and the peak alike, so the best
  // repetition's kernel rate over the best peak is what the kernel does undisturbed (the best of the
  // per-repetition ratios would pick a repetition whose peak was slowed); the median is typical.
  auto best = [](const std::vector<double>& x) { return x.empty() ? 0.0 : *std::max_element(x.begin(), x.end()); };
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  const double fwd_best = ratio(best(fr), best(fp)), bwd_best = ratio(best(br), best(bp));
  auto med = [](const std::vector<double>& x) { return x.empty() ? 0.0 : median(x); };
  if (g_best)
    return {best(fr), best(br), best(fp), best(bp), fwd_best, bwd_best, fwd_best, bwd_best, best(fs), best(bs),
            best(fd), best(bd)};
  return {median(fr), median(br), median(fp), median(bp), median(fq), median(bq), fwd_best, bwd_best, median(fs),
          median(bs), med(fd), med(bd)};
}

// Runs the kernels on target t; false (the reason printed) when this build or CPU has no such target.
bool select_target(const std::string& t) {
  try {
    simd::select(t);
    return true;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kernel_bench: error: {}\n", e.what());
    return false;
  }
}

// --pieces: the same passes undisturbed, one forward piece of the default tiles on warm operands,
// each pass the best of 3000, against the better of the peaks measured just before and after. On a
// shared machine the whole-run table moves with the other tenants from run to run; this one shows
// what the kernels themselves reach, and where the forward's time goes. Its last column, the median
// piece, is what they typically reach on the machine as it is: on the same operands, the gap between
// it and the best piece comes from what else runs on the machine.
// bf16 (where the dot-product instruction is available, AMX or not): the same piece's two products
// on it, over its own peak measured just before and after; exp is f32's exponentials over the two
// products' time at that peak, piece the three together (the rounding of P is not counted).
void print_bf16_piece(Index D) {
  const simd::Bf16ProductTimes b = simd::bf16_product_times(D, 3000);
  if (b.peak <= 0) {
    fmt::print("# bf16, D={}: no bf16 dot-product instruction here (its products on AMX are not timed apart)\n", D);
    return;
  }
  const simd::PieceTimes p = simd::piece_times(DType::f32, D, 3000);
  const double at_peak = b.product_flops / b.peak;
  // the instruction timed, whichever engine the kernels use now (AMX where the CPU has both)
#if defined(__aarch64__)
  const std::string dtype = "bf16+BFDOT";
#else
  const std::string dtype = "bf16+VDPBF16PS";
#endif
  fmt::print("{:<8} {:>5} {:>4}  {:>8.1f} {:>6.1f}% {:>6.1f}% {:>5.1f}% {:>6.1f}% {:>6} {:>7}\n", simd::current(), dtype,
             D, b.peak * 1e-9, 100 * at_peak / b.score, 100 * at_peak / b.accumulate, 100 * p.exp / (2 * at_peak),
             100 * 2 * at_peak / (b.score + p.exp + b.accumulate), "-", "-");
  std::fflush(stdout);
}

int print_pieces(const std::vector<std::string>& targets, const std::vector<std::string>& dtypes,
                 const std::vector<std::string>& dims) {
  for (const std::string& t : targets)
    if (!select_target(t)) return 2;
  fmt::print("# one forward piece of the default tiles on warm operands, each pass the best of 3000, over the FMA "
             "peak (the better of two, just before and just after);\n"
             "# exp: the exponentials' time over the two products' at the peak; start: the K/V tile's (K transposed, "
             "V copied), which a chunk's query tiles share, over the same;\n"
             "# median: the median of the 3000 pieces (three passes together) over the peak, what a whole run "
             "follows on this machine as it is;\n"
             "# bf16: its two products on the bf16 dot-product instruction over that instruction's peak, exp f32's "
             "over them at that peak\n");
  fmt::print("{:<8} {:>5} {:>4}  {:>8} {:>7} {:>7} {:>6} {:>7} {:>6} {:>7}\n", "target", "dtype", "D", "peak", "score",
             "accum", "exp", "piece", "start", "median");
  for (const std::string& t : targets) {
    simd::select(t);
    for (const std::string& dt : dtypes)
      for (const std::string& d : dims) {
        if (dt == "bf16") {
          print_bf16_piece(std::stoll(d));
          continue;
        }
        const DType type = dt == "f64" ? DType::f64 : DType::f32;
        const double before = simd::fma_peak(type, 0.2);
        const simd::PieceTimes p = simd::piece_times(type, std::stoll(d), 3000);
        const double peak = std::max(before, simd::fma_peak(type, 0.2));
        const double at_peak = p.product_flops / peak;  // one product's time at the peak
        fmt::print("{:<8} {:>5} {:>4}  {:>8.1f} {:>6.1f}% {:>6.1f}% {:>5.1f}% {:>6.1f}% {:>5.1f}% {:>6.1f}%\n",
                   simd::current(), dt, d, peak * 1e-9, 100 * at_peak / p.score, 100 * at_peak / p.accumulate,
                   100 * p.exp / (2 * at_peak), 100 * 2 * at_peak / (p.score + p.exp + p.accumulate),
                   100 * p.tile_start / (2 * at_peak), 100 * 2 * at_peak / p.piece_median);
        std::fflush(stdout);
      }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string targets = "default", seqs = "4096,8192", dims = "64,128", dtypes = "f32,f64";
  Index H = 8;
  int reps = 5;
  std::string precision = "f32";
  bool causal = false, forward_only = false, pieces = false;
  Tiling tiling;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        fmt::print(stderr, "kernel_bench: error: {} needs a value\n", a);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--targets") targets = value();
    else if (a == "--seqs") seqs = value();
    else if (a == "--heads") H = std::stoll(value());
    else if (a == "--head-dims") dims = value();
    else if (a == "--dtypes") dtypes = value();
    else if (a == "--reps") reps = std::stoi(value());
    else if (a == "--causal") causal = true;
    else if (a == "--forward-only") forward_only = true;
    else if (a == "--best") g_best = true;
    else if (a == "--pieces") pieces = true;
    else if (a == "--softcap") g_softcap = std::stod(value());
    else if (a == "--precision") precision = value();
    else if (a == "--tile-q") tiling.q_rows = std::stoll(value());
    else if (a == "--tile-k") tiling.k_cols = std::stoll(value());
    else if (a == "--chunk") tiling.chunk_rows = std::stoll(value());
    else {
      fmt::print(stderr, "kernel_bench: error: unknown option {}\n", a);
      return 2;
    }
  }
  if (precision != "f32" && precision != "bf16") {
    fmt::print(stderr, "kernel_bench: error: --precision {}: expected f32 or bf16\n", precision);
    return 2;
  }
  if (precision == "bf16") {  // the bf16 rows round; the others keep f32 (the plan refuses it for them)
    const std::vector<std::string> types = split(dtypes);
    if (std::find(types.begin(), types.end(), "bf16") == types.end()) {
      fmt::print(stderr, "kernel_bench: error: --precision bf16 rounds bf16 storage only; --dtypes {} has no bf16\n",
                 dtypes);
      return 2;
    }
    g_precision = Precision::bf16;
  }
  std::vector<std::string> run;
  const std::vector<std::string> available = simd::available();
  try {
    simd::select_from_environment();  // RINGATTN_SIMD: the default target is the one it names
  } catch (const std::exception& e) {
    fmt::print(stderr, "kernel_bench: error: {}\n", e.what());
    return 2;
  }
  if (targets == "all") run = available;
  else if (targets == "default") run = {simd::current()};
  else run = split(targets);
  if (pieces) return print_pieces(run, split(dtypes), split(dims));
  fmt::print("# one core; FMA peak measured before every repetition; medians of {} repetitions{}{}\n", reps,
             causal ? "; causal" : "", g_softcap > 0 ? fmt::format("; softcap {:g}", g_softcap) : "");
  fmt::print("{:<8} {:>15} {:>6} {:>4} {:>4}  {:>9} {:>8} {:>7} {:>6} {:>6}  {:>9} {:>8} {:>7} {:>6} {:>6}  {:>6} {:>6}\n",
             "target", "dtype", "S", "H", "D", "fwd GF/s", "peak", "% peak", "best", "% sust", "bwd GF/s", "peak",
             "% peak", "best", "% sust", "f dot", "b dot");
  for (const std::string& t : run) {
    if (!select_target(t)) return 2;
    for (const std::string& dt : split(dtypes))
      for (const std::string& s : split(seqs))
        for (const std::string& d : split(dims)) {
          const Index S = std::stoll(s), D = std::stoll(d);
          const Rates r = dt == "f64"    ? measure<double>(S, H, D, causal, reps, tiling, forward_only)
                          : dt == "bf16" ? measure<bf16>(S, H, D, causal, reps, tiling, forward_only)
                                         : measure<float>(S, H, D, causal, reps, tiling, forward_only);
          std::string label;  // bf16: r when P and dS are rounded, +AMX when the products run on tiles
          if (dt == "bf16") {
            if (g_precision == Precision::bf16) label = "r";
            label += simd::kernels(DType::bf16).substr(simd::current().size());
          }
          auto dot_pct = [](double x) { return x > 0 ? fmt::format("{:.1f}%", 100 * x) : std::string("-"); };
          fmt::print("{:<8} {:>15} {:>6} {:>4} {:>4}  {:>9.1f} {:>8.1f} {:>6.1f}% {:>5.1f}% {:>5.1f}%  {:>9.1f} {:>8.1f} "
                     "{:>6.1f}% {:>5.1f}% {:>5.1f}%  {:>6} {:>6}\n",
                     simd::current(), dt + label, S, H, D, r.fwd * 1e-9, r.fwd_peak * 1e-9, 100 * r.fwd_ratio,
                     100 * r.fwd_best, 100 * r.fwd_sust, r.bwd * 1e-9, r.bwd_peak * 1e-9, 100 * r.bwd_ratio,
                     100 * r.bwd_best, 100 * r.bwd_sust, dot_pct(r.fwd_dot), dot_pct(r.bwd_dot));
          std::fflush(stdout);
        }
  }
  return 0;
} catch (const std::invalid_argument&) {
  fmt::print(stderr, "kernel_bench: error: an option's value is not a number\n");
  return 2;
} catch (const std::out_of_range&) {
  fmt::print(stderr, "kernel_bench: error: an option's value is out of range\n");
  return 2;
}
