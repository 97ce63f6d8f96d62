#include "runtime/memory/allocator.h"

#include "runtime/cuda/cuda_api.h"
#include "runtime/error.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/memory/cpu_allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace ddp {
namespace {

constexpr size_t kCpuAlignment = 64;  // as CpuAllocator

// Events of the caching allocators are ddp::Events: each is created on, and every
// call on it made with, the device of the stream it is recorded on (which, after a
// cross-device copy, need not be the allocator's device; pinned memory has none).
void* record_cuda_event(const Stream& stream) {
  auto event = std::make_unique<Event>(stream.device(), /*enable_timing=*/false);
  event->record(stream);
  return event.release();
}
bool cuda_event_done(void* event) {
  return static_cast<const Event*>(event)->query();
}
void destroy_cuda_event(void* event) {
  delete static_cast<Event*>(event);
}

CachingAllocator::Backend cuda_backend(int device) {
  CachingAllocator::Backend b;
  b.name = fmt::format("CUDA device cuda:{}", device);
  b.raw_alloc = [device](size_t bytes) { return cuda_api::malloc_device(device, bytes); };
  b.raw_free = [device](void* p) { cuda_api::free_device(device, p); };
  b.current_stream = [device] { return current_stream(Device::cuda(device)); };
  b.record_event = record_cuda_event;
  b.event_done = cuda_event_done;
  b.destroy_event = destroy_cuda_event;
  b.oom_hint = [device] {
    uint64_t free_bytes = 0, total = 0;
    cuda_api::mem_get_info(device, &free_bytes, &total);
    return fmt::format("the GPU has {} free of {}", format_bytes(free_bytes), format_bytes(total));
  };
  return b;
}

// Pinned host blocks belong to the CPU stream, never current on a GPU; a copy that
// reads or writes one records its CUDA stream, so the block is reused only after
// that copy finished.
CachingAllocator::Backend pinned_backend() {
  CachingAllocator::Backend b;
  b.name = "pinned host memory";
  b.current_stream = [] { return Stream(); };
  if (cuda_api::device_count() > 0) {
    b.raw_alloc = [](size_t bytes) { return cuda_api::malloc_pinned(bytes); };
    b.raw_free = [](void* p) { cuda_api::free_pinned(p); };
    b.record_event = record_cuda_event;
    b.event_done = cuda_event_done;
    b.destroy_event = destroy_cuda_event;
  } else {
    // No GPU: page-locking buys nothing, plain aligned memory stands in.
    b.raw_alloc = [](size_t bytes) { return std::aligned_alloc(kCpuAlignment, bytes); };
    b.raw_free = [](void* p) { std::free(p); };
    b.record_event = [](const Stream&) -> void* { return nullptr; };
    b.event_done = [](void*) { return true; };
    b.destroy_event = [](void*) {};
  }
  return b;
}

}  // namespace

Allocator& device_allocator(const Device& device) {
  if (device.is_cpu()) {
    if (device.index != 0) check_available(device);  // Note [virtual cpu devices]
    // Never destroyed, as the CUDA allocators: tensors in static objects may outlive it.
    static auto* cpu = new CpuAllocator(CpuAllocator::from_environment());
    return *cpu;
  }
  check_available(device);
  DDP_ASSERT(device.is_cuda(), "no allocator for device {}", device.str());
  // Never destroyed: tensors in static objects may outlive any destructor order.
  static std::mutex mutex;
  static auto* per_device = new std::unordered_map<int, CachingAllocator*>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*per_device)[device.index];
  if (slot == nullptr) slot = new CachingAllocator(cuda_backend(device.index));
  return *slot;
}

Allocator& pinned_host_allocator() {
  static auto* pinned = new CachingAllocator(pinned_backend());
  return *pinned;
}

MemoryStats memory_stats(const Device& device) {
  return device_allocator(device).stats();
}
uint64_t memory_allocated(const Device& device) {
  return memory_stats(device).allocated;
}
uint64_t memory_reserved(const Device& device) {
  return memory_stats(device).reserved;
}
uint64_t max_memory_allocated(const Device& device) {
  return memory_stats(device).max_allocated;
}
void reset_peak_memory_stats(const Device& device) {
  device_allocator(device).reset_peak_stats();
}
void empty_cache(const Device& device) {
  device_allocator(device).empty_cache();
}

std::string format_bytes(uint64_t bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

}  // namespace ddp
