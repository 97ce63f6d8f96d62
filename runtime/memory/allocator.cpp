#include "runtime/memory/allocator.h"

#include "runtime/cuda/cuda_api.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/memory/cpu_allocator.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ddp {
namespace {

constexpr const char* kMemoryLimitVar = env::kMemoryLimit;

// Note [memory limit]: the limit every device allocator starts with, read once.
// A malformed value throws on every call, so each first use of a device says so.
uint64_t memory_limit_from_environment() {
  static const uint64_t limit = [] {
    const auto text = env::get(kMemoryLimitVar);
    return text ? parse_memory_size(*text, kMemoryLimitVar) : uint64_t{0};
  }();
  return limit;
}

// Note [no caching] in memory/caching_allocator.h: DDP_NO_CUDA_MEMORY_CACHING=1 turns the
// CUDA devices' caching off (read once); "0" or unset keeps it; anything else throws on
// every first use of a device, naming the variable and its values.
bool cuda_caching_from_environment() {
  static const std::optional<std::string> text = env::get(env::kNoCudaMemoryCaching);
  if (!text || *text == "0") return true;
  if (*text == "1") return false;
  throw ValueError(
      fmt::format("{}='{}': expected 1 (every CUDA tensor its own cudaMalloc, for "
                  "compute-sanitizer) or 0 (the caching allocator, the default)",
                  env::kNoCudaMemoryCaching, *text));
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The bytes of a unit of parse_memory_size, or 0 for an unknown unit.
uint64_t unit_bytes(std::string_view unit) {
  std::string lower(unit);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  constexpr uint64_t kKi = 1024, kK = 1000;
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", kKi},
      {"kib", kKi},
      {"m", kKi * kKi},
      {"mib", kKi * kKi},
      {"g", kKi * kKi * kKi},
      {"gib", kKi * kKi * kKi},
      {"t", kKi * kKi * kKi * kKi},
      {"tib", kKi * kKi * kKi * kKi},
      {"kb", kK},
      {"mb", kK * kK},
      {"gb", kK * kK * kK},
      {"tb", kK * kK * kK * kK},
  };
  for (const auto& [name, bytes] : kUnits) {
    if (lower == name) return bytes;
  }
  return 0;
}

// The digits at the front of `s`, removed from it.
std::string_view take_digits(std::string_view& s) {
  size_t n = 0;
  while (n < s.size() && std::isdigit(static_cast<unsigned char>(s[n]))) ++n;
  const std::string_view digits = s.substr(0, n);
  s.remove_prefix(n);
  return digits;
}

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
  b.host_memory = cuda_api::emulated();  // Note [emulated CUDA device]
  b.caching = cuda_caching_from_environment();
  b.no_caching_source = fmt::format("{}=1", env::kNoCudaMemoryCaching);
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
  b.host_memory = true;
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

uint64_t Allocator::begin_capture(const Stream& capture, const Stream&, uint64_t) {
  throw DeviceError(fmt::format(
      "CUDA graph capture on {}: its allocator cannot capture; capture on a CUDA device",
      capture.device().str()));
}

void Allocator::end_capture(const Stream& capture) {
  begin_capture(capture, capture, 0);
}

void Allocator::release_pool(uint64_t) {
  throw DeviceError("release_pool: this allocator has no graph pools (only CUDA devices capture)");
}

Allocator& device_allocator(const Device& device) {
  if (device.is_cpu()) {
    if (device.index != 0) check_available(device);  // Note [virtual cpu devices]
    // Never destroyed, as the CUDA allocators: tensors in static objects may outlive it.
    static auto* cpu = [] {
      const uint64_t limit = memory_limit_from_environment();
      auto* allocator = new CpuAllocator(CpuAllocator::from_environment());
      allocator->set_memory_limit(limit);
      return allocator;
    }();
    return *cpu;
  }
  check_available(device);
  DDP_ASSERT(device.is_cuda(), "no allocator for device {}", device.str());
  // Never destroyed: tensors in static objects may outlive any destructor order.
  static std::mutex mutex;
  static auto* per_device = new std::unordered_map<int, CachingAllocator*>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*per_device)[device.index];
  if (slot == nullptr) {
    const uint64_t limit = memory_limit_from_environment();
    slot = new CachingAllocator(cuda_backend(device.index));
    slot->set_memory_limit(limit);
  }
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

void set_memory_limit(const Device& device, uint64_t bytes) {
  device_allocator(device).set_memory_limit(bytes);
}
uint64_t memory_limit(const Device& device) {
  return device_allocator(device).memory_limit();
}

void Allocator::throw_past_limit(const std::string& device, size_t bytes,
                                 const MemoryStats& stats) const {
  throw OutOfMemoryError(fmt::format(
      "{} out of memory: tried to allocate {} ({} bytes) past the memory limit of {} ({} or "
      "set_memory_limit); {} allocated now, peak {}. Raise {} or shard more: train --zero 3.",
      device, format_bytes(bytes), bytes, format_bytes(memory_limit()), kMemoryLimitVar,
      format_bytes(stats.allocated), format_bytes(stats.max_allocated), kMemoryLimitVar));
}

uint64_t parse_memory_size(std::string_view text, std::string_view source) {
  auto fail = [&](std::string_view why) {
    throw ValueError(fmt::format(
        "{}='{}' {}; give a byte count or a number with a unit, e.g. 1073741824, 512MiB, 2GiB, "
        "1.5GB, 300M, 64k (K, M, G, T and KiB, MiB, GiB, TiB are powers of 1024; KB, MB, GB, TB "
        "powers of 1000); 0: no limit",
        source, text, why));
  };
  std::string_view rest = trim(text);
  const std::string_view whole = take_digits(rest);
  std::string_view fraction;
  if (!rest.empty() && rest.front() == '.') {
    rest.remove_prefix(1);
    fraction = take_digits(rest);
    if (fraction.empty()) fail("is not a memory size");
  }
  const uint64_t unit = unit_bytes(trim(rest));
  if (whole.empty() || unit == 0) fail("is not a memory size");
  if (!fraction.empty() && unit == 1) fail("has a fraction of a byte");
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(whole.data(), whole.data() + whole.size(), value);
  if (ec != std::errc()) fail("is larger than 2^64-1 bytes");
  // At most 18 digits of the fraction count: a long double holds them exactly, and the
  // product, under one unit, is within a byte.
  uint64_t digits = 0;
  long double scale = 1;
  for (char c : fraction.substr(0, 18)) {
    digits = digits * 10 + static_cast<uint64_t>(c - '0');
    scale *= 10;
  }
  const auto part =
      static_cast<uint64_t>(std::llroundl(digits * static_cast<long double>(unit) / scale));
  if (value > (UINT64_MAX - part) / unit) fail("is larger than 2^64-1 bytes");
  return value * unit + part;
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
