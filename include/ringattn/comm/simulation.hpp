#pragma once
// What differs when ringattn runs as simulated ranks under SimGrid's SMPI (the build configured
// with RINGATTN_SMPI=ON and CMAKE_CXX_COMPILER=smpicxx, see scripts/simulate.sh).
//
// SMPI runs every rank of the job inside one process. The executable is loaded once per rank
// (SMPI's dlopen privatization, on by default in SimGrid 3.32), so ringattn's own globals are per
// rank; shared libraries (libstdc++, fmt, Highway, SimGrid) are loaded once and shared. MPI_Wtime
// is simulated time. The compute between MPI calls is measured and charged to the simulated host
// at its speed, unless the job is timing-only: then the kernels do not run and the flops they
// would do are charged instead (charge_flops).
#include <cstddef>

namespace ringattn::comm {

// True in the SimGrid/SMPI build.
bool simulated();

// Ranks that share this process's memory: the world's size under simulation (every simulated rank
// lives here), 1 otherwise. Memory admission divides the node's memory by it.
int ranks_in_process();

// The flop rate of this rank's simulated host (its platform `speed`); 0 outside the simulation.
// A memory-bound step charges its seconds as seconds x host_speed() flops.
double host_speed();

// Charge `flops` of compute to this rank's simulated host, without computing (SMPI's
// smpi_execute_flops). Throws RuntimeFailure outside the simulation build.
void charge_flops(double flops);

// From now on, buffers of at least 1 MiB that the kernels' storage allocates (core::AlignedVector)
// are folded onto shared pages (SMPI_SHARED_MALLOC): every rank's large buffers map the same few
// physical pages, so a timing-only job of 1024 ranks fits in memory. Their contents are garbage;
// only a job that never reads its data may call this. Per rank; no effect outside the simulation.
void fold_large_buffers();

// From now on, layouts of equal parameters share one copy of their tables across the simulated
// ranks (core::set_layout_store on SMPI's store of shared results): their contents are real and
// the same on every rank, 20 bytes per position, which 1024 ranks would otherwise each hold.
// Per rank (every comm::Environment calls it); no effect outside the simulation.
void share_layouts();

}  // namespace ringattn::comm
