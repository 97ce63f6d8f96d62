#include "runtime/memory/cpu_allocator.h"

#include "runtime/env.h"
#include "runtime/error.h"

#include <algorithm>
#include <cstdlib>

namespace ddp {
namespace {

constexpr size_t kPage = 4096;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

}  // namespace

CpuAllocator::CpuAllocator(CpuCacheOptions options) : options_(options) {}

CpuAllocator::~CpuAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cache_locked();
}

CpuCacheOptions CpuAllocator::from_environment() {
  CpuCacheOptions options;
  const int64_t mb = env::get_int(env::kCpuCacheMb).value_or(1024);
  DDP_CHECK(mb >= 0,
            "{}={} is negative; give the MiB of freed CPU blocks to keep for reuse (0 turns the "
            "cache off)",
            env::kCpuCacheMb, mb);
  options.cache_limit_bytes = kSanitized ? 0 : static_cast<size_t>(mb) << 20;
  return options;
}

void* CpuAllocator::take_cached(size_t size, uint64_t room) {
  auto it = cached_.lower_bound(size);
  if (it == cached_.end() || it->first > size + size / 8 || it->first > room) return nullptr;
  void* ptr = it->second;
  cached_bytes_ -= it->first;
  sizes_[ptr] = it->first;
  stats_.allocated += it->first;
  ++stats_.num_cache_hits;
  cached_.erase(it);
  return ptr;
}

void* CpuAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const bool cacheable = options_.cache_limit_bytes > 0 && bytes >= options_.min_cached_bytes;
  const size_t size = round_up(bytes, cacheable ? kPage : kCpuAlignment);
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t room = room_under_limit(stats_.allocated);  // Note [memory limit]
  if (size > room) throw_past_limit("cpu", bytes, stats_);
  void* ptr = cacheable ? take_cached(size, room) : nullptr;
  if (ptr == nullptr) {
    ptr = std::aligned_alloc(kCpuAlignment, size);
    if (ptr == nullptr && cached_bytes_ > 0) {
      release_cache_locked();
      ptr = std::aligned_alloc(kCpuAlignment, size);
    }
    if (ptr == nullptr) {
      throw OutOfMemoryError(fmt::format(
          "cpu out of memory: tried to allocate {} ({} bytes); {} allocated by ddp on the cpu. "
          "Reduce the batch size or the model, or free tensors you no longer need.",
          format_bytes(bytes), bytes, format_bytes(stats_.allocated)));
    }
    sizes_[ptr] = size;
    stats_.allocated += size;
    stats_.reserved += size;
    ++stats_.num_raw_allocs;
  }
  ++stats_.num_allocs;
  stats_.max_allocated = std::max(stats_.max_allocated, stats_.allocated);
  stats_.max_reserved = std::max(stats_.max_reserved, stats_.reserved);
  return ptr;
}

void CpuAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sizes_.find(ptr);
  DDP_ASSERT(it != sizes_.end(), "cpu allocator: free of a pointer it did not hand out");
  const size_t size = it->second;
  sizes_.erase(it);
  stats_.allocated -= size;
  const bool keep = options_.cache_limit_bytes > 0 && size >= options_.min_cached_bytes &&
                    cached_bytes_ + size <= options_.cache_limit_bytes;
  if (keep) {
    cached_.emplace(size, ptr);
    cached_bytes_ += size;
    return;
  }
  stats_.reserved -= size;
  ++stats_.num_raw_frees;
  std::free(ptr);
}

void CpuAllocator::release_cache_locked() {
  for (const auto& [size, ptr] : cached_) {
    std::free(ptr);
    stats_.reserved -= size;
    ++stats_.num_raw_frees;
  }
  cached_.clear();
  cached_bytes_ = 0;
}

void CpuAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cache_locked();
}

MemoryStats CpuAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CpuAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.max_allocated = stats_.allocated;
  stats_.max_reserved = stats_.reserved;
}

}  // namespace ddp
