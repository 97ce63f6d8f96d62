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
//   is parked on free until an event recorded on each of those streams has
//   completed (checked on later allocations).
// - When the raw allocation fails, the cache is released and the allocation
//   retried once; then OutOfMemoryError names the device, the request,
//   allocated and reserved bytes.
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
    std::function<void*()> current_stream;     // the stream a new block belongs to
    std::function<void*(void*)> record_event;  // new event recorded on a stream
    std::function<bool(void*)> event_done;
    std::function<void(void*)> destroy_event;
    std::function<std::string()> oom_hint;  // extra text for the OOM message (free/total)
  };

  explicit CachingAllocator(Backend backend);
  ~CachingAllocator() override;

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr) override;
  void record_stream(void* ptr, const Stream& stream) override;
  void record_stream_handle(void* ptr, void* stream);
  MemoryStats stats() const override;
  void reset_peak_stats() override;
  void empty_cache() override;

  static size_t round_size(size_t bytes);

 private:
  struct Block {
    void* ptr = nullptr;
    size_t size = 0;  // rounded
    void* stream = nullptr;
    std::vector<void*> other_streams;
    std::vector<void*> pending_events;
  };
  struct BySizeOrder {
    bool operator()(const Block* a, const Block* b) const;
  };

  Block* take_cached(void* stream, size_t size);
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
