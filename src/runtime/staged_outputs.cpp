#include "ringattn/runtime/staged_outputs.hpp"

#include <signal.h>
#include <unistd.h>

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

void arm(const std::vector<std::string>& files) {
  count = 0;
  for (const std::string& f : files) {
    if (count == kMax || f.size() >= sizeof(paths[0])) break;
    std::memcpy(paths[count], f.c_str(), f.size() + 1);
    count = count + 1;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int k = 0; k < 3; ++k) sigaction(kSignals[k], &sa, &previous[k]);
}

// One more path for the handler to remove (the store of count comes after the path is whole).
void add(const std::string& f) {
  if (count == kMax || f.size() >= sizeof(paths[0])) return;
  std::memcpy(paths[count], f.c_str(), f.size() + 1);
  count = count + 1;
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
    // A signal between two renames must not leave some outputs: each final path joins the
    // handler's list before its rename, so an interrupted commit removes the renamed ones too.
    if (comm_.rank() == 0)
      for (const File& f : files_) {
        const std::string final_path = path_in(dir_, f.name + ".npy");
        partials::add(final_path);
        std::filesystem::rename(temporary(f), final_path);
      }
  });
  staged_ = false;
  partials::disarm();
}

template <class T>
void StagedOutputs<T>::discard() {
  if (!staged_) return;
  for (const File& f : files_) std::remove(temporary(f).c_str());  // every rank: whoever gets there first
  staged_ = false;
  partials::disarm();
}

template class StagedOutputs<float>;
template class StagedOutputs<double>;

}  // namespace ringattn::runtime
