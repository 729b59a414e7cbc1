#pragma once
// Decode attention: a few query rows against a long K/V block, the block read once.
//
// A decode step has T new tokens, so a head group (b, g) has R = T G query rows and the block
// Lk >> R keys: the work is a pair of matrix-vector products, bound by the bytes of K and V. Keys
// are taken in chunks of kDecodeChunk; per chunk:
//   pass 1: S = Q' K^T, each K row streamed once for all R rows (Q' = alpha Q, alpha = scale log2 e);
//   pass 2: m' = max(m, rowmax S), P = 2^(S - m'), l' = c l + sum P, c = 2^(m - m');
//   pass 3: a' = c a + P V, each V row streamed once for all R rows.
// The state (m, l, a) is block_forward's (the same units), so the two kernels can be mixed and
// finalize_forward ends either; the sums run in another order, so results agree to rounding, not
// bit for bit. Non-finite operands propagate as block_attention.hpp describes. A chunk no query
// sees is skipped; a block no query sees leaves the state untouched.
#include <cstddef>

#include "ringattn/core/aligned.hpp"
#include "ringattn/core/block_attention.hpp"

namespace ringattn::core {

// Keys per chunk: a chunk's K and V rows stay in L1 between the passes (32 KiB at D = 128 in f32,
// where 64 keys took 64 KiB of a 48 KiB L1); 16 to 128 were measured (docs/inference.md).
inline constexpr Index kDecodeChunk = 32;

// Scratch of decode_forward for up to `rows` query rows of head dim D (accumulation type A).
template <class A>
struct DecodeWorkspace {
  DecodeWorkspace(Index rows, Index head_dim);
  Index rows = 0, D = 0, ld = 0;     // capacity in rows; head dim; row stride of the chunk tiles
  AlignedVector<A> qs;               // [rows, D] the group's queries times alpha
  AlignedVector<A> s;                // [rows, ld] a chunk's scores, then its probabilities
  AlignedVector<A> rowmax, c, sum;   // [rows]
};

// Fold one K/V block into the state of the query rows (q.pk.L * q.pk.G <= ws.rows per group), as
// block_forward does. Returns the work done (4 R Lk' D flops over the Lk' keys of the chunks
// computed; one tile pair per head group and chunk).
template <class S>
Work decode_forward(const QueryShard<S>& q, const KVBlock<S>& kv, const Mask& mask, accum_t<S> scale,
                    OnlineState<accum_t<S>> st, DecodeWorkspace<accum_t<S>>& ws);

// Bytes per second this core reads x[0, n) at: one vector read pass, timed.
double read_pass_bytes_per_s(const float* x, std::size_t n);

}  // namespace ringattn::core
