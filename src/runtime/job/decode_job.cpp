// `ringattn decode`: a generated prompt prefilled into the sharded KV cache, then decode steps.
#include "ringattn/runtime/decode_job.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "ringattn/core/aligned.hpp"
#include "ringattn/core/decode_attention.hpp"
#include "ringattn/core/inputs.hpp"
#include "ringattn/core/median.hpp"
#include "ringattn/core/reference.hpp"
#include "ringattn/core/simd.hpp"
#include "ringattn/core/storage.hpp"
#include "ringattn/io/npy.hpp"
#include "ringattn/comm/simulation.hpp"
#include "ringattn/comm/state_merge.hpp"
#include "ringattn/runtime/agreement.hpp"
#include "ringattn/runtime/input_plan.hpp"
#include "ringattn/runtime/paths.hpp"
#include "ringattn/runtime/staged_outputs.hpp"

namespace ringattn::runtime {

namespace {

using core::InputTensor;

// [B, L, inner] of the global [B, S, inner] tensor at `runs`, rounded to the storage type S.
template <class S>
std::vector<S> generate(std::uint64_t seed, InputTensor t, Index B, Index S_all, Index inner,
                        std::span<const core::Run> runs, Index L) {
  std::vector<S> out(B * L * inner);
  core::generate_positions<S>(seed, t, B, S_all, inner, runs, L, out.data());
  return out;
}

// The whole global tensor as float64, through the storage type as the ranks hold it.
template <class S>
std::vector<double> global_f64(std::uint64_t seed, InputTensor t, Index B, Index S_all, Index inner) {
  const core::Run all{0, 0, S_all};
  const std::vector<S> g = generate<S>(seed, t, B, S_all, inner, std::span<const core::Run>(&all, 1), S_all);
  std::vector<double> out(g.size());
  std::transform(g.begin(), g.end(), out.begin(), [](S x) { return core::value_cast<double>(x); });
  return out;
}

// Rows [first, first + n) of a [B, S, inner] tensor, and of a [B, H, S] one.
std::vector<double> rows(const std::vector<double>& x, Index B, Index S, Index inner, Index first, Index n) {
  std::vector<double> out(B * n * inner);
  for (Index b = 0; b < B; ++b)
    std::copy_n(&x[(b * S + first) * inner], n * inner, &out[b * n * inner]);
  return out;
}

// The last rows [first, S) of causal attention over all S positions, in float64 from the global
// tensors: o [B, S - first, H, D] and lse [B, H, S - first]. Each row's softmax over the keys it
// sees at once (max, then exp and sum): the definition, for a prompt that was not attended here.
void decode_rows_reference(const core::Shape& s, Index first, const core::Mask& mask, double scale,
                           const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                           std::vector<double>& o, std::vector<double>& lse) {
  const Index B = s.B, S = s.S, H = s.H, HKV = s.HKV, D = s.D, G = H / HKV, n = S - first;
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  o.assign(B * n * H * D, 0.0);
  lse.assign(B * H * n, 0.0);
  std::vector<double> sc(S);
  for (Index b = 0; b < B; ++b)
    for (Index i = first; i < S; ++i)
      for (Index h = 0; h < H; ++h) {
        const double* qi = &q[((b * S + i) * H + h) * D];
        double m = kNegInf;
        for (Index j = 0; j < S; ++j) {
          sc[j] = kNegInf;
          if (!mask.visible(i, j)) continue;
          const double* kj = &k[((b * S + j) * HKV + h / G) * D];
          double dot = 0;
          for (Index d = 0; d < D; ++d) dot += qi[d] * kj[d];
          sc[j] = scale * dot;
          m = std::max(m, sc[j]);
        }
        double l = 0;
        double* oi = &o[((b * n + i - first) * H + h) * D];
        for (Index j = 0; j < S; ++j) {
          if (sc[j] == kNegInf) continue;
          const double p = std::exp(sc[j] - m);
          l += p;
          const double* vj = &v[((b * S + j) * HKV + h / G) * D];
          for (Index d = 0; d < D; ++d) oi[d] += p * vj[d];
        }
        for (Index d = 0; d < D; ++d) oi[d] /= l;
        lse[(b * H + h) * n + i - first] = m + std::log(l);
      }
}

}  // namespace

// Every rank's figures, in rank order: one MPI_Allgather of six doubles (positions and bytes are
// below 2^53, exact as doubles).
void DecodeResult::per_rank(const comm::Comm& comm, const std::array<double, 6>& mine) {
  std::vector<double> all(6 * std::size_t(comm.size()));
  comm::all_gather_fixed(comm, std::span<const double>(mine), std::span<double>(all));
  for (int q = 0; q < comm.size(); ++q) {
    const double* x = all.data() + 6 * q;
    cache_positions.push_back(Index(x[0]));
    kv_bytes_per_step.push_back(Index(x[1]));
    step_s.push_back(x[2]);
    merge_s.push_back(x[3]);
    attend_s.push_back(x[4]);
    rank_stream_bytes_per_s.push_back(x[5]);
  }
}

namespace {

// Collective. The merge's yardstick: an MPI_Allreduce (sum) of as many values as one rank's merge
// `state`, and the merge of `state` alone, each timed with all ranks starting together (in a step
// the merge also waits for the slowest rank's attention). The slowest rank's medians over `reps`
// go to res.allreduce_s and res.merge_alone_s.
template <class A>
void time_merge_alone(const comm::Comm& comm, const std::string& merge, Index rows, Index D,
                      const std::vector<A>& state, int reps, DecodeResult& res) {
  std::vector<A> buf(state.size(), A(1)), merged;
  std::vector<double> t_sum, t_merge;
  for (int rep = 0; rep < reps; ++rep) {
    comm.barrier();
    double t0 = comm::wtime();
    comm::allreduce_sum(comm, std::span<A>(buf));
    t_sum.push_back(comm::wtime() - t0);
    comm.barrier();
    t0 = comm::wtime();
    merge_partial_states(comm, merge, rows, D, state, merged);
    t_merge.push_back(comm::wtime() - t0);
  }
  double med[2] = {core::median(t_sum), core::median(t_merge)};
  comm.allreduce_max(std::span<double>(med, 2));
  res.allreduce_s = med[0];
  res.merge_alone_s = med[1];
}

template <class S>
DecodeResult run_typed(const comm::Comm& comm, const DecodeConfig& c, const core::Shape& s0, StagedOutputs& staged) {
  using A = core::accum_t<S>;
  const int N = comm.size(), r = comm.rank();
  const Index B = s0.B, H = s0.H, HKV = s0.HKV, D = s0.D, S0 = c.cache_len, T = c.new_tokens, K = c.steps;
  const Index S_all = S0 + K * T;
  const bool attend = c.prefill == "attend";
  KVCacheOptions ko;
  ko.batch = B;
  ko.heads = H;
  ko.kv_heads = HKV;
  ko.head_dim = D;
  ko.dtype = c.dtype;
  ko.layout = c.layout;
  ko.window = c.window;
  ko.scale = c.scale;
  ko.timeout_s = c.timeout_s;
  ko.capacity = S_all;
  ko.merge = c.merge;
  std::unique_ptr<KVCacheShard<S>> cache;
  agreed(comm, [&] { cache = std::make_unique<KVCacheShard<S>>(comm, ko, cli_cache_names()); });

  // The prompt: this rank's positions of the global tensors, attended (the ring forward) or only
  // kept; the generated K/V are freed once the cache holds them.
  const std::vector<Index> pos = cache->prompt_positions(S0);
  std::vector<core::Run> runs;
  for (Index i = 0; i < Index(pos.size()); ++i) {
    if (!runs.empty() && runs.back().global_begin + runs.back().length == pos[i]) ++runs.back().length;
    else runs.push_back({pos[i], i, 1});
  }
  const Index L = Index(pos.size());
  std::vector<A> o0, lse0;
  double prefill = 0;
  {
    const auto k0 = generate<S>(c.seed, InputTensor::k, B, S_all, HKV * D, runs, L);
    const auto v0 = generate<S>(c.seed, InputTensor::v, B, S_all, HKV * D, runs, L);
    if (attend) {
      const auto q0 = generate<S>(c.seed, InputTensor::q, B, S_all, H * D, runs, L);
      o0.resize(B * L * H * D);
      lse0.resize(B * H * L);
      comm.barrier();
      const double t0 = comm::wtime();
      cache->prefill(S0, q0.data(), k0.data(), v0.data(), o0.data(), lse0.data());
      prefill = comm::wtime() - t0;
    } else {
      comm.barrier();
      const double t0 = comm::wtime();
      cache->load(S0, k0.data(), v0.data());
      prefill = comm::wtime() - t0;
    }
  }
  comm.allreduce_max(std::span<double>(&prefill, 1));

  DecodeResult res;
  res.shape = core::Shape{B, S_all, H, HKV, D};
  res.ranks = N;
  res.prefill_s = prefill;
  // The stream measurement's buffer: --stream-mib over the ranks, at least 256 MiB each, written
  // once now; one read pass before each step (every rank at once, as in a step), so that the steps
  // and the passes share whatever else the machine runs meanwhile. Not under simulation: its
  // ranks share one process and this host's memory says nothing of the platform's.
  const std::size_t per_rank =
      c.stream_mib > 0 && !comm::simulated() ? std::max(std::size_t(c.stream_mib) * (std::size_t(1) << 20) / std::size_t(N),
                                  std::size_t(256) << 20)
                       : 0;
  core::AlignedVector<float> stream_buf(per_rank / sizeof(float), 1.0f);
  std::vector<double> passes;
  auto stream_pass = [&] {
    if (stream_buf.empty()) return;
    comm.barrier();
    passes.push_back(core::read_pass_bytes_per_s(stream_buf.data(), stream_buf.size()));
  };
  std::vector<double> o_dec(B * K * T * H * D), lse_dec(B * H * K * T);
  std::vector<double> step, attend_t, merge, slowest;
  std::vector<A> o(B * T * H * D), lse(B * H * T);
  Index kv_bytes = 0;
  for (Index j = 0; j < K; ++j) {
    const core::Run run{S0 + j * T, 0, T};
    const std::span<const core::Run> one(&run, 1);
    const auto q = generate<S>(c.seed, InputTensor::q, B, S_all, H * D, one, T);
    const auto k = generate<S>(c.seed, InputTensor::k, B, S_all, HKV * D, one, T);
    const auto v = generate<S>(c.seed, InputTensor::v, B, S_all, HKV * D, one, T);
    stream_pass();
    comm.barrier();
    const DecodeStats st = cache->decode(T, q.data(), k.data(), v.data(), o.data(), lse.data());
    step.push_back(st.step_s);
    attend_t.push_back(st.attend_s);
    merge.push_back(st.merge_s);
    double sl = st.step_s;
    comm.allreduce_max(std::span<double>(&sl, 1));
    slowest.push_back(sl);
    kv_bytes = st.kv_bytes;
    // The same O, bit for bit, on every rank.
    const std::int64_t h = std::int64_t(digest_bytes(o.data(), o.size() * sizeof(A)) >> 1);
    std::int64_t mm[2] = {h, -h};
    comm.allreduce_max(std::span<std::int64_t>(mm, 2));
    res.identical_on_every_rank = res.identical_on_every_rank && mm[0] == -mm[1];
    for (Index b = 0; b < B; ++b) {
      std::copy_n(&o[b * T * H * D], T * H * D, &o_dec[(b * K * T + j * T) * H * D]);
      for (Index h2 = 0; h2 < H; ++h2)
        std::copy_n(&lse[(b * H + h2) * T], T, &lse_dec[(b * H + h2) * K * T + j * T]);
    }
  }
  res.decode_step_s = slowest.empty() ? 0 : core::median(slowest);

  // The merge's yardstick and the merge alone, measured after the steps in the same run.
  res.state_values = B * T * H * (D + 2);
  {
    const Index rows = B * T * H;
    std::vector<A> state(res.state_values, A(1));
    std::fill_n(state.begin(), rows, A(r));  // m: the ranks' maxima differ
    time_merge_alone(comm, c.merge, rows, D, state, 21, res);
  }
  while (!stream_buf.empty() && passes.size() < 5) stream_pass();
  const double stream = core::median(passes);
  res.stream_buffer_bytes = Index(per_rank);
  stream_buf = {};

  // Per rank: its cache, the bytes one step read, its median step, merge and attention, its stream.
  res.per_rank(comm, {double(cache->local_positions()), double(kv_bytes), step.empty() ? 0 : core::median(step),
                       merge.empty() ? 0 : core::median(merge), attend_t.empty() ? 0 : core::median(attend_t),
                       stream});
  res.stream_bytes_per_s = res.rank_stream_bytes_per_s[0];

  // The prompt's O and LSE (attended only), gathered to rank 0 in global order.
  const core::Layout prompt_layout = make_layout(c.layout, S0, N, {}, true, c.window.value_or(0), cli_cache_names());
  std::vector<double> o_prefill, lse_prefill;
  if (attend) {
    std::vector<double> o0d(o0.begin(), o0.end()), lse0d(lse0.begin(), lse0.end());
    o_prefill = gather_positions(comm, o0d, B, H * D, prompt_layout, 0);
    lse_prefill = gather_positions(comm, lse0d, B * H, 1, prompt_layout, 0);
  }
  const bool out = !c.out.empty();
  std::vector<double> gq, gk, gv;
  if (r == 0 && (c.check || out)) {
    gq = global_f64<S>(c.seed, InputTensor::q, B, S_all, H * D);
    gk = global_f64<S>(c.seed, InputTensor::k, B, S_all, HKV * D);
    gv = global_f64<S>(c.seed, InputTensor::v, B, S_all, HKV * D);
  }
  if (r == 0 && c.check) {
    const core::Mask mask = core::Mask::make(S_all, true, c.window.value_or(0), {});
    const double scale = c.scale ? *c.scale : 1.0 / std::sqrt(double(D));
    res.checked = true;
    res.tolerance = check_tolerance(core::dtype_of<S>());
    if (attend) {
      const std::vector<double> no_dout(gq.size(), 0.0);
      const core::DenseResult ref = core::reference_attention(res.shape, mask, scale, gq, gk, gv, no_dout, false);
      res.err_o_prefill = core::max_rel_error(o_prefill, rows(ref.o, B, S_all, H * D, 0, S0));
      res.err_lse_prefill = core::max_rel_error(lse_prefill, rows(ref.lse, B * H, S_all, 1, 0, S0), 1.0);
      res.err_o_decode = core::max_rel_error(o_dec, rows(ref.o, B, S_all, H * D, S0, K * T));
      res.err_lse_decode = core::max_rel_error(lse_dec, rows(ref.lse, B * H, S_all, 1, S0, K * T), 1.0);
    } else {  // the prompt was not attended: the decode rows only, each against its definition
      std::vector<double> ro, rl;
      decode_rows_reference(res.shape, S0, mask, scale, gq, gk, gv, ro, rl);
      res.err_o_decode = core::max_rel_error(o_dec, ro);
      res.err_lse_decode = core::max_rel_error(lse_dec, rl, 1.0);
    }
    res.passed = std::max({res.err_o_prefill, res.err_lse_prefill, res.err_o_decode, res.err_lse_decode}) <=
                 res.tolerance;
  }
  std::int64_t f[2] = {res.passed ? 0 : 1, res.identical_on_every_rank ? 0 : 1};
  comm.allreduce_max(std::span<std::int64_t>(f, 2));
  res.passed = f[0] == 0;
  res.identical_on_every_rank = f[1] == 0;
  res.exit_code = (res.passed && res.identical_on_every_rank) ? kExitOk : kExitCheckFailed;
  // --out: one committed set, staged here and put in place by commit() all at once.
  const core::DType file = core::accum_dtype(core::dtype_of<S>());
  std::vector<OutputTensor> files;
  auto whole = [&](const char* name, std::vector<Index> shape, const std::vector<double>& data) {
    OutputTensor t;
    t.name = name;
    t.shape = std::move(shape);
    t.pos_axis = kWhole;
    t.f64 = data;
    t.file_dtype = file;
    files.push_back(std::move(t));
  };
  if (out) {
    whole("q", {B, S_all, H, D}, gq);
    whole("k", {B, S_all, HKV, D}, gk);
    whole("v", {B, S_all, HKV, D}, gv);
    if (attend) whole("o_prefill", {B, S0, H, D}, o_prefill);
    whole("o_decode", {B, K * T, H, D}, o_dec);
  }
  staged.stage(files, prompt_layout);
  return res;
}

// Timing-only (the simulation build): no cache and no values. Each step charges this rank's
// simulated host what its decode kernel would take, the larger of its K/V bytes at
// --memory-bandwidth and its flops at the host's speed, and runs the merge for real over the
// simulated network. The keys a rank reads are its positions up to the last new token, those
// inside the window only.
template <class S>
DecodeResult run_timing_only(const comm::Comm& comm, const DecodeConfig& c, const core::Shape& s0) {
  using A = core::accum_t<S>;
  const int N = comm.size(), r = comm.rank();
  const Index B = s0.B, H = s0.H, HKV = s0.HKV, D = s0.D, S0 = c.cache_len, T = c.new_tokens, K = c.steps;
  const Index W = c.window.value_or(0);
  const core::Layout layout = make_layout(c.layout, S0, N, {}, true, W, cli_cache_names());
  const auto prompt = layout.positions(r);
  DecodeResult res;
  res.shape = core::Shape{B, S0 + K * T, H, HKV, D};
  res.ranks = N;
  const Index rows = B * T * H;
  res.state_values = rows * (D + 2);
  std::vector<A> state(res.state_values, A(1)), merged;
  std::fill_n(state.begin(), rows, A(r));
  std::vector<double> step, attend_t, merge, slowest;
  Index held_decoded = 0, kv_bytes = 0;
  for (Index j = 0; j < K; ++j) {
    const Index first = S0 + j * T, last = first + T - 1;
    for (Index p = first; p <= last; ++p) held_decoded += (p - S0) % N == r;
    Index keys = 0;
    if (W == 0) {
      keys = Index(prompt.size()) + held_decoded;
    } else {
      for (Index p : prompt) keys += p > first - W;  // the oldest new token's window, and after
      for (Index p = std::max(S0, first - W + 1); p <= last; ++p) keys += (p - S0) % N == r;
    }
    kv_bytes = keys * 2 * B * HKV * D * Index(sizeof(S));
    const double flops = 4.0 * double(B * H * T) * double(keys) * double(D);
    comm.barrier();
    const double t0 = comm::wtime();
    comm::charge_flops(std::max(flops, double(kv_bytes) / c.memory_bandwidth * comm::host_speed()));
    const double t1 = comm::wtime();
    merge_partial_states(comm, c.merge, rows, D, state, merged);
    const double t2 = comm::wtime();
    step.push_back(t2 - t0);
    attend_t.push_back(t1 - t0);
    merge.push_back(t2 - t1);
    double sl = t2 - t0;
    comm.allreduce_max(std::span<double>(&sl, 1));
    slowest.push_back(sl);
  }
  res.decode_step_s = core::median(slowest);
  time_merge_alone(comm, c.merge, rows, D, state, 5, res);
  res.per_rank(comm, {double(Index(prompt.size()) + held_decoded), double(kv_bytes), core::median(step),
                       core::median(merge), core::median(attend_t), 0.0});
  return res;
}

io::Json report_json(const DecodeConfig& c, const DecodeResult& r) {
  io::Json j = io::Json::object();
  io::Json cfg = io::Json::object();
  cfg["command"] = "decode";
  cfg["ranks"] = r.ranks;
  cfg["cache_len"] = c.cache_len;
  cfg["new_tokens"] = c.new_tokens;
  cfg["steps"] = c.steps;
  cfg["batch"] = r.shape.B;
  cfg["heads"] = r.shape.H;
  cfg["kv_heads"] = r.shape.HKV;
  cfg["head_dim"] = r.shape.D;
  cfg["dtype"] = r.dtype;
  cfg["layout"] = r.layout;
  cfg["window"] = c.window.value_or(0);
  cfg["scale"] = c.scale.value_or(1.0 / std::sqrt(double(r.shape.D)));  // the one used
  cfg["seed"] = static_cast<std::int64_t>(c.seed);
  cfg["prefill"] = c.prefill;
  cfg["merge"] = c.merge;
  cfg["stream_mib"] = c.stream_mib;
  cfg["timeout"] = r.timeout_s;
  cfg["check"] = c.check;
  cfg["out"] = c.out;
  cfg["report"] = c.report;
  cfg["simd"] = r.simd;
  if (c.timing_only) {  // simulated: each step charged its bytes at this rate (or its flops), no values
    cfg["timing_only"] = true;
    cfg["memory_bandwidth"] = c.memory_bandwidth;
  }
  j["config"] = cfg;
  io::Json t = io::Json::object();
  t["prefill_s"] = r.prefill_s;
  t["decode_step_s"] = r.decode_step_s;
  j["time"] = t;
  j["stream_bytes_per_s"] = r.stream_bytes_per_s;
  j["stream_buffer_bytes"] = r.stream_buffer_bytes;
  io::Json mg = io::Json::object();
  mg["state_values"] = r.state_values;  // B T H (D + 2), per rank
  mg["merge_s"] = r.merge_alone_s;      // the merge alone, all ranks starting together: median, slowest rank
  mg["allreduce_s"] = r.allreduce_s;    // MPI_Allreduce (sum) of as many values, timed alike
  j["merge"] = mg;
  j["identical_on_every_rank"] = r.identical_on_every_rank;
  if (r.checked) {
    io::Json ck = io::Json::object(), e = io::Json::object();
    ck["passed"] = r.passed;
    ck["tolerance"] = r.tolerance;
    e["o_prefill"] = r.err_o_prefill;
    e["lse_prefill"] = r.err_lse_prefill;
    e["o_decode"] = r.err_o_decode;
    e["lse_decode"] = r.err_lse_decode;
    ck["max_rel_err"] = e;
    j["check"] = ck;
  }
  io::Json ranks = io::Json::array();
  for (int q = 0; q < r.ranks; ++q) {
    io::Json rr = io::Json::object(), d = io::Json::object();
    rr["rank"] = q;
    d["cache_positions"] = r.cache_positions[q];
    d["kv_bytes_per_step"] = r.kv_bytes_per_step[q];
    d["step_s"] = r.step_s[q];
    d["merge_s"] = r.merge_s[q];
    d["attend_s"] = r.attend_s[q];
    d["bytes_per_s"] = r.step_s[q] > 0 ? double(r.kv_bytes_per_step[q]) / r.step_s[q] : 0.0;
    d["stream_bytes_per_s"] = r.rank_stream_bytes_per_s[q];
    rr["decode"] = d;
    ranks.push_back(rr);
  }
  j["ranks"] = ranks;
  return j;
}

// Before anything of the cache's size is built: what the most loaded rank allocates (the prompt's
// ring, with --prefill attend, is admitted by the prompt's own plan).
void admit_decode_memory(const DecodeConfig& c, const core::Shape& s, core::DType dtype, int N) {
  const double L = double((c.cache_len + N - 1) / N), dec = double((c.steps * c.new_tokens + N - 1) / N);
  const double es = double(core::dtype_size(dtype)), acc = dtype == core::DType::f64 ? 8.0 : 4.0;
  const double kv = 2.0 * double(s.B) * double(s.HKV) * double(s.D) * es;  // K and V of one position
  const double q = double(s.B) * double(s.H) * double(s.D);                // a query row's values
  MemoryPlan m;
  m.add("the prompt's K and V, generated and cached", 2 * L * kv);
  if (c.prefill == "attend") m.add("the prompt's Q and O", L * q * (es + acc));
  m.add("the cache's decoded positions", dec * kv);
  m.add("every step's O and LSE", double(c.steps) * double(c.new_tokens) * (q + double(s.B * s.H)) * 8.0);
  // rank 0, with --check or --out: the global q, k, v in float64 (and as stored, for --out)
  const double all = double(s.S), qkv = all * (q + kv / es);  // values
  if (c.check || !c.out.empty()) m.add("rank 0's global q, k, v", qkv * (8.0 + (c.out.empty() ? 0.0 : es)));
  if (c.check) m.add("rank 0's float64 reference, O and dO", all * (2 * q + double(s.B * s.H)) * 8.0);
  const double stream =
      c.stream_mib > 0 && !comm::simulated() ? std::max(double(c.stream_mib) * 1048576.0 / N, 268435456.0) : 0.0;
  if (stream > 0) m.add("the stream measurement's buffer", stream);
  // The option to blame: the stream buffer when it is the largest item; otherwise, as `run` does, the
  // option furthest above its usual size, among the length that holds the most (the prompt or the
  // decoded positions) and the shape of a position (B, H, HKV, D).
  const double prompt = 2 * L * kv, decoded = dec * kv;
  const DecodeConfig usual;
  std::string culprit, hint;
  if (stream > std::max(prompt, decoded)) {
    culprit = "--stream-mib";
    hint = "a smaller --stream-mib, or 0";
  } else {
    const bool by_prompt = prompt >= decoded;
    const std::pair<std::string, double> ratio[] = {
        by_prompt ? std::pair{fmt::format("--cache-len {}", c.cache_len), double(c.cache_len) / double(usual.cache_len)}
                  : std::pair{fmt::format("--steps {}", c.steps),
                              double(c.steps * c.new_tokens) / double(usual.steps * usual.new_tokens)},
        {fmt::format("--batch {}", s.B), double(s.B) / double(kDefaultBatch)},
        {fmt::format("--heads {}", s.H), double(s.H) / double(kDefaultHeads)},
        {fmt::format("--kv-heads {}", s.HKV), double(s.HKV) / double(kDefaultHeads)},
        {fmt::format("--head-dim {}", s.D), double(s.D) / double(kDefaultHeadDim)}};
    const auto worst = std::max_element(std::begin(ratio), std::end(ratio),
                                        [](const auto& a, const auto& b) { return a.second < b.second; });
    culprit = worst->first;
    hint = worst != std::begin(ratio) ? "a smaller shape, or more ranks"
           : by_prompt                ? "a shorter --cache-len, or more ranks"
                                      : "fewer --steps or --new-tokens, or more ranks";
  }
  admit_memory(m, culprit,
               fmt::format("a cache of {} + {} x {} positions, {} ({})", c.cache_len, c.steps, c.new_tokens,
                           s.str(), core::dtype_name(dtype)),
               hint);
}

}  // namespace

DecodeResult run_decode(comm::Comm& comm, const DecodeConfig& c) {
  core::Shape s;
  core::DType dtype = core::DType::f32;
  agreed(comm, [&] {
    if (c.cache_len < 1) throw InputError(fmt::format("--cache-len: {} is not >= 1 (expected a prompt of at least one position)", c.cache_len));
    if (c.new_tokens < 1)
      throw InputError(fmt::format("--new-tokens: {} is not >= 1 (a decode step adds T >= 1 tokens)", c.new_tokens));
    if (c.steps < 0) throw InputError(fmt::format("--steps: {} is negative (expected a number of decode steps >= 0)", c.steps));
    // S0 + K T, the cache's length, without overflow
    constexpr Index kMaxLen = Index(1) << 50;
    if (c.cache_len > kMaxLen || (c.steps > 0 && c.new_tokens > (kMaxLen - c.cache_len) / c.steps))
      throw InputError(fmt::format("{}: --cache-len {} + --steps {} x --new-tokens {} positions is over 2^50 "
                                   "(expected a cache of at most 2^50 positions)",
                                   c.cache_len > kMaxLen ? "--cache-len" : "--steps", c.cache_len, c.steps,
                                   c.new_tokens));
    s = core::Shape{c.batch.value_or(kDefaultBatch), c.cache_len + c.steps * c.new_tokens,
                    c.heads.value_or(kDefaultHeads), 0, c.head_dim.value_or(kDefaultHeadDim)};
    s.HKV = c.kv_heads.value_or(s.H);
    check_shape(s, cli_cache_names());
    dtype = parse_dtype(c.dtype, cli_cache_names());
    if (c.timeout_s && !(std::isfinite(*c.timeout_s) && *c.timeout_s >= 0))
      throw InputError(fmt::format("--timeout: {} is not a time (expected seconds >= 0; 0 disables the watchdog)",
                                   *c.timeout_s));
    if (c.prefill != "attend" && c.prefill != "load")
      throw InputError(fmt::format("--prefill: '{}' is not a prefill (expected attend or load)", c.prefill));
    check_merge(c.merge, cli_cache_names());
    if (c.stream_mib < 0) throw InputError(fmt::format("--stream-mib: {} is negative (expected MiB >= 0; 0: no stream measurement)", c.stream_mib));
    if (c.timing_only) {
      if (!comm::simulated())
        throw InputError("--timing-only: only the SimGrid/SMPI simulation build charges counted work (scripts/simulate.sh)");
      for (const auto& [option, given] : {std::pair{"--check", c.check}, std::pair{"--out", !c.out.empty()}})
        if (given)
          throw InputError(fmt::format("{}: not with --timing-only (a timing-only run computes no values)", option));
    }
    if (!(c.memory_bandwidth > 0))
      throw InputError(fmt::format("--memory-bandwidth: {} is not a rate (expected GB/s > 0)", c.memory_bandwidth / 1e9));
    if (!c.timing_only) admit_decode_memory(c, s, dtype, comm.size());
  });
  // The options the cache's prompt plan does not hold: ranks that differ would meet in different
  // collectives (or none).
  agree_on_plan(comm, {{"--cache-len", std::to_string(c.cache_len)},
                       {"--steps", std::to_string(c.steps)},
                       {"--new-tokens", std::to_string(c.new_tokens)},
                       {"--prefill", c.prefill},
                       {"--merge", c.merge},
                       {"--stream-mib", std::to_string(c.stream_mib)},
                       {"--timeout", c.timeout_s ? fmt::format("{}", *c.timeout_s) : "(default)"},
                       {"--check", c.check ? "on" : "off"},
                       {"--seed", std::to_string(c.seed)},
                       {"--out", c.out},
                       {"--report", c.report},
                       {"--timing-only", c.timing_only ? "on" : "off"},
                       {"--memory-bandwidth", fmt::format("{}", c.memory_bandwidth)}});
  // The plan's default watchdog, for the prompt's ring and (with --check) the reference on rank 0.
  const double check_flops = c.check ? 4.0 * double(s.B) * double(s.S) * double(s.S) * double(s.H * s.D) : 0.0;
  comm.set_timeout(c.timeout_s.value_or(default_timeout(s, s.S, false, check_flops)));
  StagedOutputs staged(comm, OutputPaths{c.out, c.report, "", {}, {}});  // every path checked before any compute
  DecodeResult res = core::with_storage(dtype, [&]<class S>() {
    return c.timing_only ? run_timing_only<S>(comm, c, s) : run_typed<S>(comm, c, s, staged);
  });
  res.simd = core::simd::current();
  res.timeout_s = comm.timeout();  // 0 under simulation, which has no watchdog
  res.dtype = core::dtype_name(dtype);
  res.layout = core::layout_name(make_layout(c.layout, c.cache_len, comm.size(), {}, true, c.window.value_or(0),
                                             cli_cache_names()).kind());
  res.mask = c.window ? fmt::format("causal window {}", *c.window) : "causal";
  res.report = report_json(c, res);
  if (comm.rank() == 0) staged.set_report(res.report.dump() + "\n");
  staged.commit();
  return res;
}

}  // namespace ringattn::runtime
