#include "runtime/memory/caching_allocator.h"

#include "runtime/error.h"
#include "runtime/memory/asan_poison.h"

#include <algorithm>
#include <tuple>

namespace ddp {
namespace {

using asan::poison;
using asan::unpoison;

constexpr size_t kSmallLimit = size_t{1} << 20;  // 1 MiB
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t{2} << 20;  // 2 MiB

auto stream_key(const Stream& s) {
  return std::make_tuple(static_cast<int>(s.device().type), s.device().index, s.handle());
}

}  // namespace

size_t CachingAllocator::round_size(size_t bytes) {
  return bytes <= kSmallLimit ? round_up(std::max<size_t>(bytes, 1), kSmallRound)
                              : round_up(bytes, kLargeRound);
}

bool CachingAllocator::BySizeOrder::operator()(const Block* a, const Block* b) const {
  return std::tuple_cat(std::tie(a->pool), stream_key(a->stream), std::tie(a->size, a->ptr)) <
         std::tuple_cat(std::tie(b->pool), stream_key(b->stream), std::tie(b->size, b->ptr));
}

CachingAllocator::CachingAllocator(Backend backend) : backend_(std::move(backend)) {}

CachingAllocator::~CachingAllocator() {
  // Live blocks may still be referenced by tensors in static objects; only the cache
  // is returned. At process exit the driver reclaims everything anyway.
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached();
  } catch (...) {
  }
}

CachingAllocator::Block* CachingAllocator::take_cached(uint64_t pool, const Stream& stream,
                                                       size_t size, uint64_t room) {
  Block key;
  key.pool = pool;
  key.stream = stream;
  key.size = size;
  key.ptr = nullptr;
  auto it = free_.lower_bound(&key);
  if (it == free_.end() || (*it)->pool != pool || (*it)->stream != stream ||
      (*it)->size / 2 > size || (*it)->size > room) {
    return nullptr;
  }
  Block* block = *it;
  free_.erase(it);
  return block;
}

void* CachingAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t size = backend_.caching ? round_size(bytes) : bytes;  // Note [no caching]
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t room = room_under_limit(stats_.allocated);  // Note [memory limit]
  if (size > room) throw_past_limit(backend_.name, bytes, stats_);
  process_pending();
  const Stream stream = backend_.current_stream ? backend_.current_stream() : Stream();
  const Capture* capture = capture_of(stream);  // Note [capture pools]
  const uint64_t pool = capture != nullptr ? capture->pool : 0;
  Block* block = take_cached(pool, stream, size, room);
  if (block == nullptr && capture != nullptr) {
    block = take_cached(0, stream, size, room);
    if (block == nullptr) block = take_cached(0, capture->after, size, room);
  }
  if (block != nullptr) {
    ++stats_.num_cache_hits;
    block->pool = pool;
    block->stream = stream;
  } else {
    void* ptr = backend_.raw_alloc(size);
    if (ptr == nullptr && captures_.empty()) {
      release_cached();
      ptr = backend_.raw_alloc(size);
    }
    if (ptr == nullptr) {
      const std::string hint = backend_.oom_hint ? backend_.oom_hint() : "";
      throw OutOfMemoryError(fmt::format(
          "{} out of memory: tried to allocate {} ({} bytes); {} allocated by ddp, {} reserved by "
          "its caching allocator{}{}. Reduce the batch size or the model, or free tensors you no "
          "longer need.",
          backend_.name, format_bytes(bytes), bytes, format_bytes(stats_.allocated),
          format_bytes(stats_.reserved), hint.empty() ? "" : "; " + hint,
          captures_.empty() ? ""
                            : "; a CUDA graph capture is running, so the cache was not "
                              "returned to the system (capture once memory is free)"));
    }
    block = new Block;
    block->ptr = ptr;
    block->size = size;
    block->pool = pool;
    block->stream = stream;
    ++stats_.num_raw_allocs;
    stats_.reserved += size;
  }
  if (backend_.host_memory) {
    unpoison(block->ptr, bytes);
    poison(static_cast<char*>(block->ptr) + bytes, block->size - bytes);
  }
  live_[block->ptr] = block;
  ++stats_.num_allocs;
  stats_.allocated += block->size;
  update_peaks();
  return block->ptr;
}

void CachingAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  DDP_ASSERT(it != live_.end(), "{}: free of a pointer this allocator did not hand out",
             backend_.name);
  Block* block = it->second;
  live_.erase(it);
  stats_.allocated -= block->size;
  if (!backend_.caching) {  // Note [no caching]: no capture runs, the system waits
    free_raw(block);
    return;
  }
  if (backend_.host_memory) poison(block->ptr, block->size);
  if (!captures_.empty()) {
    keep_in_pool(block);
    return;
  }
  if (block->pool != 0) {  // a graph's: reused by its pool only, parked if others used it
    if (block->other_streams.empty()) {
      free_.insert(block);
    } else {
      block->other_streams.clear();
      pools_[block->pool].parked.push_back(block);
    }
    return;
  }
  if (block->other_streams.empty()) {
    free_.insert(block);
    return;
  }
  try {
    for (const Stream& s : block->other_streams) {
      block->pending_events.push_back(backend_.record_event(s));
    }
  } catch (...) {
    // Without an event on every stream nothing says when the block is free again:
    // leak it (it stays counted as reserved) rather than hand it out too early.
    for (void* e : block->pending_events) {
      try {
        backend_.destroy_event(e);
      } catch (...) {
        // The error being thrown already says what went wrong with this device.
      }
    }
    delete block;
    throw;
  }
  block->other_streams.clear();
  pending_.push_back(block);
}

void CachingAllocator::record_stream(void* ptr, const Stream& stream) {
  if (ptr == nullptr || !stream.device().is_cuda()) return;  // the CPU stream is synchronous
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  DDP_CHECK(it != live_.end(), "{}: record_stream on a pointer this allocator did not hand out",
            backend_.name);
  Block* block = it->second;
  if (stream == block->stream) return;
  auto& others = block->other_streams;
  if (std::find(others.begin(), others.end(), stream) == others.end()) others.push_back(stream);
}

const CachingAllocator::Capture* CachingAllocator::capture_of(const Stream& stream) const {
  for (const Capture& c : captures_) {
    if (c.stream == stream) return &c;
  }
  return nullptr;
}

void CachingAllocator::keep_in_pool(Block* block) {
  bool reusable = block->other_streams.empty();
  if (block->pool == 0) {  // adopted by a capture: a captured kernel may use it at replays
    const Capture* capture = capture_of(block->stream);
    if (capture == nullptr && backend_.current_stream) {
      capture = capture_of(backend_.current_stream());
    }
    if (capture == nullptr) capture = &captures_.front();
    block->pool = capture->pool;
    if (block->stream == capture->after) block->stream = capture->stream;
    // Work of another stream is not ordered before the replays.
    reusable = reusable && block->stream == capture->stream;
  }
  if (reusable) {
    free_.insert(block);  // for its pool's captures, in their stream's order
  } else {
    block->other_streams.clear();
    pools_[block->pool].parked.push_back(block);
  }
}

void CachingAllocator::process_pending() {
  if (!captures_.empty()) return;  // Note [capture pools]: no event queries
  // By index rather than remove_if: event_done may throw, and pending_ must stay whole.
  for (size_t i = 0; i < pending_.size();) {
    Block* block = pending_[i];
    const auto& events = block->pending_events;
    if (!std::all_of(events.begin(), events.end(),
                     [this](void* e) { return backend_.event_done(e); })) {
      ++i;
      continue;
    }
    pending_[i] = pending_.back();
    pending_.pop_back();
    const std::vector<void*> done = std::move(block->pending_events);
    block->pending_events.clear();
    free_.insert(block);
    for (void* e : done) backend_.destroy_event(e);
  }
}

void CachingAllocator::release_cached() {
  for (auto it = free_.begin(); it != free_.end();) {
    Block* block = *it;
    if (block->pool != 0) {  // a graph's (Note [capture pools])
      ++it;
      continue;
    }
    it = free_.erase(it);
    free_raw(block);
  }
}

void CachingAllocator::free_raw(Block* block) {
  if (backend_.host_memory) unpoison(block->ptr, block->size);
  backend_.raw_free(block->ptr);
  stats_.reserved -= block->size;
  ++stats_.num_raw_frees;
  delete block;
}

void CachingAllocator::update_peaks() {
  stats_.max_allocated = std::max(stats_.max_allocated, stats_.allocated);
  stats_.max_reserved = std::max(stats_.max_reserved, stats_.reserved);
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.max_allocated = stats_.allocated;
  stats_.max_reserved = stats_.reserved;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!captures_.empty()) return;  // cudaFree would break the capture
  process_pending();
  release_cached();
}

uint64_t CachingAllocator::begin_capture(const Stream& capture, const Stream& after,
                                         uint64_t pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!backend_.caching) {
    throw DeviceError(fmt::format(
        "{}: a CUDA graph capture needs the caching allocator (a graph keeps its blocks in a "
        "pool of it), which {} turned off; unset it to capture",
        backend_.name, backend_.no_caching_source));
  }
  DDP_CHECK(capture_of(capture) == nullptr,
            "{}: a capture is already running on this stream; end it before beginning another",
            backend_.name);
  DDP_CHECK(pool == 0 || pools_.count(pool) != 0,
            "{}: no graph pool {} (released, or never made); pass 0 for a new pool", backend_.name,
            pool);
  if (pool == 0) pool = next_pool_++;
  Pool& p = pools_[pool];
  if (p.users == 0) p.after = after;
  DDP_CHECK(!p.capturing, "{}: graph pool {} is already capturing on another stream", backend_.name,
            pool);
  p.capturing = true;
  ++p.users;
  captures_.push_back(Capture{capture, after, pool});
  return pool;
}

void CachingAllocator::end_capture(const Stream& capture) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = std::find_if(captures_.begin(), captures_.end(),
                               [&](const Capture& c) { return c.stream == capture; });
  DDP_CHECK(it != captures_.end(), "{}: end_capture without a capture running on the stream",
            backend_.name);
  pools_[it->pool].capturing = false;
  captures_.erase(it);
}

void CachingAllocator::release_pool(uint64_t pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = pools_.find(pool);
  DDP_CHECK(it != pools_.end() && !it->second.capturing && it->second.users > 0,
            "{}: release_pool({}): no such pool, or it is still capturing", backend_.name, pool);
  if (--it->second.users > 0) return;  // another graph still replays its blocks
  DDP_CHECK(captures_.empty(),
            "{}: graph pool {} released while a capture runs (cudaFree would break it); release "
            "it after the capture",
            backend_.name, pool);
  std::vector<Block*> gone = std::move(it->second.parked);
  const Stream after = it->second.after;
  pools_.erase(it);
  for (auto b = free_.begin(); b != free_.end();) {
    if ((*b)->pool == pool) {
      gone.push_back(*b);
      b = free_.erase(b);
    } else {
      ++b;
    }
  }
  for (Block* block : gone) free_raw(block);
  for (auto& [ptr, block] : live_) {
    if (block->pool != pool) continue;
    block->pool = 0;  // an output still referenced: the graph is done with it
    block->stream = after;
  }
}

}  // namespace ddp
