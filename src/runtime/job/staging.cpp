// The paths and the commit journal of staged outputs (see staged_outputs.hpp): resolving and
// probing --out, --report and --trace, and the journal that makes the commit into --out
// recoverable at any instant.
#include "staging.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "ringattn/core/errors.hpp"
#include "ringattn/runtime/paths.hpp"
#include "ringattn/runtime/staged_outputs.hpp"

namespace ringattn::runtime::staging {

namespace fs = std::filesystem;

// ---- paths ----------------------------------------------------------------------------------------


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
  if (!fs::is_directory(dir, ec)) {
    // Name the culprit: the nearest ancestor that exists, when it is not a directory (a regular
    // file where a directory should be), else the directory that is missing.
    for (fs::path a = fs::path(dir).parent_path(); !a.empty() && a != a.parent_path(); a = a.parent_path())
      if (fs::exists(a, ec)) {
        if (!fs::is_directory(a, ec))
          throw InputError(fmt::format("{}: {} is not a directory (expected a writable directory)", what, a.string()));
        break;
      }
    const bool exists = fs::exists(dir, ec);
    throw InputError(fmt::format("{}: {} (expected a writable directory)", what,
                                 exists ? dir + " is not a directory" : "directory " + dir + " does not exist"));
  }
  probe_writable(dir, what);
  return t;
}

// The same file, when both exist; else the same resolved path (made absolute first: the resolved
// form of a relative name none of whose parts exists yet is the name itself).
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  std::error_code e1, e2, e3, e4;
  const fs::path ra = fs::weakly_canonical(fs::absolute(a, e1), e2), rb = fs::weakly_canonical(fs::absolute(b, e3), e4);
  return ra == rb && !e1 && !e2 && !e3 && !e4;
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

std::string join_words(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& w : v) {
    if (!s.empty()) s += ' ';
    s += w;
  }
  return s;
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


// ---- the commit journal ---------------------------------------------------------------------------
// DIR/.ringattn-<job>.commit exists exactly while a commit may have left DIR with a mix of two
// sets. It is published (written beside, then renamed into place) before the commit's first
// change and removed after its last, all under the lock on DIR; so under that lock any journal
// belongs to a job that died committing, and finishing it is safe. It is also a POSIX shell
// script that finishes the commit itself (`sh DIR/.ringattn-<job>.commit`), doing exactly what
// finish_journal() does. Every step of both is safe to repeat.
//
// forward (the new set goes in): if no staged file has been moved in yet, each name in `aside`
//   (the old outputs) is moved into A = .ringattn-<job>.old; then each name in `place` still in
//   S = .ringattn-<job>.tmp is moved into DIR; then A, S and the journal are removed.
// back (the old set comes back; written over the forward journal before a failed commit is
//   undone): each placed file (gone from S, present in DIR) goes back into S, each name in A goes
//   back into DIR; then A, S and the journal are removed.
// The cleanup removes A, then S at once (renamed to .ringattn-<job>.gone first), then the journal.

constexpr const char* kJournalMagic = "# ringattn commit journal v1";


bool there(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

bool valid_id(const std::string& id) {
  return !id.empty() && std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
}

bool own_file_name(const std::string& f) {
  const auto& names = own_output_names();
  return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return f == n + ".npy"; });
}

std::string journal_text(const Journal& j) {
  const std::string aside = join_words(j.aside), place = join_words(j.place);
  std::string t = fmt::format(
      "#!/bin/sh\n"
      "{}\n"
      "# job {}\n"
      "# mode {}\n"
      "# aside {}\n"
      "# place {}\n"
      "#\n"
      "# A ringattn job was putting its outputs into this directory when it ended, so the directory may\n"
      "# hold a mix of two sets until this file is gone. `sh <this file>` finishes that commit:\n"
      "# {}. So does the next ringattn job with this --out. Either is safe to\n"
      "# repeat. See docs/robustness-commit.md.\n"
      "cd \"$(dirname \"$0\")\" || exit 1\n"
      "J={} A={} S={} G={}\n"
      "ASIDE='{}' PLACE='{}'\n"
      "there() {{ [ -e \"$1\" ] || [ -L \"$1\" ]; }}\n"
      "move() {{ if [ -d \"$2\" ]; then echo \"ringattn: $2 is a directory\" >&2; exit 1; fi; mv -f \"$1\" \"$2\" || exit 1; }}\n",
      kJournalMagic, j.id, j.forward ? "forward" : "back", aside, place,
      j.forward ? "the new set replaces the old one" : "the old set is put back", hidden_name(j.id, ".commit"),
      hidden_name(j.id, ".old"), hidden_name(j.id, ".tmp"), hidden_name(j.id, ".gone"), aside, place);
  if (j.forward)
    t += "none_placed=1\n"
         "for f in $PLACE; do there \"$S/$f\" || none_placed=0; done\n"
         "if [ $none_placed = 1 ]; then\n"
         "  [ -d \"$A\" ] || mkdir \"$A\" || exit 1\n"
         "  for f in $ASIDE; do if there \"$f\"; then move \"$f\" \"$A/$f\"; fi; done\n"
         "fi\n"
         "for f in $PLACE; do if there \"$S/$f\"; then move \"$S/$f\" \"$f\"; fi; done\n";
  else
    t += "if [ -d \"$S\" ]; then\n"
         "  for f in $PLACE; do if ! there \"$S/$f\" && there \"$f\"; then move \"$f\" \"$S/$f\"; fi; done\n"
         "fi\n"
         "for f in $ASIDE; do if there \"$A/$f\"; then move \"$A/$f\" \"$f\"; fi; done\n";
  t += "rm -rf \"$A\" || exit 1\n"
       "if there \"$S\"; then rm -rf \"$G\" && mv \"$S\" \"$G\" || exit 1; fi\n"
       "rm -rf \"$G\" && rm -f \"$J\" && echo \"ringattn: finished the commit of job " + j.id + " in $(pwd)\"\n";
  return t;
}

// The journal at `path`, or nothing when it is not one this code wrote.
std::optional<Journal> read_journal(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line) || !std::getline(in, line) || line != kJournalMagic) return std::nullopt;
  Journal j;
  bool have_mode = false;
  while (std::getline(in, line) && line.starts_with("# ") && line != "#") {
    std::istringstream words(line.substr(2));
    std::string key, w;
    words >> key;
    if (key == "job") words >> j.id;
    else if (key == "mode") {
      words >> w;
      if (w != "forward" && w != "back") return std::nullopt;
      j.forward = w == "forward";
      have_mode = true;
    } else if (key == "aside" || key == "place") {
      auto& v = key == "aside" ? j.aside : j.place;
      while (words >> w) {
        if (!own_file_name(w)) return std::nullopt;
        v.push_back(w);
      }
    }
  }
  if (!valid_id(j.id) || !have_mode) return std::nullopt;
  return j;
}

// Writes the journal beside its place and renames it there (atomic; durable before anything moves).
void publish_journal(const std::string& dir, const Journal& j) {
  const std::string path = path_in(dir, hidden_name(j.id, ".commit"));
  const std::string temp = path_in(dir, hidden_name(j.id, ".commit-new"));
  const int fd = ::open(temp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) throw RuntimeFailure(fmt::format("cannot create {}: {}", temp, errno_text()));
  try {
    write_all(fd, journal_text(j), temp);
    if (::fsync(fd) != 0) throw RuntimeFailure(fmt::format("cannot flush {}: {}", temp, errno_text()));
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string e = errno_text();
    ::unlink(temp.c_str());
    throw RuntimeFailure(fmt::format("cannot move {} to {}: {}", temp, path, e));
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

// A file moved within DIR; never onto a directory.
void move_file(const std::string& from, const std::string& to) {
  struct stat st {};
  if (::stat(to.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw RuntimeFailure(fmt::format("cannot move {} to {}: a directory stands there", from, to));
  rename_or_throw(from, to);
}

// Carries out a published journal to its end (see above). `step(move)` is called after each
// change; `move` is false for the cleanup after the last move, which never fails.
void finish_journal(const std::string& dir, const Journal& j, const std::function<void(bool)>& step) {
  const std::string A = path_in(dir, hidden_name(j.id, ".old")), S = path_in(dir, hidden_name(j.id, ".tmp"));
  if (j.forward) {
    const bool none_placed =
        std::all_of(j.place.begin(), j.place.end(), [&](const std::string& f) { return there(path_in(S, f)); });
    if (none_placed) {
      if (::mkdir(A.c_str(), 0700) != 0 && errno != EEXIST)
        throw RuntimeFailure(fmt::format("cannot create {}: {}", A, errno_text()));
      step(true);
      for (const std::string& f : j.aside)
        if (there(path_in(dir, f))) {
          move_file(path_in(dir, f), path_in(A, f));
          step(true);
        }
    }
    for (const std::string& f : j.place)
      if (there(path_in(S, f))) {
        move_file(path_in(S, f), path_in(dir, f));
        step(true);
      }
  } else {
    if (there(S))  // else the cleanup below had begun: every move was done
      for (const std::string& f : j.place)
        if (!there(path_in(S, f)) && there(path_in(dir, f))) {
          move_file(path_in(dir, f), path_in(S, f));
          step(true);
        }
    for (const std::string& f : j.aside)
      if (there(path_in(A, f))) {
        move_file(path_in(A, f), path_in(dir, f));
        step(true);
      }
  }
  // A goes first (once it is gone, nothing is left to move back), then S at once, by a rename:
  // a half-removed S would make the placed files look new again to a repeated undoing.
  remove_tree(A);
  step(false);
  const std::string gone = path_in(dir, hidden_name(j.id, ".gone"));
  if (there(S)) {
    remove_tree(gone);  // what an earlier, interrupted cleanup left
    if (::rename(S.c_str(), gone.c_str()) != 0) remove_tree(S);
  }
  remove_tree(gone);
  step(false);
  // Past the last move nothing fails: a journal that cannot be removed is finished again (with
  // nothing left to move) by the next job.
  ::unlink(path_in(dir, hidden_name(j.id, ".commit")).c_str());
  step(false);
}


}  // namespace ringattn::runtime::staging
