// The CPU allocator: 64-byte aligned memory (AVX-512 loads, no false sharing).
//
// Note [cpu block cache]: a training step frees and allocates the same large
// temporaries every step (im2col columns, activations, their gradients). glibc
// serves those from fresh mmap()s or trims them back to the system, so every
// step touched new pages: in the CNN step 2.4 million page faults, a third of
// the step's time in the kernel. Blocks of at least `min_cached_bytes` are
// therefore kept on free and handed out again for a request of the same size
// (up to 1/8 larger), PyTorch's CUDA caching applied to host memory. Smaller
// blocks go straight to the C library, which caches them well. Bounds: at most
// `cache_limit_bytes` are kept (a block that would exceed it is freed), an
// allocation that fails releases the cache and is retried once, and
// empty_cache(cpu) gives everything back. The process-wide allocator caches up
// to DDP_CPU_CACHE_MB (default 1024; 0 turns the cache off) and caches nothing
// under AddressSanitizer or ThreadSanitizer, which must see every free.
#pragma once

#include "runtime/memory/allocator.h"

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>

namespace ddp {

// The alignment of every CPU allocation (a cache line; AVX-512 loads).
inline constexpr size_t kCpuAlignment = 64;

struct CpuCacheOptions {
  size_t min_cached_bytes = size_t{128} << 10;
  size_t cache_limit_bytes = size_t{1} << 30;  // 0: nothing is cached
};

class CpuAllocator : public Allocator {
 public:
  explicit CpuAllocator(CpuCacheOptions options = {});
  ~CpuAllocator() override;
  CpuAllocator(const CpuAllocator&) = delete;
  CpuAllocator& operator=(const CpuAllocator&) = delete;

  // Throws OutOfMemoryError naming the request and the bytes allocated, or past the
  // memory limit (Note [memory limit]) the limit and the peak. Zero bytes give nullptr.
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr) override;
  MemoryStats stats() const override;
  void reset_peak_stats() override;
  void empty_cache() override;

  // The options of the process-wide allocator: DDP_CPU_CACHE_MB, none under sanitizers.
  static CpuCacheOptions from_environment();

 private:
  // A cached block for `size` of at most `room` bytes, or nullptr; holds mutex_.
  void* take_cached(size_t size, uint64_t room);
  void release_cache_locked();

  const CpuCacheOptions options_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, size_t> sizes_;  // live blocks
  std::multimap<size_t, void*> cached_;      // free blocks by size
  size_t cached_bytes_ = 0;
  MemoryStats stats_;
};

}  // namespace ddp
