#include "ringattn/core/reference.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>

namespace ringattn::core {

namespace {

// Outputs before any key is seen: O = 0, LSE = -inf, zero gradients (when asked for).
DenseResult empty_result(const Shape& s, bool backward) {
  DenseResult r;
  r.o.assign(s.B * s.S * s.H * s.D, 0.0);
  r.lse.assign(s.B * s.H * s.S, -std::numeric_limits<double>::infinity());
  if (backward) {
    r.dq.assign(s.B * s.S * s.H * s.D, 0.0);
    r.dk.assign(s.B * s.S * s.HKV * s.D, 0.0);
    r.dv.assign(s.B * s.S * s.HKV * s.D, 0.0);
  }
  return r;
}

// One row's softmax with a sink: m and sum over the visible keys (max m, sum of e^(s - m)) widened
// by the sink logit; returns LSE, or -inf when neither a key nor a sink is there.
double row_lse(double m, double sum, double sink) {
  const double ninf = -std::numeric_limits<double>::infinity();
  if (std::isnan(sum)) return sum;  // a NaN or +inf score: the row's softmax and LSE are NaN
  if (sink == ninf) return sum > 0 ? m + std::log(sum) : ninf;
  if (sum == 0) return sink;
  const double mx = std::max(m, sink);
  return mx + std::log(sum * std::exp(m - mx) + std::exp(sink - mx));
}

}  // namespace

DenseResult reference_attention_loops(const Shape& s, const Mask& mask, double scale, const std::vector<double>& q,
                                      const std::vector<double>& k, const std::vector<double>& v,
                                      const std::vector<double>& dout, bool backward, const AttentionExtras& x) {
  const Index B = s.B, S = s.S, H = s.H, HKV = s.HKV, D = s.D, G = s.G();
  const double ninf = -std::numeric_limits<double>::infinity();
  auto qi = [&](Index b, Index i, Index h) { return ((b * S + i) * H + h) * D; };
  auto kj = [&](Index b, Index j, Index g) { return ((b * S + j) * HKV + g) * D; };
  DenseResult r = empty_result(s, backward);
  if (!x.sinks.empty() && backward) r.dsinks.assign(H, 0.0);
  std::vector<double> p(S), capd(S, 1.0);  // capd: d(c tanh(s/c))/ds = 1 - tanh^2
  for (Index b = 0; b < B; ++b) {
    for (Index h = 0; h < H; ++h) {
      const Index g = h / G;  // repeat_interleave: query head h reads kv head h / G
      const double sink = x.sinks.empty() ? ninf : x.sinks[h];
      for (Index i = 0; i < S; ++i) {
        // scores and their max over visible keys; a NaN score makes the max NaN
        double mx = ninf;
        bool sees = false;
        for (Index j = 0; j < S; ++j) {
          if (!mask.visible(i, j)) continue;
          sees = true;
          double dot = 0;
          for (Index d = 0; d < D; ++d) dot += q[qi(b, i, h) + d] * k[kj(b, j, g) + d];
          p[j] = dot * scale;
          if (x.softcap > 0) {
            const double t = std::tanh(p[j] / x.softcap);
            p[j] = x.softcap * t;
            capd[j] = 1 - t * t;
          }
          if (std::isnan(p[j]) || p[j] > mx) mx = std::isnan(mx) ? mx : p[j];
        }
        const double dlse = x.dlse.empty() ? 0.0 : x.dlse[(b * H + h) * S + i];
        if (!sees) {  // no visible key: O = 0, LSE = -inf and no gradient; with a sink LSE = sink
          if (sink == ninf) continue;
          r.lse[(b * H + h) * S + i] = sink;
          r.loss += dlse * sink;
          if (backward) r.dsinks[h] += dlse;  // P_sink = 1, D_i = -dLSE_i
          continue;
        }
        // a NaN or +inf score makes the row NaN, as torch's softmax does; scores that are all -inf
        // give a sink the whole weight, and without one a NaN softmax with LSE -inf (O = e^(-inf - -inf))
        double sum = 0;
        for (Index j = 0; j < S; ++j)
          if (mask.visible(i, j)) sum += p[j] == ninf ? 0.0 : std::exp(p[j] - mx);
        const double lse = row_lse(mx, sum, sink);
        r.lse[(b * H + h) * S + i] = lse;
        r.loss += dlse * lse;
        double* o = &r.o[qi(b, i, h)];
        for (Index j = 0; j < S; ++j) {
          if (!mask.visible(i, j)) continue;
          p[j] = std::exp(p[j] - lse);
          for (Index d = 0; d < D; ++d) o[d] += p[j] * v[kj(b, j, g) + d];
        }
        for (Index d = 0; d < D; ++d) r.loss += dout[qi(b, i, h) + d] * o[d];
        if (!backward) continue;
        // backward of this row: dP_ij = dO_i . V_j, D_i = dO_i . O_i, dS = P (dP - D_i), over the
        // visible keys (those with P = 0 too: 0 times a non-finite dP or K is NaN, as in torch)
        const double* dO = &dout[qi(b, i, h)];
        double Di = -dlse;  // dS_ij = P_ij (dP_ij - dO_i.O_i + dLSE_i)
        for (Index d = 0; d < D; ++d) Di += dO[d] * o[d];
        if (sink != ninf) r.dsinks[h] -= std::exp(sink - lse) * Di;
        for (Index j = 0; j < S; ++j) {
          if (!mask.visible(i, j)) continue;
          double dp = 0;
          for (Index d = 0; d < D; ++d) dp += dO[d] * v[kj(b, j, g) + d];
          const double ds = p[j] * (dp - Di) * capd[j];
          for (Index d = 0; d < D; ++d) {
            r.dq[qi(b, i, h) + d] += ds * k[kj(b, j, g) + d] * scale;
            r.dk[kj(b, j, g) + d] += ds * q[qi(b, i, h) + d] * scale;
            r.dv[kj(b, j, g) + d] += p[j] * dO[d];
          }
        }
      }
    }
  }
  return r;
}

// The same definition with GEMMs: for each batch b and query head h, blocks of R query rows
// against all S keys of kv head h / G. Rows and keys are strided views of the [B, S, heads, D]
// tensors, so nothing is reshuffled.
DenseResult reference_attention(const Shape& s, const Mask& mask, double scale, const std::vector<double>& q,
                                const std::vector<double>& k, const std::vector<double>& v,
                                const std::vector<double>& dout, bool backward, const AttentionExtras& x) {
  using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Rows = Eigen::Map<const Mat, 0, Eigen::OuterStride<>>;
  using MutRows = Eigen::Map<Mat, 0, Eigen::OuterStride<>>;
  const Index B = s.B, S = s.S, H = s.H, HKV = s.HKV, D = s.D, G = s.G();
  const double ninf = -std::numeric_limits<double>::infinity();
  constexpr Index R = 256;
  // Non-finite inputs: the products below would multiply the zero P of invisible pairs by them
  // (0 * NaN = NaN) and spread them to rows and keys that never see them; the loops sum over the
  // visible pairs only.
  auto nonfinite = [](const std::vector<double>& x) {
    return std::any_of(x.begin(), x.end(), [](double e) { return !std::isfinite(e); });
  };
  if (nonfinite(q) || nonfinite(k) || nonfinite(v) || (backward && nonfinite(dout)))
    return reference_attention_loops(s, mask, scale, q, k, v, dout, backward, x);
  DenseResult r = empty_result(s, backward);
  if (!x.sinks.empty() && backward) r.dsinks.assign(H, 0.0);
  if (S == 0) return r;
  Mat P(std::min(R, S), S), dS(backward ? std::min(R, S) : 0, S), T(x.softcap > 0 ? std::min(R, S) : 0, S);
  const Eigen::OuterStride<> qs(H * D), ks(HKV * D);
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h) {
      const Index g = h / G;  // repeat_interleave: query head h reads kv head h / G
      const Rows K(&k[(b * S * HKV + g) * D], S, D, ks), V(&v[(b * S * HKV + g) * D], S, D, ks);
      for (Index i0 = 0; i0 < S; i0 += R) {
        const Index n = std::min(R, S - i0);
        const Rows Q(&q[((b * S + i0) * H + h) * D], n, D, qs), dO(&dout[((b * S + i0) * H + h) * D], n, D, qs);
        MutRows O(&r.o[((b * S + i0) * H + h) * D], n, D, qs);
        auto p = P.topRows(n);
        p.noalias() = scale * (Q * K.transpose());
        if (x.softcap > 0) {  // s -> c tanh(s / c); T keeps tanh for the backward
          auto t = T.topRows(n);
          t.array() = (p.array() / x.softcap).tanh();
          p.array() = x.softcap * t.array();
        }
        const double sink = x.sinks.empty() ? ninf : x.sinks[h];
        Eigen::VectorXd lse_rows(n);
        for (Index i = 0; i < n; ++i) {
          double mx = ninf;
          bool sees = false, odd = false;
          for (Index j = 0; j < S; ++j) {
            if (!mask.visible(i0 + i, j)) {
              p(i, j) = ninf;
            } else {
              mx = std::max(mx, p(i, j)), sees = true;
              odd |= std::isnan(p(i, j)) || p(i, j) == -ninf;
            }
          }
          // finite inputs whose products overflowed (f64's range): a NaN or +inf score, or only -inf
          // ones without a sink, make the row's softmax NaN, which the loops give (they sum over the
          // visible pairs only, where the products here would spread 0 * NaN)
          if (odd || (sees && mx == ninf && sink == ninf))
            return reference_attention_loops(s, mask, scale, q, k, v, dout, backward, x);
          double sum = 0;
          for (Index j = 0; j < S; ++j) sum += p(i, j) == ninf ? 0.0 : std::exp(p(i, j) - mx);
          const double lse = row_lse(mx, sum, sink);
          lse_rows(i) = lse;
          if (lse == ninf) {  // no visible key and no sink: O = 0, LSE = -inf, no gradient
            p.row(i).setZero();
            continue;
          }
          r.lse[(b * H + h) * S + i0 + i] = lse;
          for (Index j = 0; j < S; ++j) p(i, j) = p(i, j) == ninf ? 0.0 : std::exp(p(i, j) - lse);
        }
        O.noalias() = p * V;
        r.loss += (dO.array() * O.array()).sum();
        Eigen::VectorXd dlse = Eigen::VectorXd::Zero(n);
        for (Index i = 0; i < n && !x.dlse.empty(); ++i) {
          dlse(i) = x.dlse[(b * H + h) * S + i0 + i];
          if (lse_rows(i) != ninf) r.loss += dlse(i) * lse_rows(i);
        }
        if (!backward) continue;
        // dP = dO V^T; dS = P o (dP - D_i), D_i = dO_i . O_i - dLSE_i; rows that saw nothing have P = 0
        auto ds = dS.topRows(n);
        ds.noalias() = dO * V.transpose();
        const Eigen::VectorXd Di = (dO.array() * O.array()).rowwise().sum() - dlse.array();
        for (Index i = 0; i < n && sink != ninf; ++i) r.dsinks[h] -= std::exp(sink - lse_rows(i)) * Di(i);
        ds.array() = p.array() * (ds.array().colwise() - Di.array());
        if (x.softcap > 0) ds.array() *= 1 - T.topRows(n).array().square();
        MutRows dQ(&r.dq[((b * S + i0) * H + h) * D], n, D, qs);
        MutRows dK(&r.dk[(b * S * HKV + g) * D], S, D, ks), dV(&r.dv[(b * S * HKV + g) * D], S, D, ks);
        dQ.noalias() = scale * (ds * K);
        dK.noalias() += scale * (ds.transpose() * Q);
        dV.noalias() += p.transpose() * dO;
      }
    }
  return r;
}

double max_rel_error(const std::vector<double>& x, const std::vector<double>& ref, double floor) {
  const double inf = std::numeric_limits<double>::infinity();
  if (x.size() != ref.size()) return inf;
  double max_ref = 0, max_diff = 0;
  for (std::size_t n = 0; n < x.size(); ++n) {
    if (std::isnan(x[n]) && std::isnan(ref[n])) continue;  // NaN where the reference's softmax is NaN
    if (std::isnan(x[n]) || std::isnan(ref[n])) return inf;
    if (std::isinf(ref[n]) || std::isinf(x[n])) {
      if (x[n] != ref[n]) return inf;
      continue;
    }
    max_ref = std::max(max_ref, std::abs(ref[n]));
    max_diff = std::max(max_diff, std::abs(x[n] - ref[n]));
  }
  const double denom = std::max(max_ref, floor);
  return denom < 1e-300 ? max_diff : max_diff / denom;
}

}  // namespace ringattn::core
