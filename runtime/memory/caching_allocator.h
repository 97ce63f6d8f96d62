// A caching allocator in the manner of PyTorch's CUDACachingAllocator, kept
// independent of CUDA so that its logic is unit-tested on any machine: the raw
// allocation, the current stream and the events come from a Backend.
//
// Note [caching allocator]:
// - Sizes are rounded: up to 1 MiB to a multiple of 512 B, above to a multiple
//   of 2 MiB (the size bins). A free block is reused for a request of the same
//   stream whose rounded size is at most the block and at least half of it.
// - Blocks belong to the stream that was current when they were allocated:
//   work on that stream is ordered, so a block freed there can be handed out
//   again at once. A block that record_stream() marked as used by other streams
//   is parked on free until an event recorded on each of those streams (at the
//   free) has completed; parked blocks are checked on later allocations and by
//   empty_cache(), which never returns a parked block to the system.
// - A stream is its device and its handle (the handle nullptr is the default
//   stream of *each* device). The allocator keeps the Stream objects it holds, so
//   a stream ddp created is not destroyed, and its handle not reused by a new
//   stream, while a cached block still belongs to it or a freed block waits on it.
//   Streams of the CPU are synchronous: recording one is a no-op.
// - When the raw allocation fails, the cache is released and the allocation
//   retried once; then OutOfMemoryError names the device, the request,
//   allocated and reserved bytes.
// - Under a memory limit (Note [memory limit] in memory/allocator.h) a request whose
//   rounded size passes it throws before any block is taken, and a cached block
//   that would pass it is not handed out (a new block of the rounded size is).
#pragma once

#include "runtime/memory/allocator.h"

#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace ddp {

class CachingAllocator : public Allocator {
 public:
  struct Backend {
    std::string name;                        // "cuda:0", "pinned host": used in messages
    std::function<void*(size_t)> raw_alloc;  // nullptr when out of memory
    std::function<void(void*)> raw_free;
    std::function<Stream()> current_stream;  // the stream a new block belongs to
    // A new event recorded on `stream` (a CUDA stream, of any device).
    std::function<void*(const Stream&)> record_event;
    std::function<bool(void*)> event_done;
    std::function<void(void*)> destroy_event;
    std::function<std::string()> oom_hint;  // extra text for the OOM message (free/total)
  };

  explicit CachingAllocator(Backend backend);
  ~CachingAllocator() override;

  void* allocate(size_t bytes) override;
  // Throws if recording an event fails; the block is then leaked (never reused),
  // since nothing tells when the other streams are done with it.
  void deallocate(void* ptr) override;
  void record_stream(void* ptr, const Stream& stream) override;
  MemoryStats stats() const override;
  void reset_peak_stats() override;
  void empty_cache() override;

  static size_t round_size(size_t bytes);

 private:
  struct Block {
    void* ptr = nullptr;
    size_t size = 0;  // rounded
    Stream stream;
    std::vector<Stream> other_streams;
    std::vector<void*> pending_events;
  };
  struct BySizeOrder {
    bool operator()(const Block* a, const Block* b) const;
  };

  Block* take_cached(const Stream& stream, size_t size, uint64_t room);
  void process_pending();
  void release_cached();
  void update_peaks();

  Backend backend_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block*> live_;
  std::set<Block*, BySizeOrder> free_;
  std::vector<Block*> pending_;  // freed, waiting for other streams' events
  MemoryStats stats_;
};

}  // namespace ddp
