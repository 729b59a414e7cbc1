#pragma once
// Buffers the kernels touch are 64-byte aligned: Eigen peels vector loops by alignment, so a
// buffer at a different offset would round differently and break bitwise reproducibility.
#include <Eigen/Core>
#include <vector>

namespace ringattn::core {

template <class T>
using AlignedVector = std::vector<T, Eigen::aligned_allocator<T>>;

static_assert(EIGEN_MAX_ALIGN_BYTES >= 16, "Eigen alignment");

}  // namespace ringattn::core
