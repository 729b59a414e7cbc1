#include "ringattn/runtime/kv_cache.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ringattn/comm/state_merge.hpp"
#include "ringattn/core/decode_attention.hpp"
#include "ringattn/core/packed.hpp"
#include "ringattn/core/storage.hpp"
#include "ringattn/runtime/agreement.hpp"
#include "ringattn/runtime/ring_attention.hpp"

namespace ringattn::runtime {

namespace {

// Where an unused slot of the decoded block lies: after every query, so no mask shows it.
constexpr Index kFuture = std::numeric_limits<Index>::max() / 4;

// The plan options of a causal prompt of `prompt_len` positions under the cache's options.
PlanOptions prompt_options(const KVCacheOptions& o, Index prompt_len) {
  PlanOptions p;
  p.shape = core::Shape{o.batch, prompt_len, o.heads, o.kv_heads, o.head_dim};
  p.dtype = o.dtype;
  p.causal = true;
  p.window = o.window;
  p.layout = o.layout;
  p.scale = o.scale;
  p.timeout_s = o.timeout_s;
  p.tiling = o.tiling;
  p.backward = false;
  return p;
}

}  // namespace

double prompt_timeout(const KVCacheOptions& o, Index prompt_len, int N) {
  const Index largest = (prompt_len + N - 1) / N;
  return o.timeout_s.value_or(
      default_timeout(core::Shape{o.batch, prompt_len, o.heads, o.kv_heads, o.head_dim}, largest, false, 0));
}

template <class A>
void merge_partial_states(const comm::Comm& comm, const std::string& merge, Index rows, Index D,
                          const std::vector<A>& state, std::vector<A>& merged) {
  const int N = comm.size();
  if (N == 1) {  // the state is the merged state (each term's weight would be 2^0 = 1 exactly)
    merged = state;
    return;
  }
  merged.assign(rows * (D + 2), A(0));
  core::OnlineState<A> ms{merged.data(), merged.data() + rows, merged.data() + 2 * rows};
  if (merge == "allreduce") {
    // records [m, l, a] per row, merged by MPI's reduction with a user operation
    std::vector<A> rec(rows * (D + 2));
    for (Index i = 0; i < rows; ++i) {
      rec[i * (D + 2)] = state[i];
      rec[i * (D + 2) + 1] = state[rows + i];
      std::copy_n(state.data() + 2 * rows + i * D, D, rec.data() + i * (D + 2) + 2);
    }
    comm::allreduce_states(comm, std::span<A>(rec), int(D));
    for (Index i = 0; i < rows; ++i) {
      ms.m[i] = rec[i * (D + 2)];
      ms.l[i] = rec[i * (D + 2) + 1];
      std::copy_n(rec.data() + i * (D + 2) + 2, D, ms.acc + i * D);
    }
  } else {
    // every rank's state on every rank (one all-gather), merged in rank order
    std::vector<A> all(std::size_t(N) * state.size());
    comm::all_gather_fixed(comm, std::span<const A>(state), std::span<A>(all));
    auto part = [&](int q2) { return all.data() + std::size_t(q2) * state.size(); };
    for (Index i = 0; i < rows; ++i) {
      A m = -std::numeric_limits<A>::infinity();
      for (int q2 = 0; q2 < N; ++q2) m = std::max(m, part(q2)[i]);
      A l = 0;
      A* a = ms.acc + i * D;
      std::fill_n(a, D, A(0));
      bool nan = false;  // a non-finite input on any rank: the row is NaN, as the dense softmax makes it
      for (int q2 = 0; q2 < N; ++q2) nan = nan || std::isnan(part(q2)[i]) || std::isnan(part(q2)[rows + i]);
      if (nan) {
        m = l = std::numeric_limits<A>::quiet_NaN();
        std::fill_n(a, D, m);
      } else if (m != -std::numeric_limits<A>::infinity()) {
        for (int q2 = 0; q2 < N; ++q2) {
          const A mr = part(q2)[i];
          if (mr == -std::numeric_limits<A>::infinity()) continue;  // nothing visible on that rank
          const A c = std::exp2(mr - m);
          l += c * part(q2)[rows + i];
          const A* ar = part(q2) + 2 * rows + i * D;
          for (Index d = 0; d < D; ++d) a[d] += c * ar[d];
        }
      }
      ms.m[i] = m;
      ms.l[i] = l;
    }
  }
}

template void merge_partial_states<float>(const comm::Comm&, const std::string&, Index, Index, const std::vector<float>&,
                                          std::vector<float>&);
template void merge_partial_states<double>(const comm::Comm&, const std::string&, Index, Index,
                                           const std::vector<double>&, std::vector<double>&);

template <class S>
KVCacheShard<S>::KVCacheShard(const comm::Comm& comm, const KVCacheOptions& o, const OptionNames& names)
    : comm_(comm), o_(o), names_(names) {
  // The options' rules are the plan's: a plan of a one-position causal prompt checks them all.
  const AttentionPlan plan = make_attention_plan(prompt_options(o, 1), comm.size(), names);
  if (plan.dtype != core::dtype_of<S>())
    throw InputError(fmt::format("KVCache: built for {} storage, not {}", core::dtype_name(core::dtype_of<S>()),
                                 core::dtype_name(plan.dtype)));
  if (o.capacity && *o.capacity < 1)
    throw OptionError(Option::capacity, names.render(fmt::format("@capacity: {} is not a number of positions "
                                                                 "(expected >= 1)", *o.capacity)));
  check_merge(o.merge, names);
  s_ = plan.shape;
  scale_ = plan.scale;
  mask_ = core::Mask::make(1, true, o.window.value_or(0), {});
}

template <class S>
std::vector<Index> KVCacheShard<S>::prompt_positions(Index prompt_len) const {
  const core::Layout l = make_layout(o_.layout, prompt_len, comm_.size(), {}, true, o_.window.value_or(0), names_);
  const auto p = l.positions(comm_.rank());
  return {p.begin(), p.end()};
}

template <class S>
core::KVBlock<S> KVCacheShard<S>::prompt_block() const {
  const core::Packing pk{s_.B, s_.HKV, 1, L0_, s_.D};
  return core::KVBlock<S>{pk, pos0_, kv0_.data(), kv0_.data() + pk.kv_elems()};
}

template <class S>
core::KVBlock<S> KVCacheShard<S>::decoded_block() const {
  const core::Packing pk{s_.B, s_.HKV, 1, cap_, s_.D};
  return core::KVBlock<S>{pk, dec_pos_, kv_dec_.data(), kv_dec_.data() + pk.kv_elems()};
}

template <class S>
Index KVCacheShard<S>::resident_bytes() const {
  return Index(kv0_.size() + kv_dec_.size()) * Index(sizeof(S)) + Index(pos0_.size() + dec_pos_.size()) * 8;
}

template <class S>
AttentionPlan KVCacheShard<S>::agreed_prompt_plan(Index prompt_len, PlanOptions& p, bool attend) {
  AttentionPlan plan;
  agreed(comm_, [&] {
    if (prefilled_) throw InputError("prefill: the cache already holds a prompt (prefill once, then decode)");
    if (o_.capacity && prompt_len > *o_.capacity)
      throw InputError(fmt::format("prefill: a prompt of {} positions is over the capacity of {}", prompt_len,
                                   *o_.capacity));
    p = prompt_options(o_, prompt_len);
    // The ring's memory admission only for a prompt that goes through the ring: a loaded one
    // needs its K/V, which the caller holds already.
    PlanExtras extras;
    extras.admit_memory = attend;
    plan = make_attention_plan(p, comm_.size(), names_, extras);
  });
  // the merge is the cache's own option, outside the prompt's plan: ranks that disagree would meet
  // in different collectives at the first decode step
  std::vector<PlanField> fields = plan_fields(plan, p, names_);
  fields.push_back({names_.render("@merge"), o_.merge});
  agree_on_plan(comm_, fields);
  return plan;
}

template <class S>
void KVCacheShard<S>::keep_prompt(const AttentionPlan& plan, const S* k, const S* v) {
  prompt_len_ = plan.shape.S;
  const auto pos = plan.layout.positions(comm_.rank());
  pos0_.assign(pos.begin(), pos.end());
  L0_ = Index(pos0_.size());
  const core::Packing pk{s_.B, s_.HKV, 1, L0_, s_.D};
  kv0_.resize(2 * pk.kv_elems());
  core::pack_heads(pk, k, kv0_.data());
  core::pack_heads(pk, v, kv0_.data() + pk.kv_elems());
  // Decoded positions: round-robin from the prompt's end, so rank r holds about 1/N of them.
  if (o_.capacity) {
    const Index left = *o_.capacity - prompt_len_, N = comm_.size(), r = comm_.rank();
    cap_ = std::max<Index>(0, (left - r + N - 1) / N);
  } else {
    cap_ = 64;
  }
  dec_pos_.assign(cap_, kFuture);
  kv_dec_.assign(2 * core::Packing{s_.B, s_.HKV, 1, cap_, s_.D}.kv_elems(), S{});
  prefilled_ = true;
}

template <class S>
void KVCacheShard<S>::prefill(Index prompt_len, const S* q, const S* k, const S* v, A* o, A* lse) {
  PlanOptions p;
  const AttentionPlan plan = agreed_prompt_plan(prompt_len, p, true);
  {
    RingAttention<S> ring(comm_, strategy_setup(plan));
    ring.load(q, k, v);
    ring.forward();
    ring.outputs(o, lse, nullptr, nullptr, nullptr);
  }
  keep_prompt(plan, k, v);
}

template <class S>
void KVCacheShard<S>::load(Index prompt_len, const S* k, const S* v) {
  PlanOptions p;
  keep_prompt(agreed_prompt_plan(prompt_len, p, false), k, v);
}

template <class S>
DecodeStats KVCacheShard<S>::decode(Index T, const S* q, const S* k, const S* v, A* o, A* lse) {
  DecodeStats st;
  const double t_step = comm::wtime();
  const int N = comm_.size(), r = comm_.rank();
  const Index qn = s_.B * T * s_.H * s_.D, kn = s_.B * T * s_.HKV * s_.D;
  agreed(comm_, [&] {
    if (!prefilled_) throw InputError("decode: called before prefill()");
    if (T < 1) throw InputError(fmt::format("decode: T = {} new tokens (expected T >= 1)", T));
    if (o_.capacity && length() + T > *o_.capacity)
      throw InputError(fmt::format("decode: {} + {} positions are over the cache's capacity of {}", length(), T,
                                   *o_.capacity));
  });
  // Every rank must hold the same new tokens: one min/max of a digest of q, k and v.
  {
    std::uint64_t h = digest_bytes(q, sizeof(S) * qn);  // every rank was given the same new tokens
    h = digest_bytes(k, sizeof(S) * kn, h);
    h = digest_bytes(v, sizeof(S) * kn, h);
    std::int64_t mm[2] = {std::int64_t(h >> 1), -std::int64_t(h >> 1)};
    comm_.allreduce_max(std::span<std::int64_t>(mm, 2));
    agreed(comm_, [&] {
      if (mm[0] != -mm[1])
        throw InputError(fmt::format("decode: the ranks were given different q, k or v for positions {}..{} (expected "
                                     "the same new tokens on every rank)", length(), length() + T - 1));
    });
  }
  // The new tokens' K/V go to the ranks that own their positions.
  const Index first = length();
  for (Index t = 0; t < T; ++t) {
    const Index p = first + t;
    if ((p - prompt_len_) % N != r) continue;
    if (dec_pos_used_ == std::size_t(cap_)) {  // grow (only without a capacity): twice the slots
      const Index cap2 = std::max<Index>(2 * cap_, 64);
      const core::Packing a{s_.B, s_.HKV, 1, cap_, s_.D}, b{s_.B, s_.HKV, 1, cap2, s_.D};
      core::AlignedVector<S> grown(2 * b.kv_elems(), S{});
      for (int half = 0; half < 2; ++half)
        for (Index bh = 0; bh < s_.B * s_.HKV; ++bh)
          std::copy_n(kv_dec_.data() + half * a.kv_elems() + bh * cap_ * s_.D, cap_ * s_.D,
                      grown.data() + half * b.kv_elems() + bh * cap2 * s_.D);
      kv_dec_ = std::move(grown);
      dec_pos_.resize(cap2, kFuture);
      cap_ = cap2;
    }
    const Index slot = Index(dec_pos_used_++);
    dec_pos_[slot] = p;
    const core::Packing pk{s_.B, s_.HKV, 1, cap_, s_.D};
    for (Index b = 0; b < s_.B; ++b)
      for (Index g = 0; g < s_.HKV; ++g) {
        const Index src = ((b * T + t) * s_.HKV + g) * s_.D, dst = pk.kv_group(b, g) + slot * s_.D;
        std::copy_n(k + src, s_.D, kv_dec_.data() + dst);
        std::copy_n(v + src, s_.D, kv_dec_.data() + pk.kv_elems() + dst);
      }
  }
  decoded_ += T;

  // This rank's partial state of the T queries over its shard.
  const core::Packing pq{s_.B, s_.HKV, s_.G(), T, s_.D};
  core::AlignedVector<S> qp(pq.q_elems());
  core::pack_heads(pq, q, qp.data());
  std::vector<Index> qpos(T);
  for (Index t = 0; t < T; ++t) qpos[t] = first + t;
  const Index rows = pq.row_elems(), D = s_.D;
  std::vector<A> state(rows * (D + 2));  // m | l | a
  core::OnlineState<A> os{state.data(), state.data() + rows, state.data() + 2 * rows};
  core::init_online_state(pq, os);
  const core::QueryShard<S> qs{pq, qpos, qp.data()};
  const double t_attend = comm::wtime();
  const A scale = static_cast<A>(scale_);
  // The decode kernel reads each K and V row once for all T G rows of its head group.
  core::DecodeWorkspace<A> dws(T * s_.G(), D);
  core::Work work;
  if (L0_ > 0) work += core::decode_forward(qs, prompt_block(), mask_, scale, os, dws);
  if (dec_pos_used_ > 0) work += core::decode_forward(qs, decoded_block(), mask_, scale, os, dws);
  st.attend_s = comm::wtime() - t_attend;
  // the K and V rows the kernel read: its flops are 4 T G D per key and head group (a window skips
  // the chunks no query sees)
  st.kv_bytes = Index(std::llround(work.flops / (4.0 * double(T * s_.G())))) * 2 * Index(sizeof(S));

  // The merge: one collective of the N partial states, B T H (D + 2) values each.
  const double t_merge = comm::wtime();
  std::vector<A> merged;
  merge_partial_states(comm_, o_.merge, rows, D, state, merged);
  core::OnlineState<A> ms{merged.data(), merged.data() + rows, merged.data() + 2 * rows};
  std::vector<A> lse_p(rows);
  core::finalize_forward(pq, ms, lse_p.data(), nullptr, /*every_row_sees_a_key=*/true);
  st.merge_s = comm::wtime() - t_merge;
  if (o) core::unpack_heads(pq, ms.acc, o);
  if (lse)  // row stats [B, HKV, T, G] -> [B, H, T]
    for (Index b = 0; b < s_.B; ++b)
      for (Index g = 0; g < s_.HKV; ++g)
        for (Index t = 0; t < T; ++t)
          for (Index j = 0; j < s_.G(); ++j)
            lse[(b * s_.H + g * s_.G() + j) * T + t] = lse_p[pq.row_group(b, g) + t * s_.G() + j];
  st.step_s = comm::wtime() - t_step;
  return st;
}

template class KVCacheShard<float>;
template class KVCacheShard<double>;
template class KVCacheShard<core::bf16>;
template class KVCacheShard<core::f16>;

}  // namespace ringattn::runtime
