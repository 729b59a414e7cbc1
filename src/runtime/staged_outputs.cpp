#include "ringattn/runtime/staged_outputs.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "ringattn/io/npy.hpp"
#include "ringattn/runtime/common.hpp"

namespace ringattn::runtime {

// While partial outputs exist, a signal that ends the job removes them: when a rank dies Open
// MPI sends SIGTERM to the others, and a killed job must leave nothing that looks complete.
// The handler only calls unlink and _exit (async-signal-safe) on paths stored beforehand.
namespace partials {
namespace {
constexpr int kMax = 64;  // room for every staged file twice: its temporary and its final path
char paths[kMax][4096];
volatile sig_atomic_t count = 0;
struct sigaction previous[3];
constexpr int kSignals[3] = {SIGTERM, SIGINT, SIGHUP};

extern "C" void on_signal(int sig) {
  for (int i = 0; i < count; ++i) ::unlink(paths[i]);
  ::_exit(128 + sig);
}
}  // namespace

// One more path for the handler to remove. The fence keeps the path's bytes before the store of
// count, so a signal in between sees either the old count or the whole path.
void add(const std::string& f) {
  if (count == kMax || f.size() >= sizeof(paths[0])) return;
  std::memcpy(paths[count], f.c_str(), f.size() + 1);
  std::atomic_signal_fence(std::memory_order_release);
  count = count + 1;
}

void arm(const std::vector<std::string>& files) {
  count = 0;
  for (const std::string& f : files) add(f);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int k = 0; k < 3; ++k) sigaction(kSignals[k], &sa, &previous[k]);
}

void disarm() {
  count = 0;
  for (int k = 0; k < 3; ++k) sigaction(kSignals[k], &previous[k], nullptr);
}
}  // namespace partials

template <class T>
std::string StagedOutputs<T>::temporary(const File& f) const {
  return path_in(dir_, "." + f.name + ".npy.partial");
}

template <class T>
void StagedOutputs<T>::stage(std::vector<File> files) {
  discard();
  files_ = std::move(files);
  std::vector<std::string> tmps;
  for (const File& f : files_) tmps.push_back(temporary(f));
  partials::arm(tmps);
  staged_ = true;
  const int r = comm_.rank();
  agreed_runtime(comm_, [&] {
    if (r != 0) return;
    for (const File& f : files_) {
      if (f.pos_axis == kWhole) io::write_npy<T>(temporary(f), dtype_, f.shape, f.data.data());
      else io::create_npy(temporary(f), dtype_, f.shape);
    }
  });
  const auto runs = layout_.runs(r);
  agreed_runtime(comm_, [&] {
    for (const File& f : files_)
      if (f.pos_axis != kWhole)
        io::write_npy_positions<T>(temporary(f), dtype_, f.shape, f.pos_axis, runs, layout_.size(r), f.data.data());
  });
}

template <class T>
void StagedOutputs<T>::commit() {
  if (!staged_) return;
  agreed_runtime(comm_, [&] {
    // A signal or a failed rename between two renames must not leave some outputs: each final
    // path joins the handler's list and committed_ before its rename, so an interrupted commit
    // (the handler, or discard() once the failure is agreed) removes the renamed ones too.
    if (comm_.rank() == 0)
      for (const File& f : files_) {
        const std::string final_path = path_in(dir_, f.name + ".npy");
        partials::add(final_path);
        committed_.push_back(final_path);
        std::filesystem::rename(temporary(f), final_path);
      }
  });
  staged_ = false;
  committed_.clear();
  partials::disarm();
}

template <class T>
void StagedOutputs<T>::discard() {
  if (!staged_) return;
  for (const File& f : files_) std::remove(temporary(f).c_str());  // every rank: whoever gets there first
  for (const std::string& p : committed_) std::remove(p.c_str());  // a commit that failed part-way
  committed_.clear();
  staged_ = false;
  partials::disarm();
}

template class StagedOutputs<float>;
template class StagedOutputs<double>;

}  // namespace ringattn::runtime
