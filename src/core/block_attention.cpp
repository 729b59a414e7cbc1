// The parts of the block kernels that are not SIMD: the online state's start and end, the
// workspace, the tiling and the choice of SIMD target. The kernels themselves are in
// block_kernels.cpp, compiled once per target.
#include "ringattn/core/block_attention.hpp"

#include <fmt/format.h>

#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <type_traits>

#include "ringattn/core/errors.hpp"
#include "ringattn/core/simd.hpp"
#include "amx_tiles.hpp"
#include "bf16_dot.hpp"
#include "tile_walk.hpp"

namespace ringattn::core {

namespace {

template <class T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// Elements past the last column of a tile row, room for the widest column block of any target
// (three vectors of 2048-bit SVE), so loads and stores of a whole block stay inside the buffer.
constexpr Index kPad = 256;

// Rows of a chunk, whole query tiles: Tiling::chunk_rows, or by default as many as keep the three
// row operands [R, D] of the backward (Q', dO, dQ) near 1 MiB, half of a typical L2, next to the
// K and V tiles.
Index chunk_rows(const Tiling& t, Index D, std::size_t elem) {
  constexpr std::size_t kBytes = std::size_t(1) << 20;
  const std::size_t row_bytes = 3 * std::size_t(std::max<Index>(D, 1)) * elem;
  const Index want = t.chunk_rows > 0 ? t.chunk_rows : static_cast<Index>(kBytes / row_bytes);
  return std::max<Index>(1, (want + t.q_rows - 1) / t.q_rows) * t.q_rows;
}

}  // namespace

Tiling resolve_tiling(const Tiling& t, Index head_dim, Index Lmax, Index G) {
  (void)head_dim;
  const Tiling def = simd::default_tiling();
  Tiling r = t;
  if (r.q_rows <= 0) r.q_rows = def.q_rows;
  if (r.k_cols <= 0) r.k_cols = def.k_cols;
  r.q_rows = std::max<Index>(1, std::min(r.q_rows, std::max<Index>(1, Lmax * G)));
  r.k_cols = std::max<Index>(1, std::min(r.k_cols, std::max<Index>(1, Lmax)));
  return r;
}

namespace {
// Float workspaces carry the packed bf16 operands of the AMX or dot-product products when the
// machine has either (bf16 storage computes in float; which is used is decided per call).
template <class A>
bool amx_buffers() {
  return std::is_same_v<A, float> && (amx::available() || bf16dot::available());
}

// A row stride of at least n elements of `elem` bytes that is an odd number of 64-byte lines.
Index odd_lines(Index n, std::size_t elem) {
  const Index per_line = 64 / Index(elem);
  Index lines = (std::max<Index>(n, 1) + per_line - 1) / per_line;
  if (lines % 2 == 0) ++lines;
  return lines * per_line;
}
}  // namespace

template <class A>
Workspace<A>::Workspace(const Tiling& t, Index head_dim, Precision pr_) : tiling(t), D(head_dim), precision(pr_) {
  const bool rounding = std::is_same_v<A, float> && precision == Precision::bf16;
  const Index cb = simd::column_block(sizeof(A));
  ld = odd_lines((t.k_cols + cb - 1) / cb * cb, sizeof(A));
  ldd = odd_lines(D, sizeof(A));
  R = chunk_rows(t, D, sizeof(A));
  s.assign(t.q_rows * ld + kPad, A(0));
  p.assign(t.q_rows * ld + kPad, A(0));
  kt.assign(D * ld + kPad, A(0));
  vt.assign(D * ld + kPad, A(0));
  qs.assign(R * D + kPad, A(0));
  qw.assign(R * ldd + kPad, A(0));
  dow.assign(R * ldd + kPad, A(0));
  kw.assign(t.k_cols * ldd + kPad, A(0));
  vw.assign(t.k_cols * ldd + kPad, A(0));
  for (auto* v : {&rowmax, &rowc, &rowsum}) v->assign(t.q_rows + kPad, A(0));
  vmax.assign((t.q_rows + 8) * kPad / 4, A(0));  // a vector of maxima per tile row
  if (amx_buffers<A>()) {
    const Index Dp = amx::padded_depth(D);
    ldk = amx::packed_keys(t.k_cols);
    qb.assign((R + amx::kTileRows) * Dp, 0);
    dob.assign((R + amx::kTileRows) * Dp, 0);
    kb.assign(Dp * ldk, 0);
    vb.assign(Dp * ldk, 0);
  }
  if (amx_buffers<A>() && rounding) {
    ldc = amx::packed_keys(D);
    pb.assign((t.q_rows + amx::kTileRows) * amx::padded_depth(t.k_cols + 1), 0);
    pbt.assign((t.k_cols + amx::kTileRows) * amx::padded_depth(t.q_rows + 1), 0);
    for (auto* b : {&vpb, &kpb}) b->assign(amx::row_pairs(t.k_cols) * 2 * ldc, 0);
    for (auto* b : {&qpb, &dopb}) b->assign(amx::row_pairs(R) * 2 * ldc, 0);
  }
  if (rounding) pr.assign(t.q_rows * ld + kPad, A(0));
}

template <class A>
Index Workspace<A>::bytes(const Tiling& t, Index head_dim, Precision precision) {
  const bool rounding = std::is_same_v<A, float> && precision == Precision::bf16;
  const Index D = head_dim, R = chunk_rows(t, D, sizeof(A)), cb = simd::column_block(sizeof(A));
  const Index ld = odd_lines((t.k_cols + cb - 1) / cb * cb, sizeof(A)), ldd = odd_lines(D, sizeof(A));
  Index n = 2 * (t.q_rows * ld + kPad) + 2 * (D * ld + kPad) + (R * D + kPad);
  n += 2 * (R * ldd + kPad) + 2 * (t.k_cols * ldd + kPad);
  n += 3 * (t.q_rows + kPad) + (t.q_rows + 8) * kPad / 4;
  Index amx_bytes = 0;
  if (amx_buffers<A>()) {
    const Index Dp = amx::padded_depth(D);
    const Index ldc = amx::packed_keys(D);
    Index b = 2 * (R + amx::kTileRows) * Dp + 2 * Dp * amx::packed_keys(t.k_cols);
    if (rounding) b += (t.q_rows + amx::kTileRows) * amx::padded_depth(t.k_cols + 1);
    if (rounding) b += (t.k_cols + amx::kTileRows) * amx::padded_depth(t.q_rows + 1);
    if (rounding) b += 2 * amx::row_pairs(t.k_cols) * 2 * ldc + 2 * amx::row_pairs(R) * 2 * ldc;
    amx_bytes = Index(sizeof(std::uint16_t)) * b;
  }
  if (rounding) n += t.q_rows * ld + kPad;
  return n * Index(sizeof(A)) + amx_bytes;
}

template <class A>
void init_online_state(const Packing& pk, OnlineState<A> st) {
  std::fill_n(st.m, pk.row_elems(), kNegInf<A>);
  std::fill_n(st.l, pk.row_elems(), A(0));
  std::fill_n(st.acc, pk.q_elems(), A(0));
}

namespace {
// A sink logit in the kernels' log2 units (log2 e folded in, as into the scale), rounded to A once,
// the same way by the forward's merge and the sinks' gradient.
template <class A>
A sink_log2(double sink) {
  return static_cast<A>(sink * kLog2e);
}
}  // namespace

template <class A>
void finalize_forward(const Packing& pk, OnlineState<A> st, A* lse, const double* sinks, bool every_row_sees_a_key) {
  const Index rows = pk.row_elems(), D = pk.D;
  for (Index r = 0; r < rows; ++r) {
    A* a = st.acc + r * D;
    if (sinks) {  // merge (sink, 1, 0): m' = max(m, s), l' = l 2^(m - m') + 2^(s - m'), a' = a 2^(m - m')
      const Index h = (r / (pk.L * pk.G)) % pk.HKV * pk.G + r % pk.G;
      const A s = sink_log2<A>(sinks[h]);
      if (s != kNegInf<A> && !std::isnan(st.l[r])) {
        const A m = std::max(st.m[r], s);
        const A c = st.l[r] == A(0) ? A(0) : static_cast<A>(std::exp2(double(st.m[r]) - double(m)));
        st.l[r] = static_cast<A>(double(st.l[r]) * double(c) + std::exp2(double(s) - double(m)));
        st.m[r] = m;
        for (Index d = 0; d < D; ++d) a[d] *= c;
      }
    }
    if (st.l[r] == A(0) && every_row_sees_a_key) {  // keys seen, every score -inf: a NaN softmax
      constexpr A kNaN = std::numeric_limits<A>::quiet_NaN();
      std::fill_n(a, D, kNaN);
      st.m[r] = st.l[r] = kNaN;  // the backward's NaN probabilities for the keys the row sees
      lse[r] = kNegInf<A>;       // log sum e^-inf, as torch.logsumexp gives
      continue;
    }
    if (st.l[r] == A(0)) {  // no visible key: O = 0, LSE = -inf, never NaN
      std::fill_n(a, D, A(0));
      st.m[r] = kNegInf<A>;
      lse[r] = kNegInf<A>;
      continue;
    }
    const A inv = A(1) / st.l[r];
    for (Index d = 0; d < D; ++d) a[d] *= inv;
    // the kernels keep the running max in log2 units (log2 e folded into the scale)
    lse[r] = A((double(st.m[r]) + std::log2(double(st.l[r]))) * 0.6931471805599453);
  }
}

template <class A>
void add_sink_grad(const Packing& pk, const A* m, const A* l, const A* delta, const double* sinks, double* dsinks) {
  const Index rows = pk.row_elems();
  for (Index r = 0; r < rows; ++r) {
    const Index h = (r / (pk.L * pk.G)) % pk.HKV * pk.G + r % pk.G;
    if (sinks[h] == kNegInf<double>) continue;  // P_sink = 0
    // 2^(s - m) / l as the forward merged it: exact where the sink is the row's maximum, where
    // e^(sink - LSE) would lose sink's magnitude times the rounding of LSE
    const double p = std::exp2(double(sink_log2<A>(sinks[h])) - double(m[r])) / double(l[r]);
    dsinks[h] -= p * double(delta[r]);
  }
}

bool amx_bf16_active() { return amx::enabled() && !bf16dot::enabled(); }

std::string bf16_products() {
  if (bf16dot::enabled()) return bf16dot::instruction();
  return amx::enabled() ? "AMX" : "";
}

bool block_visible(const Mask& mask, std::span<const Index> qpos, std::span<const Index> kpos) {
  if (qpos.empty() || kpos.empty()) return false;
  if (mask.is_full()) return true;
  return mask.classify(qpos.front(), qpos.back(), kpos.front(), kpos.back()) != TileClass::empty;
}

template <class S>
Work count_block_forward(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& mask,
                         const Workspace<accum_t<S>>& ws) {
  Work one;  // one head group (b, g): visibility depends on positions only, so every group is alike
  if (!block_visible(mask, q.pos, kv.pos)) return one;
  const Index G = q.pk.G, D = q.pk.D;
  const Tiling& t = ws.tiling;
  walk::for_each_tile(
      mask, q.pos, G, kv.pos, q.pk.L * G, kv.pk.L, t, ws.R, [](Index, Index) {}, [](Index, Index) {},
      [&](const walk::Tile& tile, TileClass cls) {
        walk::for_each_piece(mask, q.pos, G, kv.pos, tile, cls, t.strip_rows, [&](const walk::Tile& p, TileClass) {
          one.flops += 4.0 * double(p.tq) * double(p.tk) * double(D);
        });
        ++one.tile_pairs;
      });
  const Index groups = q.pk.B * q.pk.HKV;
  return Work{one.tile_pairs * groups, one.flops * double(groups)};
}

template Work count_block_forward<float>(const QueryShard<float>&, const KVBlock<float>&, const Mask&,
                                         const Workspace<float>&);
template Work count_block_forward<double>(const QueryShard<double>&, const KVBlock<double>&, const Mask&,
                                          const Workspace<double>&);
template Work count_block_forward<bf16>(const QueryShard<bf16>&, const KVBlock<bf16>&, const Mask&,
                                        const Workspace<float>&);
template Work count_block_forward<f16>(const QueryShard<f16>&, const KVBlock<f16>&, const Mask&,
                                       const Workspace<float>&);

template struct Workspace<float>;
template struct Workspace<double>;
template void init_online_state<float>(const Packing&, OnlineState<float>);
template void init_online_state<double>(const Packing&, OnlineState<double>);
template void finalize_forward<float>(const Packing&, OnlineState<float>, float*, const double*, bool);
template void finalize_forward<double>(const Packing&, OnlineState<double>, double*, const double*, bool);
template void add_sink_grad<float>(const Packing&, const float*, const float*, const float*, const double*, double*);
template void add_sink_grad<double>(const Packing&, const double*, const double*, const double*, const double*,
                                     double*);

// ---- the SIMD target ---------------------------------------------------------------------------

namespace simd {

namespace {
std::mutex g_mutex;
std::int64_t g_selected = 0;  // the target select() restricted the kernels to; 0: none

// What the CPU supports, whatever select() restricted the dispatch to.
std::int64_t cpu_targets() {
  hwy::SetSupportedTargetsForTest(0);
  const std::int64_t supported = hwy::SupportedTargets();
  hwy::SetSupportedTargetsForTest(g_selected);
  return supported;
}
}  // namespace

std::vector<std::string> available() {
  std::lock_guard lock(g_mutex);
  std::vector<std::string> out;
  const std::int64_t supported = cpu_targets();
  for (std::int64_t t : compiled_targets())
    if (supported & t) out.push_back(hwy::TargetName(t));
  return out;
}

void select(const std::string& name) {
  std::lock_guard lock(g_mutex);
  const std::int64_t supported = cpu_targets();
  std::string built, runs;
  std::int64_t chosen = 0;
  for (std::int64_t t : compiled_targets()) {
    const std::string n = hwy::TargetName(t);
    built += (built.empty() ? "" : ", ") + n;
    if (supported & t) runs += (runs.empty() ? "" : ", ") + n;
    if (n == name) chosen = t;
  }
  if (chosen == 0)
    throw InputError(
        fmt::format("RINGATTN_SIMD={}: not a SIMD target of this build (expected one of {})", name, built));
  if (!(supported & chosen))
    throw InputError(fmt::format("RINGATTN_SIMD={}: this CPU cannot run {} (expected one of {})", name, name, runs));
  g_selected = chosen;
  hwy::SetSupportedTargetsForTest(chosen);
}

void select_from_environment() {
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    if (const char* v = std::getenv("RINGATTN_SIMD"); v && *v) {
      try {
        select(v);
      } catch (const InputError& e) {
        error = e.what();
      }
    }
  });
  if (!error.empty()) throw InputError(error);
}

}  // namespace simd

}  // namespace ringattn::core
