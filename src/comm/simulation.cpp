#include "ringattn/comm/simulation.hpp"

#include <mpi.h>

#include <cstdlib>
#include <string>
#include <unordered_set>

#include "ringattn/core/aligned.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/core/layout.hpp"

#ifdef RINGATTN_SMPI
#include <simgrid/host.h>
#include <smpi/smpi.h>
#endif

namespace ringattn::comm {

#ifdef RINGATTN_SMPI

bool simulated() { return true; }

int ranks_in_process() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

void charge_flops(double flops) {
  if (flops > 0) smpi_execute_flops(flops);
}

double host_speed() { return sg_host_get_speed(sg_host_self()); }

namespace {
// This rank's folded buffers (the executable, and so this set, is loaded once per simulated rank):
// only those go back through smpi_shared_free.
std::unordered_set<void*> g_folded;

// SMPI folds whole blocks of smpi/shared-malloc-blocksize (scripts/simulate.sh sets this size)
// onto one shared block; the tail of a buffer past its last whole block would stay private, so
// every buffer is made a whole number of blocks (virtual memory only).
constexpr std::size_t kFoldBlock = std::size_t(4) << 20;

void* fold(std::size_t bytes) {
  void* p = SMPI_SHARED_MALLOC((bytes + kFoldBlock - 1) / kFoldBlock * kFoldBlock);
  if (p) g_folded.insert(p);
  return p;
}

void unfold(void* p) {
  if (g_folded.erase(p)) SMPI_SHARED_FREE(p);
  else std::free(p);
}
}  // namespace

void fold_large_buffers() { core::set_large_buffer_source({fold, unfold}); }

namespace {
// SMPI's store of shared results (SMPI_SHARED_CALL's), which lives in SimGrid, once per process.
constexpr const char* kLayouts = "ringattn layout tables";
const void* find_layout(const std::string& key) {
  return smpi_shared_known_call(kLayouts, key.c_str()) ? smpi_shared_get_call(kLayouts, key.c_str()) : nullptr;
}
void keep_layout(const std::string& key, const void* tables) {
  smpi_shared_set_call(kLayouts, key.c_str(), const_cast<void*>(tables));
}
}  // namespace

void share_layouts() { core::set_layout_store({find_layout, keep_layout}); }

#else

bool simulated() { return false; }
int ranks_in_process() { return 1; }
void charge_flops(double) {
  throw RuntimeFailure("timing-only compute needs the SimGrid/SMPI build (scripts/simulate.sh)");
}
double host_speed() { return 0; }
void fold_large_buffers() {}
void share_layouts() {}

#endif

}  // namespace ringattn::comm
