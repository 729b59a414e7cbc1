#pragma once
// The paths and the commit journal of staged outputs (private to src/runtime/job).
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ringattn::runtime::staging {

std::string errno_text();

// Root passes access(W_OK) even where nothing can be created (/proc, read-only mounts): create and
// remove a probe file instead. Throws InputError naming `what`.
void probe_writable(const std::string& dir, const std::string& what);

// A report or trace target, resolved.
struct TextTarget {
  std::string given;     // as the user wrote it
  std::string path;      // what is replaced (a symlink's target), or opened (write-through)
  bool write_through = false;
  std::string temp;      // rank 0: the staged text's file, beside `path`
  std::string text;
  bool set = false;
};

TextTarget resolve_text_target(const std::string& given, const char* opt);
bool same_file(const std::string& a, const std::string& b);
std::string host_name();
std::string job_id();
// Whether the hidden entry `name` belongs to a job of this host that no longer runs.
bool abandoned(const std::string& name, const std::string& host);
std::string join_words(const std::vector<std::string>& v);
void remove_tree(const std::string& dir) noexcept;
void rename_or_throw(const std::string& from, const std::string& to);
void write_all(int fd, const std::string& text, const std::string& path);

// ---- the commit journal (staging.cpp says what it guarantees) ----
struct Journal {
  std::string id;
  bool forward = true;
  std::vector<std::string> aside, place;  // file names (o.npy ...)
};

inline std::string hidden_name(const std::string& id, const char* suffix) { return ".ringattn-" + id + suffix; }
bool there(const std::string& path);
bool valid_id(const std::string& id);
bool own_file_name(const std::string& f);
std::string journal_text(const Journal& j);
std::optional<Journal> read_journal(const std::string& path);
void publish_journal(const std::string& dir, const Journal& j);
// A file moved within DIR; never onto a directory.
void move_file(const std::string& from, const std::string& to);
// Carries out a published journal to its end. `step(move)` is called after each change; `move`
// is false for the cleanup after the last move, which never fails.
void finish_journal(const std::string& dir, const Journal& j, const std::function<void(bool)>& step);

}  // namespace ringattn::runtime::staging
