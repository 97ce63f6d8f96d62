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
//
// Note [memory limit]: each device allocator may be capped: an allocation that
// would take its `allocated` bytes (live blocks, MemoryStats::allocated) past the
// limit throws OutOfMemoryError naming the device, the request, the limit, the
// bytes allocated now and their peak, so that "a model larger than one rank's
// memory" can be shown on CPU ranks. DDP_MEMORY_LIMIT (read once, when the first
// device allocator is created) sets the limit of every device allocator;
// set_memory_limit() changes one. The limit counts rounded block sizes, as
// `allocated` does; a cached block larger than the request is not handed out
// when it would pass the limit. The virtual cpu devices share the one CPU
// allocator, hence one limit. Pinned host memory (staging) is never capped.
// Without a limit the check is one relaxed atomic load and a compare.
#pragma once

#include "runtime/device.h"
#include "runtime/stream.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ddp {

// n rounded up to a multiple of `multiple` (> 0).
inline size_t round_up(size_t n, size_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

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
  // Throws OutOfMemoryError naming the device, the requested bytes, allocated and reserved,
  // or, past the memory limit, the limit and the peak. Zero bytes give nullptr.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  // The block at `ptr` is used by `stream` too: when freed, it is reused only after
  // the work queued on `stream` so far has finished.
  virtual void record_stream(void* /*ptr*/, const Stream& /*stream*/) {}
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak_stats() = 0;
  virtual void empty_cache() {}

  // CUDA graph capture (Note [capture pools] in memory/caching_allocator.h). Only the
  // CUDA allocators capture; the others throw DeviceError naming themselves.
  // From now until end_capture(capture), allocations made while `capture` is the
  // current stream come from graph pool `pool` (a new pool when 0); returns its id.
  // `after` is the stream whose work the graph is ordered after at every replay.
  virtual uint64_t begin_capture(const Stream& capture, const Stream& after, uint64_t pool);
  virtual void end_capture(const Stream& capture);
  // The graph that held `pool` is gone and none of its replays still run: the pool's
  // blocks go back.
  virtual void release_pool(uint64_t pool);

  // Note [memory limit]: the most bytes `allocated` may reach; 0: no limit. A limit
  // below what is allocated now frees nothing: later allocations fail until enough is freed.
  void set_memory_limit(uint64_t bytes) { memory_limit_.store(bytes, std::memory_order_relaxed); }
  uint64_t memory_limit() const { return memory_limit_.load(std::memory_order_relaxed); }

 protected:
  // The bytes that may still be allocated on top of `allocated`: UINT64_MAX without a limit.
  uint64_t room_under_limit(uint64_t allocated) const {
    const uint64_t limit = memory_limit();
    if (limit == 0) return UINT64_MAX;
    return allocated < limit ? limit - allocated : 0;
  }
  // The OutOfMemoryError of an allocation of `bytes` past the limit, on `device` ("cpu").
  [[noreturn]] void throw_past_limit(const std::string& device, size_t bytes,
                                     const MemoryStats& stats) const;

 private:
  std::atomic<uint64_t> memory_limit_{0};
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

// Note [memory limit]: the limit of the device's allocator (0: none); the virtual cpu
// devices share one. Thread-safe; allocations already made are not checked again.
void set_memory_limit(const Device& device, uint64_t bytes);
uint64_t memory_limit(const Device& device);

// A memory size as DDP_MEMORY_LIMIT takes it: a byte count ("1073741824") or a number
// with a unit ("512MiB", "2GiB", "1.5GB", "300M", "64k"; a space between the two is
// allowed). Units, in any case: B; K, M, G, T and KiB, MiB, GiB, TiB are powers of 1024;
// KB, MB, GB, TB powers of 1000. A fraction needs a unit other than B and is rounded to
// the nearest byte. Throws ValueError naming `source` (the variable or flag), the text
// and valid examples when the text is none of these or exceeds 2^64-1 bytes.
uint64_t parse_memory_size(std::string_view text, std::string_view source = "DDP_MEMORY_LIMIT");

// "1.50 GiB", "512 B": sizes in messages.
std::string format_bytes(uint64_t bytes);

}  // namespace ddp
