#pragma once
// Buffers the kernels touch start on a 64-byte boundary (a cache line, and the widest vector of
// any SIMD target here): loads never straddle more lines than they must, and a buffer's first
// element is aligned the same way on every run.
#include <cstddef>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace ringattn::core {

#ifdef RINGATTN_SMPI
// Simulation build only: where buffers of at least kLargeBufferBytes come from when set (a
// simulation that never reads its data folds them onto shared pages, see
// comm::fold_large_buffers); otherwise aligned_alloc. `release` takes back every pointer the
// allocator hands out once the source is set, whichever function allocated it. Set once, before
// the buffers it should cover are made; never unset.
struct LargeBufferSource {
  void* (*allocate)(std::size_t bytes) = nullptr;
  void (*release)(void* p) = nullptr;
};
inline constexpr std::size_t kLargeBufferBytes = std::size_t(1) << 20;
inline LargeBufferSource g_large_buffer_source;
inline void set_large_buffer_source(LargeBufferSource s) { g_large_buffer_source = s; }
#endif

template <class T>
struct CacheAlignedAllocator {
  using value_type = T;
  static constexpr std::size_t kAlign = 64;
  CacheAlignedAllocator() = default;
  template <class U>
  CacheAlignedAllocator(const CacheAlignedAllocator<U>&) {}  // NOLINT(google-explicit-constructor)
  T* allocate(std::size_t n) {
    const std::size_t bytes = (n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
#ifdef RINGATTN_SMPI
    if (g_large_buffer_source.allocate && bytes >= kLargeBufferBytes) {
      if (void* p = g_large_buffer_source.allocate(bytes)) return static_cast<T*>(p);  // page-aligned
      throw std::bad_alloc();
    }
#endif
    void* p = std::aligned_alloc(kAlign, bytes == 0 ? kAlign : bytes);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept {
#ifdef RINGATTN_SMPI
    if (g_large_buffer_source.release) return g_large_buffer_source.release(p);
#endif
    std::free(p);
  }
#ifdef RINGATTN_SMPI
  // Once buffers are folded their contents are garbage by contract: resize() leaves new elements
  // unwritten instead of zeroing them, so a timing-only job never touches (page-faults) the
  // gigabytes of virtual memory its ranks map; otherwise the usual value-initialization.
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0 && std::is_trivially_default_constructible_v<U>) {
      if (g_large_buffer_source.allocate) return;
    }
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
#endif
  template <class U>
  bool operator==(const CacheAlignedAllocator<U>&) const {
    return true;
  }
};

template <class T>
using AlignedVector = std::vector<T, CacheAlignedAllocator<T>>;

}  // namespace ringattn::core
