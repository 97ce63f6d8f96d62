#include "runtime/memory/caching_allocator.h"

#include "runtime/error.h"

#include <algorithm>
#include <tuple>

namespace ddp {
namespace {

constexpr size_t kSmallLimit = size_t{1} << 20;  // 1 MiB
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t{2} << 20;  // 2 MiB

size_t round_up(size_t n, size_t m) {
  return (n + m - 1) / m * m;
}

auto stream_key(const Stream& s) {
  return std::make_tuple(static_cast<int>(s.device().type), s.device().index, s.handle());
}

}  // namespace

size_t CachingAllocator::round_size(size_t bytes) {
  return bytes <= kSmallLimit ? round_up(std::max<size_t>(bytes, 1), kSmallRound)
                              : round_up(bytes, kLargeRound);
}

bool CachingAllocator::BySizeOrder::operator()(const Block* a, const Block* b) const {
  return std::tuple_cat(stream_key(a->stream), std::tie(a->size, a->ptr)) <
         std::tuple_cat(stream_key(b->stream), std::tie(b->size, b->ptr));
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

CachingAllocator::Block* CachingAllocator::take_cached(const Stream& stream, size_t size,
                                                       uint64_t room) {
  Block key;
  key.stream = stream;
  key.size = size;
  key.ptr = nullptr;
  auto it = free_.lower_bound(&key);
  if (it == free_.end() || (*it)->stream != stream || (*it)->size / 2 > size ||
      (*it)->size > room) {
    return nullptr;
  }
  Block* block = *it;
  free_.erase(it);
  return block;
}

void* CachingAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t size = round_size(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t room = room_under_limit(stats_.allocated);  // Note [memory limit]
  if (size > room) throw_past_limit(backend_.name, bytes, stats_);
  process_pending();
  const Stream stream = backend_.current_stream ? backend_.current_stream() : Stream();
  Block* block = take_cached(stream, size, room);
  if (block != nullptr) {
    ++stats_.num_cache_hits;
  } else {
    void* ptr = backend_.raw_alloc(size);
    if (ptr == nullptr) {
      release_cached();
      ptr = backend_.raw_alloc(size);
    }
    if (ptr == nullptr) {
      const std::string hint = backend_.oom_hint ? backend_.oom_hint() : "";
      throw OutOfMemoryError(fmt::format(
          "{} out of memory: tried to allocate {} ({} bytes); {} allocated by ddp, {} reserved by "
          "its caching allocator{}. Reduce the batch size or the model, or free tensors you no "
          "longer need.",
          backend_.name, format_bytes(bytes), bytes, format_bytes(stats_.allocated),
          format_bytes(stats_.reserved), hint.empty() ? "" : "; " + hint));
    }
    block = new Block;
    block->ptr = ptr;
    block->size = size;
    block->stream = stream;
    ++stats_.num_raw_allocs;
    stats_.reserved += size;
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

void CachingAllocator::process_pending() {
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
  for (Block* block : free_) {
    backend_.raw_free(block->ptr);
    stats_.reserved -= block->size;
    ++stats_.num_raw_frees;
    delete block;
  }
  free_.clear();
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
  process_pending();
  release_cached();
}

}  // namespace ddp
