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
//
// Note [capture pools]: a CUDA graph (runtime/cuda_graph.h) replays the addresses it
// captured, so the blocks its kernels use must stay its own while it lives. As in
// PyTorch's private graph pools:
// - Between begin_capture(S, A, pool) and end_capture(S), an allocation made while the
//   capture stream S is current takes a block of the pool: a free one of the pool, else
//   a free ordinary block of S or A (A's work is ordered before every replay, since a
//   replay waits for A), else new memory. The block is the pool's from then on: freed,
//   it returns to the pool's free list, for that pool's captures only.
// - A block freed while any capture runs is kept by a capturing pool (S's when the
//   block's stream or the current stream is S, else the first) whatever the stream it
//   was made on: a captured kernel may still use it at every replay. Blocks of S or A
//   join the pool's free list; others, and blocks that other streams used
//   (record_stream), are parked until the pool is released.
// - While a capture runs, no event is queried (cudaEventQuery is not allowed to the
//   capturing thread), no memory is returned to the system (cudaFree synchronizes the
//   device) and an allocation that finds no memory throws at once.
// - release_pool(id), once no replay runs any more: the pool's free and parked blocks
//   are returned to the system; its live blocks (a graph's outputs still referenced)
//   become ordinary blocks of A (S, the capture stream, dies with the graph).
// - The pool counts in allocated/reserved as any block.
//
// Note [no caching]: a Backend with caching = false (DDP_NO_CUDA_MEMORY_CACHING=1 for the
// CUDA devices, as PyTorch's PYTORCH_NO_CUDA_MEMORY_CACHING) gives every allocation its own
// raw block of exactly the bytes asked and returns it to the system when freed, so that
// a checker of the raw allocations (compute-sanitizer's memcheck) sees a kernel that reads
// past its tensor, which a rounded or reused block hides. Slow (cudaFree waits for the
// device, which is also what makes freeing a block other streams used safe); no
// captures (a graph's pool is a cache): begin_capture throws, naming the variable.
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
    // The blocks are host memory (pinned, the emulated CUDA device): under
    // AddressSanitizer a block's bytes past the request, and a whole cached block, are
    // poisoned, so that a kernel reading past its tensor or into a freed one is
    // reported although the block itself is still allocated.
    bool host_memory = false;
    // Note [no caching]: false: exact raw blocks, freed at once, no captures.
    bool caching = true;
    // The setting that turned caching off, named when a capture is refused.
    std::string no_caching_source;
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
  uint64_t begin_capture(const Stream& capture, const Stream& after, uint64_t pool) override;
  void end_capture(const Stream& capture) override;
  void release_pool(uint64_t pool) override;

  static size_t round_size(size_t bytes);

 private:
  struct Block {
    void* ptr = nullptr;
    size_t size = 0;  // rounded
    uint64_t pool{};  // Note [capture pools]: 0 for an ordinary block
    Stream stream;
    std::vector<Stream> other_streams;
    std::vector<void*> pending_events;
  };
  struct BySizeOrder {
    bool operator()(const Block* a, const Block* b) const;
  };

  struct Capture {
    Stream stream;  // S
    Stream after;   // A
    uint64_t pool = 0;
  };
  struct Pool {
    Stream after;                // A of its first capture: its live blocks' stream once released
    std::vector<Block*> parked;  // freed, not reusable until the pool is released
    int users = 0;               // graphs captured into it, not yet released
    bool capturing = false;
  };
  Block* take_cached(uint64_t pool, const Stream& stream, size_t size, uint64_t room);
  const Capture* capture_of(const Stream& stream) const;
  void keep_in_pool(Block* block);  // a block freed during a capture
  void process_pending();
  void release_cached();
  void free_raw(Block* block);  // back to the system, counted
  void update_peaks();

  Backend backend_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block*> live_;
  std::set<Block*, BySizeOrder> free_;
  std::vector<Block*> pending_;    // freed, waiting for other streams' events
  std::vector<Capture> captures_;  // running
  std::unordered_map<uint64_t, Pool> pools_;
  uint64_t next_pool_ = 1;
  MemoryStats stats_;
};

}  // namespace ddp
