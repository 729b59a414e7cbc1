#include "ringattn/runtime/staged_outputs.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <random>

#include "ringattn/core/errors.hpp"
#include "ringattn/io/npy.hpp"
#include "ringattn/runtime/agreement.hpp"
#include "ringattn/runtime/paths.hpp"
#include "staging.hpp"

namespace ringattn::runtime {

namespace fs = std::filesystem;

const std::vector<std::string>& own_output_names() {
  static const std::vector<std::string> names = {"o",  "lse", "dq", "dk", "dv",  "q",   "k",   "v",   "dout", "y",  "dx",
                                                 "dwq", "dwk", "dwv", "dwo", "x", "wq", "wk", "wv", "wo", "dy",
                                                 "o_prefill", "o_decode", "dsinks"};
  return names;
}

// ---- what a signal removes ----------------------------------------------------------------------
// The handler only calls unlink, rmdir and _exit (async-signal-safe) on paths stored beforehand.
// During a commit (rank 0) it only notes the signal: the commit finishes (it takes milliseconds)
// and then ends the process. Once a rank has handed the staged files over to rank 0's commit
// (commit() below), its handler removes nothing: the files may be what an interrupted commit's
// journal needs, and only rank 0 (or whoever finishes that journal) may remove them.
namespace cleanup {
namespace {
constexpr int kMax = 48;
char paths[kMax][PATH_MAX];
volatile sig_atomic_t count = 0;
char dir[PATH_MAX];
volatile sig_atomic_t have_dir = 0;
volatile sig_atomic_t in_commit = 0;
volatile sig_atomic_t handed_over = 0;
volatile sig_atomic_t pending = 0;

extern "C" void on_signal(int sig) {
  if (in_commit) {
    pending = sig;
    return;
  }
  if (!handed_over) {
    for (int i = 0; i < count; ++i) ::unlink(paths[i]);
    if (have_dir) ::rmdir(dir);
  }
  ::_exit(128 + sig);
}

void add(const std::string& p) {
  if (count == kMax || p.size() >= sizeof(paths[0])) return;
  std::memcpy(paths[count], p.c_str(), p.size() + 1);
  std::atomic_signal_fence(std::memory_order_release);
  count = count + 1;
}

void set_dir(const std::string& d) {
  if (d.size() >= sizeof(dir)) return;
  std::memcpy(dir, d.c_str(), d.size() + 1);
  std::atomic_signal_fence(std::memory_order_release);
  have_dir = 1;
}

void clear() {
  have_dir = 0;
  count = 0;
  handed_over = 0;
}
}  // namespace
}  // namespace cleanup

void install_exit_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = cleanup::on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
}

using namespace staging;  // the paths and the journal (staging.hpp)


struct StagedOutputs::Impl {
  const comm::Group& group;
  OutputPaths p;
  std::string id, stage_dir;
  std::string dir;                  // --out resolved once (symlinks followed) when the job starts
  std::vector<std::string> staged;  // final names (with .npy) of the staged files
  TextTarget report, trace;
  bool have_report = false, have_trace = false, staged_any = false, created_out = false;
  int kill_at_step = 0, fail_at_step = 0, steps = 0;  // RINGATTN_DEBUG_{KILL,FAIL}_AT_COMMIT_STEP (tests)

  Impl(const comm::Group& g, OutputPaths paths) : group(g), p(std::move(paths)) {}

  std::string final_path(const std::string& file) const { return path_in(dir, file); }
  std::string stage_path(const std::string& file) const { return path_in(stage_dir, file); }

  // Hidden test hooks: rank 0 kills itself with SIGKILL right after the k-th change its commit
  // makes to --out (RINGATTN_DEBUG_KILL_AT_COMMIT_STEP=k, k >= 1), or fails there as a rename
  // would (RINGATTN_DEBUG_FAIL_AT_COMMIT_STEP=k; only up to the last move, after which nothing
  // can fail).
  void step(bool move) {
    ++steps;
    if (steps == kill_at_step) ::raise(SIGKILL);
    if (move && steps == fail_at_step)
      throw RuntimeFailure(fmt::format("cannot go on after step {} (RINGATTN_DEBUG_FAIL_AT_COMMIT_STEP)", steps));
  }

  // --out: every name at most NAME_MAX, the whole at most PATH_MAX with the job's own hidden names
  // under it, an existing writable directory or a new name in one. Resolved here, once, so a
  // symlink swapped later does not split the job's files between two directories.
  void validate_out() {
    // A path too long to use is shown by its ends, so that the error stays one readable line.
    const std::string& o = p.out_dir;
    const std::string out = o.size() <= 160 ? fmt::format("--out {}", o)
                                            : fmt::format("--out {}...{}", o.substr(0, 100), o.substr(o.size() - 40));
    std::string given = p.out_dir;
    while (given.size() > 1 && given.back() == '/') given.pop_back();
    for (const auto& part : fs::path(given))
      if (part.string().size() > NAME_MAX)
        throw InputError(fmt::format("{}: the name {:.40}... is {} characters long (expected at most {})", out,
                                     part.string(), part.string().size(), NAME_MAX));
    if (given.size() >= PATH_MAX)
      throw InputError(fmt::format("{}: the path is {} characters long (expected at most {})", out, given.size(),
                                   PATH_MAX - 1));
    struct stat st {};
    if (::stat(given.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) throw InputError(fmt::format("{}: is not a directory (expected a writable directory)", out));
      probe_writable(given, out);
      char buf[PATH_MAX];
      if (!::realpath(given.c_str(), buf))
        throw InputError(fmt::format("{}: cannot be resolved: {} (expected a writable directory)", out, errno_text()));
      dir = buf;
    } else if (errno == ENOENT || errno == ENOTDIR) {
      if (::lstat(given.c_str(), &st) == 0)
        throw InputError(fmt::format("{}: is a symlink to nothing (expected a directory or a new name)", out));
      const std::size_t slash = given.rfind('/');
      const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : given.substr(0, slash);
      const std::string name = slash == std::string::npos ? given : given.substr(slash + 1);
      struct stat ps {};
      if (::stat(parent.c_str(), &ps) != 0 || !S_ISDIR(ps.st_mode))
        throw InputError(fmt::format("{}: its parent {} is not a directory (expected an existing parent)", out, parent));
      if (name == "." || name == "..")
        throw InputError(fmt::format("{}: names no directory (expected a directory name)", out));
      probe_writable(parent, out);
      char buf[PATH_MAX];
      if (!::realpath(parent.c_str(), buf))
        throw InputError(fmt::format("{}: its parent {} cannot be resolved: {}", out, parent, errno_text()));
      dir = path_in(buf, name);
    } else {
      throw InputError(fmt::format("{}: {} (expected a writable directory)", out, errno_text()));
    }
    // The longest path the job makes: DIR/.ringattn-<job>.commit-new, DIR/.ringattn-<job>.tmp/dout.npy ...
    const std::size_t longest = dir.size() + 1 + hidden_name(id, ".commit-new").size() + 1 + 16;
    if (longest >= PATH_MAX)
      throw InputError(fmt::format("{}: the path is {} characters long once resolved (expected at most {})", out,
                                   dir.size(), PATH_MAX - 1 - (longest - dir.size())));
  }

  void validate() {
    if (!p.out_dir.empty()) {
      validate_out();
      for (const std::string& name : p.writes)
        if (const std::string final = final_path(name + ".npy"); is_input(final))
          throw InputError(fmt::format("--out {}: holds the input {} under the output name {}.npy, which the "
                                       "commit would replace (expected the inputs outside --out, or another --out)",
                                       p.out_dir, input_at(final), name));
      recover_at_start();
    }
    if (!p.report.empty()) {
      report = resolve_text_target(p.report, "--report");
      have_report = true;
    }
    if (!p.trace.empty()) {
      trace = resolve_text_target(p.trace, "--trace");
      have_trace = true;
    }
    if (have_report && have_trace && same_file(report.path, trace.path))
      throw InputError(fmt::format("--report {}: is also the --trace file (expected two different files)", p.report));
    for (const TextTarget* t : {have_report ? &report : nullptr, have_trace ? &trace : nullptr}) {
      if (!t) continue;
      const char* opt = t == &report ? "--report" : "--trace";
      for (const std::string& in : p.inputs)
        if (same_file(t->path, in))
          throw InputError(fmt::format("{} {}: is the input file {} (expected a new file)", opt, t->given, in));
      if (!p.out_dir.empty() && same_file(t->path, dir))
        throw InputError(fmt::format("{} {}: is the --out directory (expected a file of another name)", opt, t->given));
      if (!p.out_dir.empty())
        for (const std::string& name : own_output_names())
          if (same_file(t->path, final_path(name + ".npy")))
            throw InputError(fmt::format("{} {}: is the output {}.npy of --out (expected another file)", opt,
                                         t->given, name));
    }
  }

  bool is_input(const std::string& path) const { return !input_at(path).empty(); }

  // The input as the user named it that is the file at path; empty if none is.
  std::string input_at(const std::string& path) const {
    const auto in =
        std::find_if(p.inputs.begin(), p.inputs.end(), [&](const std::string& i) { return same_file(i, path); });
    return in == p.inputs.end() ? std::string{} : *in;
  }

  // Rank 0, under the lock on DIR: what jobs that died left. A commit journal is finished (only
  // its job could hold the lock meanwhile, so the job is gone); a dead job's staging directory
  // goes, and so do the half-written files of an interrupted write.
  void sweep_abandoned() {
    std::error_code ec;
    const std::string host = host_name();
    std::vector<std::string> journals;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with(".ringattn-") && name.ends_with(".commit")) journals.push_back(e.path().string());
    }
    std::sort(journals.begin(), journals.end());
    for (const std::string& path : journals) {
      const std::optional<Journal> j = read_journal(path);
      if (!j || path_in(dir, hidden_name(j->id, ".commit")) != path)
        throw RuntimeFailure(fmt::format("--out {}: {} is not a journal this ringattn can finish; see "
                                         "docs/robustness-commit.md", p.out_dir, path));
      try {
        finish_journal(dir, *j, [](bool) {});
      } catch (const RuntimeFailure& e) {
        throw RuntimeFailure(fmt::format("--out {}: cannot finish the interrupted commit of job {}: {}; see "
                                         "docs/robustness-commit.md", p.out_dir, j->id, e.what()));
      }
    }
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 13 && name[0] == '.' && name.ends_with(".npy.partial")) fs::remove(e.path(), ec);
      if (!name.starts_with(".ringattn-")) continue;
      // Under the lock, a set-aside directory or a journal being written is never a live job's.
      const bool dead = name.ends_with(".old") || name.ends_with(".commit-new") || name.ends_with(".gone") ||
                        abandoned(name, host);
      if (!dead) continue;
      // A set-aside directory without a journal is empty, unless an older ringattn left it: then
      // its files go back where nothing has replaced them, as that version did.
      if (name.ends_with(".old"))
        for (const auto& f : fs::directory_iterator(e.path(), ec))
          if (!there(final_path(f.path().filename().string())))
            ::rename(f.path().c_str(), final_path(f.path().filename().string()).c_str());
      remove_tree(e.path().string());
    }
  }

  // Rank 0, when the job starts: finishes what a job that died while committing into --out left
  // (if no other job is committing there right now; that one does it).
  void recover_at_start() {
    const int lock = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock < 0) return;  // a new directory: nothing to recover
    struct Unlock {
      int fd;
      ~Unlock() { ::close(fd); }
    } unlock{lock};
    if (::flock(lock, LOCK_EX | LOCK_NB) != 0) return;
    try {
      sweep_abandoned();
    } catch (const RuntimeFailure& e) {
      throw InputError(e.what());
    }
  }

  // Under the lock: the old outputs go aside and the staged ones in, following a journal
  // published first (see finish_journal); a failure undoes it, so the old set stays.
  void commit_outputs() {
    const int lock = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock < 0 || ::flock(lock, LOCK_EX) != 0)
      throw RuntimeFailure(fmt::format("--out {}: cannot lock the directory: {}", p.out_dir, errno_text()));
    struct Unlock {
      int fd;
      ~Unlock() { ::close(fd); }
    } unlock{lock};
    sweep_abandoned();
    if (const char* k = std::getenv("RINGATTN_DEBUG_KILL_AT_COMMIT_STEP")) kill_at_step = std::atoi(k);
    if (const char* k = std::getenv("RINGATTN_DEBUG_FAIL_AT_COMMIT_STEP")) fail_at_step = std::atoi(k);
    steps = 0;
    // What goes aside: everything this run writes, and ringattn's names it does not (stale),
    // except the files it reads.
    Journal j;
    j.id = id;
    for (const std::string& name : own_output_names()) {
      const std::string file = name + ".npy", final = final_path(file);
      struct stat st {};
      if (::lstat(final.c_str(), &st) != 0) continue;
      const bool ours = std::find(staged.begin(), staged.end(), file) != staged.end();
      if (!ours && is_input(final)) continue;
      if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
        throw RuntimeFailure(fmt::format("--out {}: {} is not a file (expected a file or nothing there); nothing "
                                         "was changed", p.out_dir, file));
      j.aside.push_back(file);
    }
    for (const std::string& f : staged)
      if (!there(stage_path(f)))
        throw RuntimeFailure(fmt::format("--out {}: the staged {} is gone; nothing was changed", p.out_dir, f));
    j.place = staged;
    publish_journal(dir, j);
    staged_any = false;  // from here on the staged files belong to the journal, not to discard()
    try {
      step(true);
      finish_journal(dir, j, [this](bool move) { step(move); });
    } catch (const RuntimeFailure& e) {
      try {
        j.forward = false;
        publish_journal(dir, j);
        step(false);
        finish_journal(dir, j, [this](bool move) { step(move); });  // the hooks count on; none fails
      } catch (const RuntimeFailure& e2) {
        throw RuntimeFailure(fmt::format("--out {}: {}; undoing it failed too: {}; `sh {}` or the next job on "
                                         "--out finishes it", p.out_dir, e.what(), e2.what(),
                                         final_path(hidden_name(id, ".commit"))));
      }
      throw RuntimeFailure(fmt::format("--out {}: {}; the earlier outputs were kept", p.out_dir, e.what()));
    }
    cleanup::clear();
  }

  void commit_text(TextTarget& t) const {
    if (!t.set) return;
    if (!t.write_through) {
      rename_or_throw(t.temp, t.path);
      return;
    }
    const int fd = ::open(t.given.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) throw RuntimeFailure(fmt::format("cannot open {} for writing: {}", t.given, errno_text()));
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    try {
      write_all(fd, t.text, t.given);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  }

  void stage_text(TextTarget& t, std::string text) const {
    t.text = std::move(text);
    t.set = true;
    if (t.write_through) return;
    const fs::path dir = fs::path(t.path).parent_path();
    t.temp = (dir / (".ringattn-" + id + (&t == &report ? ".report" : ".trace"))).string();
    cleanup::add(t.temp);
    const int fd = ::open(t.temp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) throw RuntimeFailure(fmt::format("cannot create {}: {}", t.temp, errno_text()));
    try {
      write_all(fd, t.text, t.temp);
      if (::fsync(fd) != 0) throw RuntimeFailure(fmt::format("cannot flush {}: {}", t.temp, errno_text()));
    } catch (...) {
      ::close(fd);
      ::unlink(t.temp.c_str());
      throw;
    }
    ::close(fd);
  }
};

StagedOutputs::StagedOutputs(const comm::Group& group, OutputPaths paths)
    : impl_(std::make_unique<Impl>(group, std::move(paths))) {
  std::string err;
  if (group.rank() == 0) {
    try {
      impl_->id = job_id();
      impl_->validate();
    } catch (const InputError& e) {
      err = e.what();
    }
  }
  if (auto e = group.agree(err)) throw InputError(*e);
  group.broadcast(impl_->id, 0);
  group.broadcast(impl_->dir, 0);  // every rank writes where rank 0 resolved --out
  if (!impl_->p.out_dir.empty()) impl_->stage_dir = path_in(impl_->dir, hidden_name(impl_->id, ".tmp"));
}

StagedOutputs::~StagedOutputs() { discard(); }

void StagedOutputs::stage(const std::vector<OutputTensor>& files, const core::Layout& layout) {
  Impl& m = *impl_;
  if (m.p.out_dir.empty()) return;
  const comm::Group& g = m.group;
  const int r = g.rank();
  auto agreed = [&](auto&& fn) { agreed_runtime(g, fn); };
  m.staged_any = true;
  cleanup::set_dir(m.stage_dir);  // whichever rank a signal reaches removes the staging directory
  agreed([&] {
    if (r != 0) return;
    for (const OutputTensor& f : files)  // the constructor refused these for the names declared in `writes`
      if (m.is_input(m.final_path(f.name + ".npy")))
        throw RuntimeFailure(fmt::format("--out {}: {}.npy would replace an input of the job; nothing was changed",
                                         m.p.out_dir, f.name));
    if (!there(m.dir)) {
      if (::mkdir(m.dir.c_str(), 0777) != 0 && errno != EEXIST)
        throw RuntimeFailure(fmt::format("--out {}: cannot create it: {}", m.p.out_dir, errno_text()));
      m.created_out = true;
    }
    if (::mkdir(m.stage_dir.c_str(), 0700) != 0)
      throw RuntimeFailure(fmt::format("--out {}: cannot create {}: {}", m.p.out_dir, m.stage_dir, errno_text()));
  });
  for (const OutputTensor& f : files) {
    m.staged.push_back(f.name + ".npy");
    cleanup::add(m.stage_path(m.staged.back()));
  }
  agreed([&] {
    if (r != 0) return;
    for (const OutputTensor& f : files) {
      const std::string path = m.stage_path(f.name + ".npy");
      if (f.pos_axis != kWhole) io::create_npy(path, f.file_dtype, f.shape);
      else if (!f.f64.empty()) io::write_npy<double>(path, f.file_dtype, f.shape, f.f64.data());
      else io::write_npy<float>(path, f.file_dtype, f.shape, f.f32.data());
    }
  });
  const auto runs = layout.runs(r);
  agreed([&] {
    for (const OutputTensor& f : files) {
      if (f.pos_axis == kWhole) continue;
      const std::string path = m.stage_path(f.name + ".npy");
      if (!f.f64.empty() || f.f32.empty())
        io::write_npy_positions<double>(path, f.file_dtype, f.shape, f.pos_axis, runs, layout.size(r), f.f64.data());
      else
        io::write_npy_positions<float>(path, f.file_dtype, f.shape, f.pos_axis, runs, layout.size(r), f.f32.data());
    }
  });
}

void StagedOutputs::set_trace(std::string text) {
  if (impl_->have_trace) impl_->stage_text(impl_->trace, std::move(text));
}

void StagedOutputs::set_report(std::string text) {
  if (impl_->have_report) impl_->stage_text(impl_->report, std::move(text));
}

void StagedOutputs::commit() {
  Impl& m = *impl_;
  if (m.staged_any) {  // the same on every rank
    // The handover: from here on only rank 0 (or whoever finishes its journal) removes staged
    // files. A peer's signal handler (Open MPI sends SIGTERM when rank 0 dies) must not take
    // away what an interrupted commit still needs. Rank 0 starts only once every rank has.
#ifndef RINGATTN_SMPI
    if (m.group.rank() != 0) cleanup::handed_over = 1;
#endif
    if (auto e = m.group.agree(std::string())) throw AgreedFailure(*e);
  }
  std::string err;
  if (m.group.rank() == 0) {
    cleanup::in_commit = 1;
    try {
      if (m.staged_any) m.commit_outputs();
      m.commit_text(m.trace);
      m.commit_text(m.report);
    } catch (const std::exception& e) {
      err = e.what();
    }
    cleanup::in_commit = 0;
    if (const int sig = cleanup::pending) {
      if (!err.empty()) discard();
      ::_exit(128 + sig);
    }
  }
  if (auto e = m.group.agree(err)) throw AgreedFailure(*e);
  m.staged.clear();
  m.staged_any = false;
  m.created_out = false;
  m.report.set = m.trace.set = false;
  cleanup::clear();
}

void StagedOutputs::discard() noexcept {
  Impl& m = *impl_;
  if (m.group.rank() != 0) return;
  if (m.staged_any) remove_tree(m.stage_dir);
  for (TextTarget* t : {&m.report, &m.trace})
    if (t->set && !t->temp.empty()) ::unlink(t->temp.c_str());
  if (m.created_out) {
    std::error_code ec;
    fs::remove(m.dir, ec);  // only if still empty
  }
  m.staged_any = false;
  m.report.set = m.trace.set = false;
  cleanup::clear();
}

}  // namespace ringattn::runtime
