// AddressSanitizer's view of host memory that ddp hands out itself: the caching
// allocator's blocks of host memory and the emulated CUDA device's allocations mark
// the bytes past a request (and freed blocks) unusable, so that a kernel reading past
// its tensor is reported although the memory is still allocated. Nothing without ASan.
#pragma once

#include <cstddef>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace ddp::asan {

inline void poison(const void* p, size_t n) {
#if defined(__SANITIZE_ADDRESS__)
  ASAN_POISON_MEMORY_REGION(p, n);
#else
  (void)p;
  (void)n;
#endif
}

inline void unpoison(const void* p, size_t n) {
#if defined(__SANITIZE_ADDRESS__)
  ASAN_UNPOISON_MEMORY_REGION(p, n);
#else
  (void)p;
  (void)n;
#endif
}

}  // namespace ddp::asan
