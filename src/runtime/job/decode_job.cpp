// `ringattn decode`: a generated prompt prefilled into the sharded KV cache, then decode steps.
#include "ringattn/runtime/decode_job.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "ringattn/core/inputs.hpp"
#include "ringattn/core/median.hpp"
#include "ringattn/core/reference.hpp"
#include "ringattn/core/storage.hpp"
#include "ringattn/io/npy.hpp"
#include "ringattn/runtime/agreement.hpp"
#include "ringattn/runtime/paths.hpp"

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

std::uint64_t digest(const void* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

void write_file(const std::string& dir, const std::string& name, core::DType dtype, const std::vector<Index>& shape,
                const std::vector<double>& data) {
  // Written beside and renamed into place: a reader never sees half a file.
  const std::string tmp = path_in(dir, "." + name + ".tmp"), dst = path_in(dir, name);
  if (dtype == core::DType::f64) {
    io::write_npy<double>(tmp, dtype, shape, data.data());
  } else {
    std::vector<float> f(data.begin(), data.end());
    io::write_npy<float>(tmp, core::DType::f32, shape, f.data());
  }
  std::filesystem::rename(tmp, dst);
}

template <class S>
DecodeResult run_typed(const comm::Comm& comm, const DecodeConfig& c, const core::Shape& s0) {
  using A = core::accum_t<S>;
  const int N = comm.size(), r = comm.rank();
  const Index B = s0.B, H = s0.H, HKV = s0.HKV, D = s0.D, S0 = c.cache_len, T = c.new_tokens, K = c.steps;
  const Index S_all = S0 + K * T;
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
  std::unique_ptr<KVCacheShard<S>> cache;
  agreed(comm, [&] { cache = std::make_unique<KVCacheShard<S>>(comm, ko, cli_names()); });

  // The prompt: this rank's positions of the global tensors.
  const std::vector<Index> pos = cache->prompt_positions(S0);
  std::vector<core::Run> runs;
  for (Index i = 0; i < Index(pos.size()); ++i) {
    if (!runs.empty() && runs.back().global_begin + runs.back().length == pos[i]) ++runs.back().length;
    else runs.push_back({pos[i], i, 1});
  }
  const Index L = Index(pos.size());
  const auto q0 = generate<S>(c.seed, InputTensor::q, B, S_all, H * D, runs, L);
  const auto k0 = generate<S>(c.seed, InputTensor::k, B, S_all, HKV * D, runs, L);
  const auto v0 = generate<S>(c.seed, InputTensor::v, B, S_all, HKV * D, runs, L);
  std::vector<A> o0(B * L * H * D), lse0(B * H * L);
  comm.barrier();
  double t0 = comm::wtime();
  cache->prefill(S0, q0.data(), k0.data(), v0.data(), o0.data(), lse0.data());
  double prefill = comm::wtime() - t0;
  comm.allreduce_max(std::span<double>(&prefill, 1));

  DecodeResult res;
  res.shape = core::Shape{B, S_all, H, HKV, D};
  res.ranks = N;
  res.prefill_s = prefill;
  std::vector<double> o_dec(B * K * T * H * D), lse_dec(B * H * K * T);
  std::vector<double> step, merge, slowest;
  std::vector<A> o(B * T * H * D), lse(B * H * T);
  Index kv_bytes = 0;
  for (Index j = 0; j < K; ++j) {
    const core::Run run{S0 + j * T, 0, T};
    const std::span<const core::Run> one(&run, 1);
    const auto q = generate<S>(c.seed, InputTensor::q, B, S_all, H * D, one, T);
    const auto k = generate<S>(c.seed, InputTensor::k, B, S_all, HKV * D, one, T);
    const auto v = generate<S>(c.seed, InputTensor::v, B, S_all, HKV * D, one, T);
    comm.barrier();
    const DecodeStats st = cache->decode(T, q.data(), k.data(), v.data(), o.data(), lse.data());
    step.push_back(st.step_s);
    merge.push_back(st.merge_s);
    double sl = st.step_s;
    comm.allreduce_max(std::span<double>(&sl, 1));
    slowest.push_back(sl);
    kv_bytes = st.kv_bytes;
    // The same O, bit for bit, on every rank.
    const std::int64_t h = std::int64_t(digest(o.data(), o.size() * sizeof(A)) >> 1);
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
  // Per rank: its cache, the bytes one step read, its median step and merge.
  const double mine[3] = {double(cache->local_positions()), step.empty() ? 0 : core::median(step),
                          merge.empty() ? 0 : core::median(merge)};
  const auto per_rank = comm.all_gatherv(std::span<const double>(mine, 3));
  const auto bytes = comm.all_gather(kv_bytes);
  for (int q = 0; q < N; ++q) {
    res.cache_positions.push_back(Index(per_rank[q][0]));
    res.step_s.push_back(per_rank[q][1]);
    res.merge_s.push_back(per_rank[q][2]);
    res.kv_bytes_per_step.push_back(bytes[q]);
  }
  res.stream_bytes_per_s = r == 0 ? stream_read_bandwidth() : 0;  // rank 0's core, as the summary and report show

  // The prompt's O and LSE, gathered to rank 0 in global order.
  const core::Layout prompt_layout = make_layout(c.layout, S0, N, {}, true, c.window.value_or(0), cli_names());
  std::vector<double> o0d(o0.begin(), o0.end()), lse0d(lse0.begin(), lse0.end());
  const auto o_prefill = gather_positions(comm, o0d, B, H * D, prompt_layout, 0);
  const auto lse_prefill = gather_positions(comm, lse0d, B * H, 1, prompt_layout, 0);
  if (r == 0 && (c.check || !c.out.empty())) {
    const core::DType file = core::accum_dtype(core::dtype_of<S>());
    const auto gq = global_f64<S>(c.seed, InputTensor::q, B, S_all, H * D);
    const auto gk = global_f64<S>(c.seed, InputTensor::k, B, S_all, HKV * D);
    const auto gv = global_f64<S>(c.seed, InputTensor::v, B, S_all, HKV * D);
    if (c.check) {
      const core::Mask mask = core::Mask::make(S_all, true, c.window.value_or(0), {});
      const double scale = c.scale ? *c.scale : 1.0 / std::sqrt(double(D));
      const std::vector<double> no_dout(gq.size(), 0.0);
      const core::DenseResult ref = core::reference_attention(res.shape, mask, scale, gq, gk, gv, no_dout, false);
      res.checked = true;
      res.tolerance = check_tolerance(core::dtype_of<S>());
      res.err_o_prefill = core::max_rel_error(o_prefill, rows(ref.o, B, S_all, H * D, 0, S0));
      res.err_lse_prefill = core::max_rel_error(lse_prefill, rows(ref.lse, B * H, S_all, 1, 0, S0), 1.0);
      res.err_o_decode = core::max_rel_error(o_dec, rows(ref.o, B, S_all, H * D, S0, K * T));
      res.err_lse_decode = core::max_rel_error(lse_dec, rows(ref.lse, B * H, S_all, 1, S0, K * T), 1.0);
      res.passed = std::max({res.err_o_prefill, res.err_lse_prefill, res.err_o_decode, res.err_lse_decode}) <=
                   res.tolerance;
    }
    if (!c.out.empty()) {
      write_file(c.out, "q.npy", file, {B, S_all, H, D}, gq);
      write_file(c.out, "k.npy", file, {B, S_all, HKV, D}, gk);
      write_file(c.out, "v.npy", file, {B, S_all, HKV, D}, gv);
      write_file(c.out, "o_prefill.npy", file, {B, S0, H, D}, o_prefill);
      write_file(c.out, "o_decode.npy", file, {B, K * T, H, D}, o_dec);
    }
  }
  int flags[2] = {res.passed ? 0 : 1, res.identical_on_every_rank ? 0 : 1};
  std::int64_t f[2] = {flags[0], flags[1]};
  comm.allreduce_max(std::span<std::int64_t>(f, 2));
  res.passed = f[0] == 0;
  res.identical_on_every_rank = f[1] == 0;
  res.exit_code = (res.passed && res.identical_on_every_rank) ? kExitOk : kExitCheckFailed;
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
  cfg["seed"] = static_cast<std::int64_t>(c.seed);
  j["config"] = cfg;
  io::Json t = io::Json::object();
  t["prefill_s"] = r.prefill_s;
  t["decode_step_s"] = r.decode_step_s;
  j["time"] = t;
  j["stream_bytes_per_s"] = r.stream_bytes_per_s;
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
    rr["decode"] = d;
    ranks.push_back(rr);
  }
  j["ranks"] = ranks;
  return j;
}

}  // namespace

double stream_read_bandwidth() {
  // 128 MiB of floats, past any core's share of the last-level cache; four sums so the adds do not
  // chain; the better of two passes.
  static const double measured = [] {
    const std::size_t n = std::size_t(32) << 20;
    std::vector<float> buf(n, 1.0f);
    double best = 0;
    for (int rep = 0; rep < 2; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (std::size_t i = 0; i < n; i += 4) {
        s0 += buf[i];
        s1 += buf[i + 1];
        s2 += buf[i + 2];
        s3 += buf[i + 3];
      }
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      volatile float sink = s0 + s1 + s2 + s3;
      (void)sink;
      best = std::max(best, double(n * sizeof(float)) / dt);
    }
    return best;
  }();
  return measured;
}

DecodeResult run_decode(comm::Comm& comm, const DecodeConfig& c) {
  core::Shape s;
  core::DType dtype = core::DType::f32;
  agreed(comm, [&] {
    if (c.cache_len < 1) throw InputError(fmt::format("--cache-len: {} is not >= 1", c.cache_len));
    if (c.new_tokens < 1)
      throw InputError(fmt::format("--new-tokens: {} is not >= 1 (a decode step adds T >= 1 tokens)", c.new_tokens));
    if (c.steps < 0) throw InputError(fmt::format("--steps: {} is negative", c.steps));
    s = core::Shape{c.batch.value_or(kDefaultBatch), c.cache_len + c.steps * c.new_tokens,
                    c.heads.value_or(kDefaultHeads), 0, c.head_dim.value_or(kDefaultHeadDim)};
    s.HKV = c.kv_heads.value_or(s.H);
    check_shape(s, cli_names());
    dtype = parse_dtype(c.dtype, cli_names());
    if (!c.out.empty() && !std::filesystem::is_directory(c.out))
      throw InputError(fmt::format("--out {}: is not a directory (expected a writable directory)", c.out));
  });
  if (c.timeout_s && !(std::isfinite(*c.timeout_s) && *c.timeout_s >= 0))
    throw InputError(fmt::format("--timeout: {} is not a time (expected SEC >= 0; 0 disables the watchdog)",
                                 *c.timeout_s));
  // The plan's default watchdog, for the prompt's ring and (with --check) the reference on rank 0.
  const double check_flops = c.check ? 4.0 * double(s.B) * double(s.S) * double(s.S) * double(s.H * s.D) : 0.0;
  comm.set_timeout(c.timeout_s.value_or(default_timeout(s, s.S, false, check_flops)));
  DecodeResult res = core::with_storage(dtype, [&]<class S>() { return run_typed<S>(comm, c, s); });
  res.dtype = core::dtype_name(dtype);
  res.layout = core::layout_name(make_layout(c.layout, c.cache_len, comm.size(), {}, true, c.window.value_or(0),
                                             cli_names()).kind());
  res.mask = c.window ? fmt::format("causal window {}", *c.window) : "causal";
  res.report = report_json(c, res);
  if (comm.rank() == 0 && !c.report.empty()) io::write_text_atomically(c.report, res.report.dump() + "\n");
  return res;
}

}  // namespace ringattn::runtime
