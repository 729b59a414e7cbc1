#pragma once
// Dense float64 reference attention over whole (global) tensors, forward and backward.
// Written independently of the block kernels: each query row's softmax over all S keys at once
// (max, then exp and sum), no online rescaling, no tiles. Only --check and the tests use it.
//   q, dout, o, dq [B, S, H, D];  k, v, dk, dv [B, S, HKV, D];  lse [B, H, S]
//
// reference_attention_loops is the definition: plain loops over (b, h, i, j, d), as slow as that
// sounds (about 9 s at S=2048, H=4, D=64). reference_attention computes the same in float64
// with GEMMs over blocks of query rows (memory O(rows x S)); unit tests hold it to the loops.
#include <vector>

#include "ringattn/core/mask.hpp"

namespace ringattn::core {

struct DenseResult {
  std::vector<double> o, lse, dq, dk, dv;
  std::vector<double> dsinks;  // [H], with sinks
  double loss = 0;  // sum dout . o (+ dlse . lse when dlse is given)
};

// What attention may add to softmax(scale q k^T + mask) v:
//   softcap c > 0: each scaled score s becomes c tanh(s / c) before the mask and the softmax;
//   sinks [H]: a logit per query head in every row's denominator that attends to no value (a row
//     with no visible key then has O = 0, LSE = sink); -inf is no sink;
//   dlse [B, H, S]: dL/dLSE, a gradient flowing into LSE as well as dout into O.
struct AttentionExtras {
  double softcap = 0;
  std::vector<double> sinks;
  std::vector<double> dlse;
};

DenseResult reference_attention(const Shape& s, const Mask& mask, double scale, const std::vector<double>& q,
                                const std::vector<double>& k, const std::vector<double>& v,
                                const std::vector<double>& dout, bool backward = true,
                                const AttentionExtras& extras = {});
DenseResult reference_attention_loops(const Shape& s, const Mask& mask, double scale, const std::vector<double>& q,
                                      const std::vector<double>& k, const std::vector<double>& v,
                                      const std::vector<double>& dout, bool backward = true,
                                      const AttentionExtras& extras = {});

// max |x - ref| / max(max |ref|, floor) over the entries; an infinity must match the same infinity
// and a NaN a NaN (else +inf error: a row the reference finds NaN, its softmax over scores that all
// overflowed, must be NaN here too). A denominator below 1e-300 falls back to the absolute
// error. The floor is the output's natural magnitude, for a reference that (nearly) vanishes.
double max_rel_error(const std::vector<double>& x, const std::vector<double>& ref, double floor = 0);

}  // namespace ringattn::core
