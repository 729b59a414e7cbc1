#include "ringattn/core/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ringattn::core {

DenseResult reference_attention(const Shape& s, const Mask& mask, double scale, const std::vector<double>& q,
                                const std::vector<double>& k, const std::vector<double>& v,
                                const std::vector<double>& dout, bool backward) {
  const Index B = s.B, S = s.S, H = s.H, HKV = s.HKV, D = s.D, G = s.G();
  const double ninf = -std::numeric_limits<double>::infinity();
  auto qi = [&](Index b, Index i, Index h) { return ((b * S + i) * H + h) * D; };
  auto kj = [&](Index b, Index j, Index g) { return ((b * S + j) * HKV + g) * D; };
  DenseResult r;
  r.o.assign(B * S * H * D, 0.0);
  r.lse.assign(B * H * S, ninf);
  if (backward) {
    r.dq.assign(q.size(), 0.0);
    r.dk.assign(k.size(), 0.0);
    r.dv.assign(v.size(), 0.0);
  }
  std::vector<double> p(S);
  for (Index b = 0; b < B; ++b) {
    for (Index h = 0; h < H; ++h) {
      const Index g = h / G;  // repeat_interleave: query head h reads kv head h / G
      for (Index i = 0; i < S; ++i) {
        // scores and their max over visible keys
        double mx = ninf;
        for (Index j = 0; j < S; ++j) {
          if (!mask.visible(i, j)) {
            p[j] = ninf;
            continue;
          }
          double dot = 0;
          for (Index d = 0; d < D; ++d) dot += q[qi(b, i, h) + d] * k[kj(b, j, g) + d];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        if (mx == ninf) continue;  // no visible key: O = 0, LSE = -inf, no gradient
        double sum = 0;
        for (Index j = 0; j < S; ++j) sum += (p[j] == ninf) ? 0.0 : std::exp(p[j] - mx);
        const double lse = mx + std::log(sum);
        r.lse[(b * H + h) * S + i] = lse;
        double* o = &r.o[qi(b, i, h)];
        for (Index j = 0; j < S; ++j) {
          p[j] = (p[j] == ninf) ? 0.0 : std::exp(p[j] - lse);
          for (Index d = 0; d < D; ++d) o[d] += p[j] * v[kj(b, j, g) + d];
        }
        for (Index d = 0; d < D; ++d) r.loss += dout[qi(b, i, h) + d] * o[d];
        if (!backward) continue;
        // backward of this row: dP_ij = dO_i . V_j, D_i = dO_i . O_i, dS = P (dP - D_i)
        const double* dO = &dout[qi(b, i, h)];
        double Di = 0;
        for (Index d = 0; d < D; ++d) Di += dO[d] * o[d];
        for (Index j = 0; j < S; ++j) {
          if (p[j] == 0.0) continue;
          double dp = 0;
          for (Index d = 0; d < D; ++d) dp += dO[d] * v[kj(b, j, g) + d];
          const double ds = p[j] * (dp - Di);
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

double max_rel_error(const std::vector<double>& x, const std::vector<double>& ref) {
  const double inf = std::numeric_limits<double>::infinity();
  if (x.size() != ref.size()) return inf;
  double max_ref = 0, max_diff = 0;
  for (std::size_t n = 0; n < x.size(); ++n) {
    if (std::isnan(x[n]) || std::isnan(ref[n])) return inf;
    if (std::isinf(ref[n]) || std::isinf(x[n])) {
      if (x[n] != ref[n]) return inf;
      continue;
    }
    max_ref = std::max(max_ref, std::abs(ref[n]));
    max_diff = std::max(max_diff, std::abs(x[n] - ref[n]));
  }
  return max_ref < 1e-300 ? max_diff : max_diff / max_ref;
}

}  // namespace ringattn::core
