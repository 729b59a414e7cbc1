#include "ringattn/core/block_attention.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "tile_kernels_avx512.hpp"

namespace ringattn::core {
namespace {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MMap = Eigen::Map<Mat<T>>;
template <class T>
using CMap = Eigen::Map<const Mat<T>>;
template <class T>
using Vec = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;

template <class T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// The softmax base. float, the fast path, works in base 2 as FlashAttention does: log2(e) is
// folded into the GEMM's alpha, so each score costs one exp2 (an FMA polynomial and a scalef,
// ~1 ulp). double keeps the natural base and Eigen's exp for full accuracy.
// Internal row statistics (running max m, and LSE during the backward) are in base units;
// finalize_forward writes the LSE in the natural log.
template <class T>
struct Base;

#if defined(__AVX512F__)
// 2^x for x <= 0 (-inf gives 0): 2^x = 2^n 2^f, n = round(x), f in [-1/2, 1/2], 2^f by its
// degree-7 Taylor polynomial in f ln 2 (error < 2e-9, below float rounding).
inline __m512 exp2_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-200.f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5252733804059840e-5f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381610e-4f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}
#endif

template <>
struct Base<float> {
  static constexpr float kLog = 1.4426950408889634f;      // scores times log2(e)
  static constexpr float kToNatural = 0.6931471805599453f;  // log2 -> ln
  static float pow(float x) { return std::exp2(x); }
  static float log(float x) { return std::log2(x); }
  // x[j] = 2^(x[j] - m) in place; returns the sum.
  static float exp_sum(float* x, Index n, float m) {
#if defined(__AVX512F__)
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    Index j = 0;
    for (; j + 16 <= n; j += 16) {
      const __m512 e = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm));
      _mm512_storeu_ps(x + j, e);
      acc = _mm512_add_ps(acc, e);
    }
    if (j < n) {
      const __mmask16 k = static_cast<__mmask16>((1u << (n - j)) - 1);
      const __m512 e = exp2_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), vm));
      _mm512_mask_storeu_ps(x + j, k, e);
      acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, e));
    }
    alignas(64) float lanes[16];  // (GCC 12 warns falsely inside _mm512_reduce_add_ps)
    _mm512_store_ps(lanes, acc);
    float sum = 0;
    for (float v : lanes) sum += v;
    return sum;
#else
    Eigen::Map<Eigen::ArrayXf> row(x, n);
    row = ((row - m) * kToNatural).exp();
    return row.sum();
#endif
  }
};

template <>
struct Base<double> {
  static constexpr double kLog = 1.0;
  static constexpr double kToNatural = 1.0;
  static double pow(double x) { return std::exp(x); }
  static double log(double x) { return std::log(x); }
  static double exp_sum(double* x, Index n, double m) {
    Eigen::Map<Eigen::ArrayXd> row(x, n);
    row = (row - m).exp();
    return row.sum();
  }
};

// Tile geometry: query rows [r0, r0+tq) of one head group, keys [c0, c0+tk) of one block.
struct Tile {
  Index r0, tq, c0, tk;
};

// Class of a tile from the global positions of its first and last rows and keys.
inline TileClass classify_tile(const Mask& mask, std::span<const Index> qpos, Index G, std::span<const Index> kpos,
                               const Tile& t) {
  if (mask.is_full()) return TileClass::full;
  return mask.classify(qpos[t.r0 / G], qpos[(t.r0 + t.tq - 1) / G], kpos[t.c0], kpos[t.c0 + t.tk - 1]);
}

// Calls fn(piece, class) for the parts of tile t that hold visible pairs. A full tile is one
// piece. A partial tile is cut into strips of `strip` rows; each strip's keys are trimmed from
// both ends while no row of the strip can see them, and the strip is then classified again. On
// a causal diagonal this computes a staircase instead of the whole square: with m strips per
// tile, (m+1)/2m of it instead of all. Positions increase along rows and keys, so a key that
// classify() calls empty for the strip's first..last positions is seen by none of its rows.
template <class Fn>
void for_each_piece(const Mask& mask, std::span<const Index> qpos, Index G, std::span<const Index> kpos, const Tile& t,
                    TileClass cls, Index strip, Fn&& fn) {
  if (cls != TileClass::partial) {
    fn(t, cls);
    return;
  }
  const Index step = strip > 0 ? strip : t.tq;
  for (Index r0 = t.r0; r0 < t.r0 + t.tq; r0 += step) {
    const Index tq = std::min(step, t.r0 + t.tq - r0);
    const Index qmin = qpos[r0 / G], qmax = qpos[(r0 + tq - 1) / G];
    Index a = t.c0, b = t.c0 + t.tk;
    while (a < b && mask.classify(qmin, qmax, kpos[a], kpos[a]) == TileClass::empty) ++a;
    while (b > a && mask.classify(qmin, qmax, kpos[b - 1], kpos[b - 1]) == TileClass::empty) --b;
    if (a == b) continue;
    const Tile piece{r0, tq, a, b - a};
    const TileClass c = classify_tile(mask, qpos, G, kpos, piece);
    if (c != TileClass::empty) fn(piece, c);
  }
}

// Set the scores of invisible pairs to -inf (partial tiles only).
template <class T>
void apply_mask(MMap<T>& s, const Mask& mask, std::span<const Index> qpos, Index G, std::span<const Index> kpos,
                const Tile& t) {
  for (Index i = 0; i < t.tq; ++i) {
    const Index qi = qpos[(t.r0 + i) / G];
    T* row = s.row(i).data();
    for (Index j = 0; j < t.tk; ++j)
      if (!mask.visible(qi, kpos[t.c0 + j])) row[j] = kNegInf<T>;
  }
}

}  // namespace

template <class T>
void init_online_state(const Packing& pk, OnlineState<T> st) {
  std::fill_n(st.m, pk.row_elems(), kNegInf<T>);
  std::fill_n(st.l, pk.row_elems(), T(0));
  std::fill_n(st.acc, pk.q_elems(), T(0));
}

bool block_visible(const Mask& mask, std::span<const Index> qpos, std::span<const Index> kpos) {
  if (qpos.empty() || kpos.empty()) return false;
  if (mask.is_full()) return true;
  return mask.classify(qpos.front(), qpos.back(), kpos.front(), kpos.back()) != TileClass::empty;
}

// Whether the kernels run on the AVX-512 tile products (f32, D a multiple of 16, a Workspace
// with room for a transposed K and V tile) rather than Eigen's GEMM.
template <class T>
bool packed_kernels(const Workspace<T>& ws, Index D) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>)
    return D % 16 == 0 && static_cast<Index>(ws.kt.size()) >= 2 * ws.tiling.k_cols * D;
#endif
  (void)ws, (void)D;
  return false;
}

// Rows of a chunk, whole query tiles: Tiling::chunk_rows, or by default as many as keep the
// `arrays` row operands [R, D] (Q and O; Q, dO and dQ) near 1 MiB, half of this machine's L2,
// next to the K and V tiles.
inline Index chunk_rows(const Tiling& t, Index D, int arrays, std::size_t elem) {
  constexpr std::size_t kBytes = std::size_t(1) << 20;
  const std::size_t row_bytes = std::size_t(arrays) * std::size_t(std::max<Index>(D, 1)) * elem;
  const Index want = t.chunk_rows > 0 ? t.chunk_rows : static_cast<Index>(kBytes / row_bytes);
  return std::max<Index>(1, (want + t.q_rows - 1) / t.q_rows) * t.q_rows;
}

// Calls fn(tile, class, first) for every tile with a visible pair, in the kernels' order: query
// rows in chunks of R that stay in L2; in a chunk, K/V tiles outer and query tiles inner, so each
// row meets the keys in increasing order. `first` marks the first tile of a K/V tile in a chunk,
// where the kernels transpose it.
template <class Fn>
void for_each_tile(const Mask& mask, std::span<const Index> qpos, Index G, std::span<const Index> kpos, Index rows,
                   Index Lk, const Tiling& tiling, Index R, Fn&& fn) {
  const Index TQ = tiling.q_rows, TK = tiling.k_cols;
  for (Index q0 = 0; q0 < rows; q0 += R) {
    const Index q1 = std::min(rows, q0 + R);
    for (Index c0 = 0; c0 < Lk; c0 += TK) {
      bool first = true;
      for (Index r0 = q0; r0 < q1; r0 += TQ) {
        const Tile tile{r0, std::min(TQ, rows - r0), c0, std::min(TK, Lk - c0)};
        const TileClass cls = classify_tile(mask, qpos, G, kpos, tile);
        if (cls == TileClass::empty) continue;
        fn(tile, cls, first);
        first = false;
      }
    }
  }
}

template <class T>
Work block_forward(const QueryShard<T>& q, const KVBlock<T>& kv, const Mask& mask, accum_t<T> scale,
                   OnlineState<accum_t<T>> st, Workspace<accum_t<T>>& ws, Progress progress) {
  // B, HKV, G, D shared; Lq rows*G on the query side, Lk keys on the block side.
  const Index G = q.pk.G, D = q.pk.D, rows = q.pk.L * G, Lk = kv.pk.L;
  Work work;
  if (!block_visible(mask, q.pos, kv.pos)) return work;
  [[maybe_unused]] const Index TK = ws.tiling.k_cols;  // the transposed tiles' row stride
  const T alpha = scale * Base<T>::kLog;
  const bool packed = packed_kernels(ws, D);
  const Index R = chunk_rows(ws.tiling, D, 2, sizeof(T));
  for (Index b = 0; b < q.pk.B; ++b) {
    for (Index g = 0; g < q.pk.HKV; ++g) {
      const T* qg = q.q + q.pk.q_group(b, g);
      const T* kg = kv.k + kv.pk.kv_group(b, g);
      const T* vg = kv.v + kv.pk.kv_group(b, g);
      T* mg = st.m + q.pk.row_group(b, g);
      T* lg = st.l + q.pk.row_group(b, g);
      T* ag = st.acc + q.pk.q_group(b, g);
      for_each_tile(mask, q.pos, G, kv.pos, rows, Lk, ws.tiling, R,
                    [&](const Tile& tile, TileClass tile_cls, [[maybe_unused]] bool first) {
        const Index r0 = tile.r0, c0 = tile.c0;
#if defined(__AVX512F__)
        if constexpr (std::is_same_v<T, float>) {
          if (packed && first) avx512::transpose_keys(kg + c0 * D, tile.tk, D, ws.kt.data(), TK);
        }
#endif
        Vec<T> m(mg + r0, tile.tq), l(lg + r0, tile.tq), c(ws.rowbuf.data(), tile.tq);
        for_each_piece(mask, q.pos, G, kv.pos, tile, tile_cls, ws.tiling.strip_rows, [&](const Tile& t, TileClass cls) {
          const Index i0 = t.r0 - r0, n = t.tq;  // the piece's rows within the query tile
          const T* Qp = qg + t.r0 * D;
          const T* Vp = vg + t.c0 * D;
          T* Ap = ag + t.r0 * D;
          MMap<T> S(ws.s.data(), n, t.tk);
          T* rmax = ws.rowmax.data();
          // pass 1: scores S = scale Q K^T (in base units), invisible pairs -inf; row maxima
          bool have_max = false;
#if defined(__AVX512F__)
          if constexpr (std::is_same_v<T, float>) {
            if (packed) {
              avx512::scores(Qp, n, D, ws.kt.data() + (t.c0 - c0), TK, t.tk, alpha, S.data(), t.tk, rmax);
              have_max = cls != TileClass::partial;
            }
          }
#endif
          if (!packed) S.noalias() = alpha * (CMap<T>(Qp, n, D) * CMap<T>(kg + t.c0 * D, t.tk, D).transpose());
          if (cls == TileClass::partial) apply_mask(S, mask, q.pos, G, kv.pos, t);
          if (!have_max)
            for (Index i = 0; i < n; ++i) rmax[i] = S.row(i).maxCoeff();
          // pass 2: running max, rescale factor c = e^(m - m'), P = e^(S - m'), exp-sum
          auto cp = c.segment(i0, n);
          for (Index i = 0; i < n; ++i) {
            T& mi = m[i0 + i];
            const T m_new = std::max(mi, rmax[i]);
            if (m_new == kNegInf<T>) {  // nothing visible yet: keep P = 0, state untouched
              S.row(i).setZero();
              cp[i] = T(1);
              continue;
            }
            const T row_sum = Base<T>::exp_sum(S.row(i).data(), t.tk, m_new);
            cp[i] = Base<T>::pow(mi - m_new);  // e^(-inf) = 0 on the first visible block
            l[i0 + i] = cp[i] * l[i0 + i] + row_sum;
            mi = m_new;
          }
          // pass 3: a' = c a + P V (once the running max settles, c = 1 and the rescale is skipped)
#if defined(__AVX512F__)
          if constexpr (std::is_same_v<T, float>) {
            if (packed) avx512::accumulate(S.data(), n, t.tk, Vp, D, t.tk, cp.data(), Ap);
          }
#endif
          if (!packed) {
            MMap<T> A(Ap, n, D);
            if ((cp != T(1)).any()) A.array().colwise() *= cp.array();
            A.noalias() += S * CMap<T>(Vp, t.tk, D);
          }
          work.flops += 4.0 * double(n) * double(t.tk) * double(D);
        });
        ++work.tile_pairs;
        progress();
      });
    }
  }
  return work;
}

template <class T>
void finalize_forward(const Packing& pk, OnlineState<T> st, T* lse) {
  const Index rows = pk.row_elems(), D = pk.D;
  for (Index r = 0; r < rows; ++r) {
    T* a = st.acc + r * D;
    if (st.l[r] == T(0)) {  // no visible key: O = 0, LSE = -inf, never NaN
      std::fill_n(a, D, T(0));
      st.m[r] = kNegInf<T>;
      lse[r] = kNegInf<T>;
      continue;
    }
    const T inv = T(1) / st.l[r];
    for (Index d = 0; d < D; ++d) a[d] *= inv;
    lse[r] = (st.m[r] + Base<T>::log(st.l[r])) * Base<T>::kToNatural;
  }
}

template <class T>
void compute_delta(const Packing& pk, const T* dout, const accum_t<T>* o, accum_t<T>* delta) {
  const Index rows = pk.row_elems(), D = pk.D;
  CMap<T> dO(dout, rows, D), O(o, rows, D);
  Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>>(delta, rows) = (dO.array() * O.array()).rowwise().sum();
}

template <class T>
Work block_backward(const GradQueryShard<T>& gq, const KVBlock<T>& kv, const Mask& mask, accum_t<T> scale,
                    accum_t<T>* dk, accum_t<T>* dv, Workspace<accum_t<T>>& ws, Progress progress) {
  const QueryShard<T>& q = gq.q;
  const Index G = q.pk.G, D = q.pk.D, rows = q.pk.L * G, Lk = kv.pk.L;
  Work work;
  if (!block_visible(mask, q.pos, kv.pos)) return work;
  [[maybe_unused]] const Index TK = ws.tiling.k_cols;  // the transposed tiles' row stride
  const T alpha = scale * Base<T>::kLog;
  const bool packed = packed_kernels(ws, D);
  const Index R = chunk_rows(ws.tiling, D, 3, sizeof(T));
  for (Index b = 0; b < q.pk.B; ++b) {
    for (Index g = 0; g < q.pk.HKV; ++g) {
      const Index qo = q.pk.q_group(b, g), ro = q.pk.row_group(b, g), ko = kv.pk.kv_group(b, g);
      // in the forward pass this was: row chunks, K/V tile outer, so now: dK/dV tiles stay in
      // cache while the chunk's query tiles stream past; dQ rows are revisited once per K/V tile.
      for_each_tile(mask, q.pos, G, kv.pos, rows, Lk, ws.tiling, R,
                    [&](const Tile& tile, TileClass tile_cls, [[maybe_unused]] bool first) {
        const Index c0 = tile.c0, tk = tile.tk;
        CMap<T> Kt(kv.k + ko + c0 * D, tk, D), Vt(kv.v + ko + c0 * D, tk, D);
        MMap<T> dKt(dk + ko + c0 * D, tk, D), dVt(dv + ko + c0 * D, tk, D);
#if defined(__AVX512F__)
        if constexpr (std::is_same_v<T, float>) {
          if (packed && first) {
            avx512::transpose_keys(Kt.data(), tk, D, ws.kt.data(), TK);
            avx512::transpose_keys(Vt.data(), tk, D, ws.kt.data() + TK * D, TK);
          }
        }
#endif
        for_each_piece(mask, q.pos, G, kv.pos, tile, tile_cls, ws.tiling.strip_rows, [&](const Tile& t, TileClass cls) {
          const Index n = t.tq, kc = t.tk, k0 = t.c0 - c0;  // the piece within the K/V tile
          CMap<T> Qp(q.q + qo + t.r0 * D, n, D), dOp(gq.dout + qo + t.r0 * D, n, D);
          CMap<T> Kp(Kt.data() + k0 * D, kc, D), Vp(Vt.data() + k0 * D, kc, D);
          MMap<T> dQp(gq.dq + qo + t.r0 * D, n, D);
          MMap<T> dKp(dKt.data() + k0 * D, kc, D), dVp(dVt.data() + k0 * D, kc, D);
          const T* mrow = gq.m + ro + t.r0;
          const T* lrow = gq.l + ro + t.r0;
          const T* delta = gq.delta + ro + t.r0;
          MMap<T> P(ws.s.data(), n, kc), dS(ws.p.data(), n, kc);
          // pass 1: recompute P = exp(scale Q K^T - LSE) from the row LSE; invisible pairs 0
#if defined(__AVX512F__)
          if constexpr (std::is_same_v<T, float>) {
            if (packed) avx512::scores(Qp.data(), n, D, ws.kt.data() + k0, TK, kc, alpha, P.data(), kc,
                                       ws.rowmax.data());
          }
#endif
          if (!packed) P.noalias() = alpha * (Qp * Kp.transpose());
          if (cls == TileClass::partial) apply_mask(P, mask, q.pos, G, kv.pos, t);
          // P = e^(S - m) / l with the forward's own max m (a value of S itself, recomputed bit for
          // bit here) and sum l kept apart: S - m <= 0 exactly, so P <= 1 however large the logits,
          // where e^(S - LSE) with S and LSE rounded separately can exceed 1 and lose digits.
          for (Index i = 0; i < n; ++i) {
            if (lrow[i] == T(0)) {  // row sees no key anywhere
              P.row(i).setZero();
              continue;
            }
            Base<T>::exp_sum(P.row(i).data(), kc, mrow[i]);
            P.row(i) *= T(1) / lrow[i];
          }
#if defined(__AVX512F__)
          if constexpr (std::is_same_v<T, float>) {
            if (packed) {
              // pass 2: dV += P^T dO
              avx512::accumulate_transposed(P.data(), n, kc, dOp.data(), D, kc, dVp.data());
              // pass 3: dS = scale P o (dO V^T - D), the scale folded in once for both products
              avx512::grad_scores(dOp.data(), n, D, ws.kt.data() + TK * D + k0, TK, kc, scale, P.data(), delta,
                                  dS.data(), kc);
              // pass 4: dQ += dS K, dK += dS^T Q
              avx512::accumulate(dS.data(), n, kc, Kp.data(), D, kc, nullptr, dQp.data());
              avx512::accumulate_transposed(dS.data(), n, kc, Qp.data(), D, kc, dKp.data());
            }
          }
#endif
          if (!packed) {
            // pass 2: dV += P^T dO
            dVp.noalias() += P.transpose() * dOp;
            // pass 3: dP = dO V^T, dS = P o (dP - D)
            dS.noalias() = dOp * Vp.transpose();
            for (Index i = 0; i < n; ++i) dS.row(i).array() = P.row(i).array() * (dS.row(i).array() - delta[i]);
            // pass 4: dQ += scale dS K, dK += scale dS^T Q
            dQp.noalias() += scale * (dS * Kp);
            dKp.noalias() += scale * (dS.transpose() * Qp);
          }
          work.flops += 10.0 * double(n) * double(kc) * double(D);
        });
        ++work.tile_pairs;
        progress();
      });
    }
  }
  return work;
}

#define RINGATTN_INSTANTIATE(T)                                                                                    \
  template void init_online_state<T>(const Packing&, OnlineState<T>);                                              \
  template Work block_forward<T>(const QueryShard<T>&, const KVBlock<T>&, const Mask&, T, OnlineState<T>,          \
                                 Workspace<T>&, Progress);                                                         \
  template void finalize_forward<T>(const Packing&, OnlineState<T>, T*);                                           \
  template void compute_delta<T>(const Packing&, const T*, const T*, T*);                                          \
  template Work block_backward<T>(const GradQueryShard<T>&, const KVBlock<T>&, const Mask&, T, T*, T*,             \
                                  Workspace<T>&, Progress);
RINGATTN_INSTANTIATE(float)
RINGATTN_INSTANTIATE(double)
#undef RINGATTN_INSTANTIATE

}  // namespace ringattn::core
