// ringattn._ringattn: the Python binding of ringattn::Attention (ringattn/ringattn.hpp).
// The communicator comes from mpi4py's C API, so any mpi4py communicator works (COMM_WORLD or a
// sub-communicator of a data-parallel x context-parallel job). Tensors pass as raw pointers to
// CPU memory that python/ringattn/__init__.py keeps alive and sizes: no copies at the boundary.
// This is the one file outside src/comm that sees <mpi.h> (mpi4py's header needs it).
//
// No MPI call and no compute holds the GIL: another Python thread may be in a collective of its own
// communicator that this one's peers need to finish first.
#include <mpi4py/mpi4py.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ringattn/ringattn.hpp"
#include "ringattn/runtime/agreement.hpp"

namespace py = pybind11;
using ringattn::Index;
using ringattn::InputError;

namespace {

// An optional option in a plan's reuse key: its value, or "-" when not given (0 given is not
// "none": the plan refuses it, and a reused plan must not accept it).
template <class T>
std::string given(const std::optional<T>& x) {
  return x ? std::to_string(*x) : std::string("-");
}

std::string shape_text(const std::vector<Index>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

const char* storage_dtype(const std::string& torch_name) {
  if (torch_name == "float32") return "f32";
  if (torch_name == "float64") return "f64";
  if (torch_name == "bfloat16") return "bf16";
  if (torch_name == "float16") return "f16";
  return nullptr;
}

// This rank's own checks of q [B, L, H, D], k, v [B, L, HKV, D] (no communication).
void check_tensors(const std::vector<Index>& q, const std::vector<Index>& k, const std::vector<Index>& v,
                   const std::vector<std::string>& dtypes) {
  const char* names[] = {"q", "k", "v"};
  const std::vector<Index>* shapes[] = {&q, &k, &v};
  for (int t = 0; t < 3; ++t)
    if (shapes[t]->size() != 4)
      throw InputError(fmt::format("{}: shape {} has {} dims (expected [B, L, {}, D])", names[t],
                                   shape_text(*shapes[t]), shapes[t]->size(), t == 0 ? "H" : "HKV"));
  if (!storage_dtype(dtypes[0]))
    throw InputError(fmt::format("q: dtype {} is not supported (expected float32, float64, bfloat16 or float16)",
                                 dtypes[0]));
  for (int t = 1; t < 3; ++t)
    if (dtypes[t] != dtypes[0])
      throw InputError(fmt::format("{}: dtype {} differs from q's {} (expected q, k and v of one dtype)", names[t],
                                   dtypes[t], dtypes[0]));
  if (v != k)
    throw InputError(fmt::format("v: shape {} differs from k's {} (expected the same [B, L, HKV, D])", shape_text(v),
                                 shape_text(k)));
  if (k[0] != q[0] || k[1] != q[1] || k[3] != q[3])
    throw InputError(fmt::format("k: shape {} does not match q's {} (expected [B, L, HKV, D] with q's B, L and D)",
                                 shape_text(k), shape_text(q)));
}

template <class T>
std::span<T> view(std::uintptr_t ptr, Index n) {
  return {reinterpret_cast<T*>(ptr), static_cast<std::size_t>(n)};
}

// Plans kept for reuse. A training step calls attention with the same plan every step; building
// one (duplicating the communicator, agreeing, allocating the strategy's buffers) costs
// milliseconds, so a call whose backward has finished leaves its plan here for the next call with
// the same arguments. The ranks reuse only together: every rank looks up its own cache, and one
// all-reduce over the caller's communicator confirms that all of them found the plan built by the
// same collective construction (the same shared arguments and the same build number). Otherwise
// every rank builds a new plan the checked way.
struct Plan {
  std::string shared;  // the arguments every rank holds the same
  std::string local;   // this rank's own: its communicator's handle, its shard's shape
  std::uint64_t build = 0;  // the n-th plan built with these shared arguments (the same on every rank)
  std::unique_ptr<ringattn::Attention> att;
};

//
// Threads share the cache (each on its own communicator), so every access holds its lock; no
// collective runs under it. Build numbers count per communicator: constructions over one
// communicator run in the same order on every rank, whatever other threads do meanwhile.
class PlanCache {
 public:
  static constexpr std::size_t kMaxIdle = 8;
  // The idle plan of the lowest build number for these arguments whose communicator is still
  // the caller's (same group, same order), or nothing.
  std::optional<Plan> take(const std::string& shared, const std::string& local, MPI_Comm caller) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (it->shared != shared || it->local != local) continue;
      int same = MPI_UNEQUAL;
      MPI_Comm_compare(caller, reinterpret_cast<MPI_Comm>(it->att->comm().native()), &same);
      if (same != MPI_CONGRUENT && same != MPI_IDENT) continue;
      if (best == idle_.end() || it->build < best->build) best = it;
    }
    if (best == idle_.end()) return std::nullopt;
    Plan p = std::move(*best);
    idle_.erase(best);
    return p;
  }
  void give_back(Plan p) {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.push_back(std::move(p));
    if (idle_.size() > kMaxIdle) idle_.erase(idle_.begin());  // the longest idle
  }
  std::uint64_t next_build(const std::string& shared, const std::string& local) {
    std::lock_guard<std::mutex> lock(mutex_);
    return builds_[shared + " | " + local]++;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.clear();
  }
  void hit() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++hits_;
  }
  std::size_t hits() {
    std::lock_guard<std::mutex> lock(mutex_);
    return hits_;
  }

 private:
  std::mutex mutex_;
  std::size_t hits_ = 0;
  std::vector<Plan> idle_;
  std::map<std::string, std::uint64_t> builds_;
};

PlanCache& plans() {
  static PlanCache* c = new PlanCache;  // never destroyed: its communicators may outlive MPI
  return *c;
}

std::uint64_t digest(const std::string& s, std::uint64_t build) {
  return ringattn::runtime::digest_bytes(s.data(), s.size(), ringattn::runtime::kDigestSeed ^ build);
}

// Polls `req` to completion under the watchdog `timeout_s` (0: none), as every wait of a plan is:
// a peer may never come (it raised, skipped the call, or is still in an earlier step). No plan
// carries the watchdog here; on timeout, rank `rank` prints one line, "timeout: " and `what` (the
// wait and who failed to come), and the job ends (exit 3), as the plan's watchdog does.
void wait_watched(MPI_Request& req, int rank, double timeout_s, const std::function<std::string()>& what) {
  const double t0 = MPI_Wtime();
  double pause = 0;  // seconds between polls once the first millisecond has passed
  for (;;) {
    int done = 0;
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    const double waited = MPI_Wtime() - t0;
    if (timeout_s > 0 && waited > timeout_s) {
      fmt::print(stderr, "[rank {}] timeout: {}; aborting the job\n", rank, what());
      ringattn::comm::abort_job(ringattn::kExitRuntime);
    }
    if (waited > 1e-3) {
      pause = std::min(1e-3, std::max(2e-5, 1.5 * pause));
      std::this_thread::sleep_for(std::chrono::duration<double>(pause));
    }
  }
}

// The all-reduce every call begins with, over the caller's own communicator, under the watchdog.
void setup_allreduce(MPI_Comm comm, std::uint64_t* v, int n, double timeout_s) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Request req;
  if (MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_UINT64_T, MPI_MIN, comm, &req) != MPI_SUCCESS)
    throw ringattn::RuntimeFailure("ringattn.attention: MPI_Iallreduce failed on the caller's communicator");
  wait_watched(req, rank, timeout_s, [&] {
    return fmt::format("the setup of ringattn.attention on rank {} (an all-reduce over the caller's communicator of "
                       "{} ranks) did not complete within timeout={} s: a peer has not called attention (it raised, "
                       "skipped the call or is still in an earlier step)",
                       rank, size, timeout_s);
  });
}

// The collectives of the package's own agreements outside a plan (KVCache's, in __init__.py's
// _agree), under the watchdog `timeout_s` (0: none); `what` names the call in the timeout's line.
// Without the GIL, as every wait here.
struct Watched {
  MPI_Comm comm;
  int rank = 0, size = 1;
  double timeout_s;
  std::string what;

  Watched(py::object c, double timeout, std::string w) : timeout_s(timeout), what(std::move(w)) {
    MPI_Comm* handle = PyMPIComm_Get(c.ptr());
    if (!handle) throw py::error_already_set();
    comm = *handle;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
  }
  void wait(MPI_Request& req, const char* op) const {
    wait_watched(req, rank, timeout_s, [&] {
      return fmt::format("{} on rank {} ({} over {} ranks) did not complete within timeout={} s: a peer has not "
                         "called it (it raised, skipped the call or is still in an earlier step)",
                         what, rank, op, size, timeout_s);
    });
  }
  // The sum of every rank's `value`.
  std::int64_t sum(std::int64_t value) const {
    MPI_Request req;
    if (MPI_Iallreduce(MPI_IN_PLACE, &value, 1, MPI_INT64_T, MPI_SUM, comm, &req) != MPI_SUCCESS)
      throw ringattn::RuntimeFailure(what + ": MPI_Iallreduce failed");
    wait(req, "an all-reduce");
    return value;
  }
  // The lowest failing rank's `error` on every rank ("" when no rank's is; at most 64 KiB of it).
  std::string agree(std::string error) const {
    if (error.size() > 65536) error.resize(65536);  // a message quoting a huge argument stays one MPI count
    std::uint64_t first = error.empty() ? std::uint64_t(size) : std::uint64_t(rank);
    MPI_Request req;
    if (MPI_Iallreduce(MPI_IN_PLACE, &first, 1, MPI_UINT64_T, MPI_MIN, comm, &req) != MPI_SUCCESS)
      throw ringattn::RuntimeFailure(what + ": MPI_Iallreduce failed");
    wait(req, "an all-reduce");
    if (first == std::uint64_t(size)) return {};
    const int root = static_cast<int>(first);
    std::uint64_t length = error.size();
    if (MPI_Ibcast(&length, 1, MPI_UINT64_T, root, comm, &req) != MPI_SUCCESS)
      throw ringattn::RuntimeFailure(what + ": MPI_Ibcast failed");
    wait(req, "a broadcast");
    error.resize(length);
    if (MPI_Ibcast(error.data(), static_cast<int>(length), MPI_CHAR, root, comm, &req) != MPI_SUCCESS)
      throw ringattn::RuntimeFailure(what + ": MPI_Ibcast failed");
    wait(req, "a broadcast");
    return error;
  }
};

// Agreement on this rank's own error before the plan (ranks that disagree about everything else
// still agree here): every rank throws the lowest failing rank's, InputError for bad input and
// AgreedFailure for anything else (out of memory preparing its tensors, say).
void agree_local(const ringattn::comm::Group& g, std::string error, bool failure, const std::function<void()>& check) {
  if (error.empty()) {
    try {
      check();
    } catch (const InputError& e) {
      error = e.what();
    }
  }
  const std::string mine = error.empty() ? "" : (failure ? "F" : "I") + error;
  if (auto e = g.agree(mine)) {
    if ((*e)[0] == 'I') throw InputError(e->substr(1));
    throw ringattn::AgreedFailure(e->substr(1));
  }
}

// One attention call on this rank, from the forward to the backward.
class Call {
 public:
  // `error`: this rank's own problem with its arguments or tensors, found in Python ("" when none;
  // `failure` when it is not bad input); every rank raises it. Collective over `comm`.
  Call(py::object comm, Index seq_len, std::vector<Index> q, std::vector<Index> k, std::vector<Index> v,
       std::vector<std::string> dtypes, std::string error, bool failure, bool causal, std::optional<Index> window,
       std::vector<Index> doc_lens, std::string layout, std::vector<Index> partition, std::optional<double> scale,
       std::optional<double> rope, std::string strategy, std::optional<int> ulysses_degree,
       std::optional<int> kv_head_group, std::optional<double> timeout, std::optional<double> softcap,
       std::vector<double> sinks, std::vector<Index> cu_seqlens, std::string precision)
      : q_(std::move(q)), k_(std::move(k)) {
    MPI_Comm* handle = PyMPIComm_Get(comm.ptr());
    if (!handle) throw py::error_already_set();
    const MPI_Comm mpi = *handle;
    py::gil_scoped_release unlocked;  // from here on: MPI and C++ only
    ringattn::AttentionOptions o;
    o.layout = std::move(layout);
    o.partition = std::move(partition);
    o.causal = causal;
    o.window = window;
    o.doc_lens = std::move(doc_lens);
    o.scale = scale;
    o.rope_theta = rope;
    o.strategy = std::move(strategy);
    o.ulysses_degree = ulysses_degree;
    o.kv_head_group = kv_head_group;
    o.timeout_s = timeout;
    o.softcap = softcap;
    o.sinks = sinks;
    o.cu_seqlens = std::move(cu_seqlens);
    o.precision = std::move(precision);
    int size = 1;
    MPI_Comm_size(mpi, &size);
    const bool shaped = q_.size() == 4 && k_.size() == 4;
    const std::string shared = fmt::format(
        "N={} S={} B={} H={} HKV={} D={} {} causal={} window={} docs={} cu={} {} part={} scale={} rope={} {} U={} G={} "
        "timeout={} softcap={} sinks={} precision={}",
        size, seq_len, shaped ? q_[0] : -1, shaped ? q_[2] : -1, shaped ? k_[2] : -1, shaped ? q_[3] : -1,
        fmt::join(dtypes, ","), causal, given(window), fmt::join(o.doc_lens, ","), fmt::join(o.cu_seqlens, ","),
        o.layout, fmt::join(o.partition, ","), scale ? fmt::format("{:a}", *scale) : "-",
        rope ? fmt::format("{:a}", *rope) : "-", o.strategy, given(ulysses_degree), given(kv_head_group),
        timeout ? fmt::format("{:a}", *timeout) : "default", softcap ? fmt::format("{:a}", *softcap) : "-",
        sinks.size(), o.precision);  // a plan with sinks is reused with the call's values (set_sinks)
    // The communicator's handle differs between processes: it is this rank's own part of the key.
    const std::string local = fmt::format("{:x} {}/{}/{}", reinterpret_cast<std::uintptr_t>(mpi), shape_text(q_),
                                          shape_text(k_), shape_text(v));
    // The watchdog of the setup: the one asked for, or the plan's default for this rank's shard.
    const double watchdog =
        timeout ? *timeout
                : ringattn::runtime::default_timeout(shaped ? ringattn::core::Shape{q_[0], seq_len, q_[2], k_[2], q_[3]}
                                                            : ringattn::core::Shape{1, 1, 1, 1, 1},
                                                     shaped ? q_[1] : 1, true, 0);

    // Reuse only when every rank found the same plan: min(found), and min/max of the digests. A rank
    // with an error of its own finds none, so every rank goes on to the checked construction.
    std::optional<Plan> cached;
    if (error.empty()) cached = plans().take(shared, local, mpi);
    const std::uint64_t d = cached ? digest(shared, cached->build) : 0;
    std::uint64_t agree[3] = {cached ? 1u : 0u, d, ~d};
    setup_allreduce(mpi, agree, 3, watchdog);
    if (agree[0] == 1 && agree[1] == ~agree[2]) {
      plan_ = std::move(*cached);
      plans().hit();
      if (!sinks.empty()) plan_.att->set_sinks(sinks);  // collective: every rank reuses its plan here
      return;
    }
    if (cached) plans().give_back(std::move(*cached));  // not every rank has it: build anew, checked

    // Every rank came to the all-reduce, so every rank comes here: the duplicate completes.
    ringattn::comm::Comm c = ringattn::comm::Comm::duplicate_of(&mpi);
    c.set_timeout(watchdog);
    agree_local(c, error, failure, [&] {
      check_tensors(q_, k_, v, dtypes);
      o.shape = ringattn::core::Shape{q_[0], seq_len, q_[2], k_[2], q_[3]};
      o.dtype = storage_dtype(dtypes[0]);
    });
    // The shard's length is checked against the plan before the strategy allocates its buffers.
    auto check_shard = [&](const ringattn::Attention& att) {
      if (q_[1] == att.local_size()) return;
      const auto kind = ringattn::core::layout_name(att.layout().kind());
      throw InputError(fmt::format(
          "q: rank {} holds L = {} positions, but the {} layout of seq_len = {} over {} ranks gives it {} (expected "
          "q [B, {}, H, D]; ringattn.positions({}, {}, {}, layout='{}') lists them)",
          att.rank(), q_[1], kind, seq_len, att.ranks(), att.local_size(), att.local_size(), seq_len, att.ranks(),
          att.rank(), kind));
    };
    auto att = std::make_unique<ringattn::Attention>(std::move(c), o, ringattn::runtime::python_names(), check_shard);
    plan_ = Plan{shared, local, plans().next_build(shared, local), std::move(att)};
  }

  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  // A plan whose last pass completed goes back for reuse.
  ~Call() {
    if (plan_.att && clean_) plans().give_back(std::move(plan_));
  }

  std::string dtype() const { return ringattn::core::dtype_name(plan_.att->dtype()); }
  Index local_size() const { return plan_.att->local_size(); }

  // q, k, v in the storage dtype; o [B, L, H, D] and lse [B, H, L] in the accumulation dtype
  // (float64 for float64, float32 otherwise).
  void forward(std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o, std::uintptr_t lse) {
    py::gil_scoped_release unlocked;
    clean_ = false;  // until the pass completes on this rank
    ringattn::core::with_storage(plan_.att->dtype(), [&]<class S>() { run_forward<S>(q, k, v, o, lse); });
    clean_ = true;
  }

  // Instead of the backward, when this rank could not prepare it: every rank raises `why`.
  void refuse(const std::string& why) {
    py::gil_scoped_release unlocked;
    clean_ = false;
    plan_.att->refuse(why);
  }

  // dout in the storage dtype; dlse [B, H, L] (0: LSE has no gradient), dq, dk, dv and dsinks [H] (0:
  // none) in the accumulation dtype.
  void backward(std::uintptr_t dout, std::uintptr_t dlse, std::uintptr_t dq, std::uintptr_t dk, std::uintptr_t dv,
                std::uintptr_t dsinks) {
    py::gil_scoped_release unlocked;
    clean_ = false;
    ringattn::core::with_storage(plan_.att->dtype(),
                                 [&]<class S>() { run_backward<S>(dout, dlse, dq, dk, dv, dsinks); });
    clean_ = true;
  }

 private:
  Index q_elems() const { return q_[0] * q_[1] * q_[2] * q_[3]; }
  Index kv_elems() const { return k_[0] * k_[1] * k_[2] * k_[3]; }

  template <class S, class A = ringattn::core::accum_t<S>>
  void run_forward(std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o, std::uintptr_t lse) {
    plan_.att->load(view<const S>(q, q_elems()), view<const S>(k, kv_elems()), view<const S>(v, kv_elems()));
    plan_.att->forward();
    ringattn::Outputs<A> out;
    out.o = view<A>(o, q_elems());
    out.lse = view<A>(lse, q_[0] * q_[2] * q_[1]);
    plan_.att->outputs(out);
  }

  template <class S, class A = ringattn::core::accum_t<S>>
  void run_backward(std::uintptr_t dout, std::uintptr_t dlse, std::uintptr_t dq, std::uintptr_t dk, std::uintptr_t dv,
                    std::uintptr_t dsinks) {
    plan_.att->backward(view<const S>(dout, q_elems()), dlse ? view<const A>(dlse, q_[0] * q_[2] * q_[1])
                                                             : std::span<const A>());
    ringattn::Outputs<A> out;
    out.dq = view<A>(dq, q_elems());
    out.dk = view<A>(dk, kv_elems());
    out.dv = view<A>(dv, kv_elems());
    if (dsinks) out.dsinks = view<A>(dsinks, q_[2]);
    plan_.att->outputs(out);
  }

  std::vector<Index> q_, k_;
  Plan plan_;
  bool clean_ = true;  // no pass left half-done on this rank
};

py::array_t<std::int64_t> positions(Index seq_len, int ranks, int rank, const std::string& layout,
                                    const std::vector<Index>& partition, bool causal, std::optional<Index> window) {
  if (ranks < 1) throw InputError(fmt::format("ranks: {} is not >= 1", ranks));
  if (rank < 0 || rank >= ranks) throw InputError(fmt::format("rank: {} is outside 0..{}", rank, ranks - 1));
  ringattn::runtime::check_window(window, ringattn::runtime::python_names());
  const auto l = ringattn::runtime::make_layout(layout, seq_len, ranks, partition, causal, window.value_or(0),
                                                ringattn::runtime::python_names());
  const auto p = l.positions(rank);
  py::array_t<std::int64_t> out(static_cast<py::ssize_t>(p.size()));
  std::copy(p.begin(), p.end(), out.mutable_data());
  return out;
}

}  // namespace

void bind_kv_cache(py::module_& m);  // kv_cache_binding.cpp

PYBIND11_MODULE(_ringattn, m) {
  m.doc() = "ringattn's C++ runtime (use the ringattn package, not this module)";
  if (import_mpi4py() < 0) throw py::error_already_set();
  // Bad input: a ValueError with the library's one-line message, raised on every rank.
  py::register_exception<InputError>(m, "InputError", PyExc_ValueError);
  py::register_exception<ringattn::RuntimeFailure>(m, "RuntimeFailure", PyExc_RuntimeError);
  m.def("positions", &positions, py::arg("seq_len"), py::arg("ranks"), py::arg("rank"), py::arg("layout"),
        py::arg("partition"), py::arg("causal"), py::arg("window"));
  // Plans kept for reuse: how many calls reused one, and dropping them (their buffers).
  m.def("plans_reused", [] { return plans().hits(); });
  m.def("release_plans", [] { plans().clear(); });
  bind_kv_cache(m);
  // The package's agreements outside a plan, under a watchdog (see Watched).
  m.def("watched_sum", [](py::object comm, std::int64_t value, double timeout, std::string what) {
    const Watched w(comm, timeout, std::move(what));
    py::gil_scoped_release unlocked;
    return w.sum(value);
  });
  m.def("watched_agree", [](py::object comm, std::string error, double timeout, std::string what) {
    const Watched w(comm, timeout, std::move(what));
    py::gil_scoped_release unlocked;
    return w.agree(std::move(error));
  });
  py::class_<Call>(m, "Call")
      .def(py::init<py::object, Index, std::vector<Index>, std::vector<Index>, std::vector<Index>,
                    std::vector<std::string>, std::string, bool, bool, std::optional<Index>, std::vector<Index>,
                    std::string, std::vector<Index>, std::optional<double>, std::optional<double>, std::string,
                    std::optional<int>, std::optional<int>, std::optional<double>, std::optional<double>,
                    std::vector<double>, std::vector<Index>, std::string>())
      .def_property_readonly("dtype", &Call::dtype)
      .def_property_readonly("local_size", &Call::local_size)
      .def("forward", &Call::forward)
      .def("refuse", &Call::refuse)
      .def("backward", &Call::backward);
}
