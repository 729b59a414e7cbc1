#pragma once
// Buffers the kernels touch start on a 64-byte boundary (a cache line, and the widest vector of
// any SIMD target here): loads never straddle more lines than they must, and a buffer's first
// element is aligned the same way on every run.
#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace ringattn::core {

template <class T>
struct CacheAlignedAllocator {
  using value_type = T;
  static constexpr std::size_t kAlign = 64;
  CacheAlignedAllocator() = default;
  template <class U>
  CacheAlignedAllocator(const CacheAlignedAllocator<U>&) {}  // NOLINT(google-explicit-constructor)
  T* allocate(std::size_t n) {
    const std::size_t bytes = (n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, bytes == 0 ? kAlign : bytes);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }
  template <class U>
  bool operator==(const CacheAlignedAllocator<U>&) const {
    return true;
  }
};

template <class T>
using AlignedVector = std::vector<T, CacheAlignedAllocator<T>>;

}  // namespace ringattn::core
