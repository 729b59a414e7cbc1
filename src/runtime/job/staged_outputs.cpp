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
#include <climits>
#include <cstring>
#include <filesystem>
#include <random>

#include "ringattn/core/errors.hpp"
#include "ringattn/io/npy.hpp"
#include "ringattn/runtime/agreement.hpp"
#include "ringattn/runtime/paths.hpp"

namespace ringattn::runtime {

namespace fs = std::filesystem;

const std::vector<std::string>& own_output_names() {
  static const std::vector<std::string> names = {"o",  "lse", "dq", "dk", "dv",  "q",   "k",   "v",   "dout", "y",  "dx",
                                                 "dwq", "dwk", "dwv", "dwo", "x", "wq", "wk", "wv", "wo", "dy"};
  return names;
}

// ---- what a signal removes ----------------------------------------------------------------------
// The handler only calls unlink, rmdir and _exit (async-signal-safe) on paths stored beforehand.
// During a commit it only notes the signal: the commit finishes (it takes milliseconds) and then
// ends the process, so an interrupted commit never leaves a mix.
namespace cleanup {
namespace {
constexpr int kMax = 48;
char paths[kMax][PATH_MAX];
volatile sig_atomic_t count = 0;
char dir[PATH_MAX];
volatile sig_atomic_t have_dir = 0;
volatile sig_atomic_t in_commit = 0;
volatile sig_atomic_t pending = 0;

extern "C" void on_signal(int sig) {
  if (in_commit) {
    pending = sig;
    return;
  }
  for (int i = 0; i < count; ++i) ::unlink(paths[i]);
  if (have_dir) ::rmdir(dir);
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
}
}  // namespace
}  // namespace cleanup

void install_exit_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = cleanup::on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
}

// ---- paths ----------------------------------------------------------------------------------------

namespace {

std::string errno_text() { return std::strerror(errno); }

// Root passes access(W_OK) even where nothing can be created (/proc, read-only mounts): create and
// remove a probe file instead.
void probe_writable(const std::string& dir, const std::string& what) {
  const std::string probe = path_in(dir, fmt::format(".ringattn-probe-{}", ::getpid()));
  const int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0)
    throw InputError(fmt::format("{}: cannot create files in {}: {} (expected a writable directory)", what, dir,
                                 errno_text()));
  ::close(fd);
  ::unlink(probe.c_str());
}

// A report or trace target, resolved.
struct TextTarget {
  std::string given;     // as the user wrote it
  std::string path;      // what is replaced (a symlink's target), or opened (write-through)
  bool write_through = false;
  std::string temp;      // rank 0: the staged text's file, beside `path`
  std::string text;
  bool set = false;
};

TextTarget resolve_text_target(const std::string& given, const char* opt) {
  TextTarget t;
  t.given = given;
  t.path = given;
  const std::string what = fmt::format("{} {}", opt, given);
  struct stat st {};
  if (::stat(given.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw InputError(fmt::format("{}: is a directory (expected a file)", what));
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
      t.write_through = true;
      if (::access(given.c_str(), W_OK) != 0)
        throw InputError(fmt::format("{}: cannot be written: {} (expected a writable file)", what, errno_text()));
      return t;
    }
    if (!S_ISREG(st.st_mode)) throw InputError(fmt::format("{}: is not a regular file (expected a file)", what));
    std::error_code ec;
    t.path = fs::canonical(given, ec).string();  // a symlink's target is replaced, the link stays
    if (ec) t.path = given;
  } else {
    std::error_code ec;
    const fs::path w = fs::weakly_canonical(given, ec);  // follows a dangling symlink's directories
    if (!ec) t.path = w.string();
  }
  const fs::path p(t.path);
  const std::string name = p.filename().string();
  if (name.empty() || name == "." || name == "..")
    throw InputError(fmt::format("{}: names no file (expected a file name)", what));
  if (name.size() > NAME_MAX)
    throw InputError(fmt::format("{}: the file name is {} characters long (expected at most {})", what, name.size(),
                                 NAME_MAX));
  const std::string dir = p.parent_path().empty() ? "." : p.parent_path().string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw InputError(fmt::format("{}: directory {} does not exist (expected a writable directory)", what, dir));
  probe_writable(dir, what);
  return t;
}

// The same file, when both exist; else the same resolved path.
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  std::error_code e1, e2;
  return fs::weakly_canonical(a, e1) == fs::weakly_canonical(b, e2) && !e1 && !e2;
}

std::string host_name() {
  char h[256] = {};
  ::gethostname(h, sizeof(h) - 1);
  std::string s;
  for (const char* c = h; *c; ++c) s += std::isalnum(static_cast<unsigned char>(*c)) ? *c : '_';
  return s.empty() ? "host" : s;
}

// ".ringattn-<host>-<pid>-<tag>": a job's private names.
std::string job_id() {
  std::random_device rd;
  return fmt::format("{}-{}-{:08x}", host_name(), ::getpid(), rd());
}

// A hidden entry of a job that no longer runs on this host.
bool abandoned(const std::string& name, const std::string& host) {
  const std::string prefix = ".ringattn-" + host + "-";
  if (!name.starts_with(prefix)) return false;
  const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
  return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

void remove_tree(const std::string& dir) noexcept {
  std::error_code ec;
  fs::remove_all(dir, ec);
}

void rename_or_throw(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    throw RuntimeFailure(fmt::format("cannot move {} to {}: {}", from, to, errno_text()));
}

void write_all(int fd, const std::string& text, const std::string& path) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw RuntimeFailure(fmt::format("cannot write {}: {}", path, errno_text()));
    done += std::size_t(n);
  }
}

}  // namespace

struct StagedOutputs::Impl {
  const comm::Group& group;
  OutputPaths p;
  std::string id, stage_dir;
  std::vector<std::string> staged;  // final names (with .npy) of the staged files
  TextTarget report, trace;
  bool have_report = false, have_trace = false, staged_any = false, created_out = false;

  Impl(const comm::Group& g, OutputPaths paths) : group(g), p(std::move(paths)) {}

  std::string final_path(const std::string& file) const { return path_in(p.out_dir, file); }
  std::string stage_path(const std::string& file) const { return path_in(stage_dir, file); }

  void validate() {
    const std::string out = "--out " + p.out_dir;
    if (!p.out_dir.empty()) {
      std::error_code ec;
      if (fs::exists(p.out_dir, ec)) {
        if (!fs::is_directory(p.out_dir, ec))
          throw InputError(fmt::format("{}: is not a directory (expected a writable directory)", out));
        probe_writable(p.out_dir, out);
      } else {
        const fs::path parent = fs::path(p.out_dir).parent_path();
        const std::string dir = parent.empty() ? "." : parent.string();
        if (!fs::is_directory(dir, ec))
          throw InputError(fmt::format("{}: its parent {} is not a directory (expected an existing parent)", out, dir));
        probe_writable(dir, out);
      }
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
      if (!p.out_dir.empty())
        for (const std::string& name : own_output_names())
          if (same_file(t->path, final_path(name + ".npy")))
            throw InputError(fmt::format("{} {}: is the output {}.npy of --out (expected another file)", opt,
                                         t->given, name));
    }
  }

  bool is_input(const std::string& path) const {
    return std::any_of(p.inputs.begin(), p.inputs.end(), [&](const std::string& in) { return same_file(in, path); });
  }

  // Rank 0, under the lock: entries of jobs that died here. A dead job's staging directory goes;
  // its set-aside old outputs go back where nothing has replaced them.
  void sweep_abandoned() const {
    std::error_code ec;
    const std::string host = host_name();
    for (const auto& e : fs::directory_iterator(p.out_dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 13 && name[0] == '.' && name.ends_with(".npy.partial")) fs::remove(e.path(), ec);
      if (!abandoned(name, host)) continue;
      if (name.ends_with(".old"))
        for (const auto& f : fs::directory_iterator(e.path(), ec))
          if (!fs::exists(final_path(f.path().filename().string()), ec))
            ::rename(f.path().c_str(), final_path(f.path().filename().string()).c_str());
      remove_tree(e.path().string());
    }
  }

  void commit_outputs() {
    const int lock = ::open(p.out_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock < 0 || ::flock(lock, LOCK_EX) != 0)
      throw RuntimeFailure(fmt::format("--out {}: cannot lock the directory: {}", p.out_dir, errno_text()));
    struct Unlock {
      int fd;
      ~Unlock() { ::close(fd); }
    } unlock{lock};
    sweep_abandoned();
    // What goes aside: everything this run writes, and ringattn's names it does not (stale),
    // except the files it reads.
    std::vector<std::string> aside;
    for (const std::string& name : own_output_names()) {
      const std::string file = name + ".npy", final = final_path(file);
      struct stat st {};
      if (::lstat(final.c_str(), &st) != 0) continue;
      const bool ours = std::find(staged.begin(), staged.end(), file) != staged.end();
      if (!ours && is_input(final)) continue;
      if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
        throw RuntimeFailure(fmt::format("--out {}: {} is not a file (expected a file or nothing there); nothing "
                                         "was changed", p.out_dir, file));
      aside.push_back(file);
    }
    const std::string old = final_path(".ringattn-" + id + ".old");
    if (::mkdir(old.c_str(), 0700) != 0)
      throw RuntimeFailure(fmt::format("--out {}: cannot create {}: {}", p.out_dir, old, errno_text()));
    std::vector<std::string> moved, placed;
    auto restore = [&] {
      for (const std::string& f : placed) ::unlink(final_path(f).c_str());
      for (const std::string& f : moved) ::rename(path_in(old, f).c_str(), final_path(f).c_str());
      remove_tree(old);
    };
    try {
      for (const std::string& f : aside) {
        rename_or_throw(final_path(f), path_in(old, f));
        moved.push_back(f);
      }
      for (const std::string& f : staged) {
        rename_or_throw(stage_path(f), final_path(f));
        placed.push_back(f);
      }
    } catch (const RuntimeFailure& e) {
      restore();
      throw RuntimeFailure(fmt::format("--out {}: {}; the earlier outputs were kept", p.out_dir, e.what()));
    }
    remove_tree(old);
    remove_tree(stage_dir);
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
      impl_->validate();
      impl_->id = job_id();
    } catch (const InputError& e) {
      err = e.what();
    }
  }
  if (auto e = group.agree(err)) throw InputError(*e);
  group.broadcast(impl_->id, 0);
  if (!impl_->p.out_dir.empty()) impl_->stage_dir = path_in(impl_->p.out_dir, ".ringattn-" + impl_->id + ".tmp");
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
    std::error_code ec;
    if (!fs::exists(m.p.out_dir, ec)) {
      if (::mkdir(m.p.out_dir.c_str(), 0777) != 0 && errno != EEXIST)
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
    fs::remove(m.p.out_dir, ec);  // only if still empty
  }
  m.staged_any = false;
  m.report.set = m.trace.set = false;
  cleanup::clear();
}

}  // namespace ringattn::runtime
