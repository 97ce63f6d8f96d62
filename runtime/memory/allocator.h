// Memory: one allocator per device, plus pinned host memory for staging.
//
// CPU memory is 64-byte aligned; freed blocks of 128 KiB and more are kept for
// reuse (memory/cpu_allocator.h, Note [cpu block cache]), smaller ones go back to
// the C library. CUDA
// memory goes through a CachingAllocator (memory/caching_allocator.h): freed
// blocks are kept for reuse by the stream that used them; empty_cache() gives
// them back. Pinned host memory is cached the same way, and a block freed while
// an asynchronous copy still reads it is reused only after that copy finished.
// Managed memory is never used.
#pragma once

#include "runtime/device.h"
#include "runtime/stream.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp {

struct MemoryStats {
  uint64_t allocated = 0;      // bytes in live blocks (rounded block sizes)
  uint64_t reserved = 0;       // bytes held from the system: live + cached
  uint64_t max_allocated = 0;  // peak of `allocated` since the last reset
  uint64_t max_reserved = 0;
  uint64_t num_allocs = 0;      // allocate() calls that returned memory
  uint64_t num_cache_hits = 0;  // of those, served from the cache
  uint64_t num_raw_allocs = 0;  // calls to the system allocator (cudaMalloc, aligned_alloc)
  uint64_t num_raw_frees = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Throws OutOfMemoryError naming the device, the requested bytes, allocated and reserved.
  // Zero bytes give nullptr.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  // The block at `ptr` is used by `stream` too: when freed, it is reused only after
  // the work queued on `stream` so far has finished.
  virtual void record_stream(void* /*ptr*/, const Stream& /*stream*/) {}
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak_stats() = 0;
  virtual void empty_cache() {}
};

// The allocator of a device (checked to be available).
Allocator& device_allocator(const Device& device);
// Page-locked host memory for fast, asynchronous copies; plain 64-byte aligned
// memory in a build or on a machine without CUDA.
Allocator& pinned_host_allocator();

MemoryStats memory_stats(const Device& device);
uint64_t memory_allocated(const Device& device);
uint64_t memory_reserved(const Device& device);
uint64_t max_memory_allocated(const Device& device);
void reset_peak_memory_stats(const Device& device);
void empty_cache(const Device& device);

// "1.50 GiB", "512 B": sizes in messages.
std::string format_bytes(uint64_t bytes);

}  // namespace ddp
