// Note [memory limit]: a cap on the bytes a device allocator has allocated, and
// the DDP_MEMORY_LIMIT parser.
#include "runtime/error.h"
#include "runtime/memory/allocator.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/memory/cpu_allocator.h"
#include "runtime/tensor.h"
#include "tests/unit/error_text.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

namespace ddp {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

// The message of the OutOfMemoryError `fn` throws, or "(no error)".
std::string oom_text(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const OutOfMemoryError& e) {
    return e.what();
  }
  return "(no error)";
}

// The process-wide allocators are shared by every test: the limit goes back to what
// it was (none, unless DDP_MEMORY_LIMIT is set) however the test ends.
struct LimitGuard {
  explicit LimitGuard(Device d) : device(d), before(memory_limit(d)) {}
  ~LimitGuard() { set_memory_limit(device, before); }
  Device device;
  uint64_t before;
};

// A CachingAllocator over malloc with the CPU stream and no events.
CachingAllocator::Backend malloc_backend() {
  CachingAllocator::Backend b;
  b.name = "fake:0";
  b.raw_alloc = [](size_t bytes) { return std::malloc(bytes); };
  b.raw_free = [](void* p) { std::free(p); };
  b.current_stream = [] { return Stream(); };
  b.record_event = [](const Stream&) -> void* { return nullptr; };
  b.event_done = [](void*) { return true; };
  b.destroy_event = [](void*) {};
  return b;
}

TEST(MemoryLimit, AllocationUpToTheLimitWorksAndPastItThrows) {
  CpuAllocator alloc({.cache_limit_bytes = 0});
  EXPECT_EQ(alloc.memory_limit(), 0u) << "no limit unless set";
  alloc.set_memory_limit(kMiB);
  EXPECT_EQ(alloc.memory_limit(), kMiB);
  void* a = alloc.allocate(512 * kKiB);
  void* b = alloc.allocate(512 * kKiB);  // exactly at the limit
  EXPECT_EQ(alloc.stats().allocated, kMiB);
  const MemoryStats before = alloc.stats();
  EXPECT_NE(oom_text([&] { alloc.allocate(1); }), "(no error)");
  EXPECT_EQ(alloc.stats().allocated, before.allocated) << "a refused allocation counts nothing";
  EXPECT_EQ(alloc.stats().num_allocs, before.num_allocs);
  alloc.deallocate(a);
  alloc.deallocate(b);
}

TEST(MemoryLimit, MessageNamesDeviceRequestLimitAllocatedPeakAndFix) {
  CpuAllocator alloc({.cache_limit_bytes = 0});
  alloc.set_memory_limit(kMiB);
  void* held = alloc.allocate(512 * kKiB);
  alloc.deallocate(alloc.allocate(256 * kKiB));  // peak 768 KiB
  const std::string msg = oom_text([&] { alloc.allocate(kMiB); });
  for (const char* part :
       {"cpu out of memory", "tried to allocate 1.00 MiB (1048576 bytes)",
        "memory limit of 1.00 MiB", "512.00 KiB allocated now", "peak 768.00 KiB",
        "Raise DDP_MEMORY_LIMIT or shard more: train --zero 3"}) {
    EXPECT_NE(msg.find(part), std::string::npos) << "no '" << part << "' in: " << msg;
  }
  alloc.deallocate(held);
}

TEST(MemoryLimit, FreeingMakesRoomAndZeroLiftsTheLimit) {
  CpuAllocator alloc({.cache_limit_bytes = 0});
  alloc.set_memory_limit(kMiB);
  void* a = alloc.allocate(768 * kKiB);
  EXPECT_NE(oom_text([&] { alloc.allocate(512 * kKiB); }), "(no error)");
  alloc.deallocate(a);
  void* b = alloc.allocate(512 * kKiB);
  EXPECT_NE(b, nullptr) << "freed bytes are room again";
  alloc.set_memory_limit(0);
  void* c = alloc.allocate(4 * kMiB);
  EXPECT_NE(c, nullptr) << "0: no limit";
  alloc.set_memory_limit(kMiB);  // below what is allocated: nothing is freed, nothing more fits
  EXPECT_EQ(alloc.stats().allocated, 4 * kMiB + 512 * kKiB);
  EXPECT_NE(oom_text([&] { alloc.allocate(64); }), "(no error)");
  alloc.deallocate(b);
  alloc.deallocate(c);
}

// A cached block is up to 1/8 larger than the request (Note [cpu block cache]):
// past the limit it stays cached and a block of the request's size is allocated.
TEST(MemoryLimit, CpuCachedBlockPastTheLimitIsNotHandedOut) {
  CpuAllocator alloc({.min_cached_bytes = kMiB, .cache_limit_bytes = 64 * kMiB});
  alloc.deallocate(alloc.allocate(4 * kMiB + 256 * kKiB));
  alloc.set_memory_limit(4 * kMiB);
  void* p = alloc.allocate(4 * kMiB);
  EXPECT_EQ(alloc.stats().allocated, 4 * kMiB);
  EXPECT_EQ(alloc.stats().num_cache_hits, 0u);
  EXPECT_EQ(alloc.stats().num_raw_allocs, 2u);
  alloc.deallocate(p);
}

TEST(MemoryLimit, CachingAllocatorCountsRoundedBlocks) {
  CachingAllocator alloc(malloc_backend());
  alloc.deallocate(alloc.allocate(3 * kMiB));  // a cached 4 MiB block
  alloc.set_memory_limit(3 * kMiB);
  const std::string msg = oom_text([&] { alloc.allocate(3 * kMiB); });  // rounds to 4 MiB
  EXPECT_NE(msg.find("fake:0 out of memory: tried to allocate 3.00 MiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("memory limit of 3.00 MiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("peak 4.00 MiB"), std::string::npos) << msg;
  // 2 MiB could take the cached 4 MiB block, which would pass the limit: a new one.
  void* p = alloc.allocate(2 * kMiB);
  EXPECT_EQ(alloc.stats().allocated, 2 * kMiB);
  EXPECT_EQ(alloc.stats().num_cache_hits, 0u);
  alloc.deallocate(p);
}

TEST(MemoryLimit, DeviceLimitCapsTensorsButNotPinnedMemory) {
  const Device cpu = Device::cpu();
  LimitGuard guard(cpu);
  const uint64_t limit = memory_allocated(cpu) + kMiB;
  set_memory_limit(cpu, limit);
  EXPECT_EQ(memory_limit(cpu), limit);
  {
    Tensor small = empty({int64_t{256 * kKiB}}, {.dtype = DType::u8});
    const std::string msg = oom_text([] { empty({int64_t{2 * kMiB}}, {.dtype = DType::u8}); });
    EXPECT_NE(msg.find("tried to allocate 2.00 MiB"), std::string::npos) << msg;
  }
  void* staging = pinned_host_allocator().allocate(2 * kMiB);
  EXPECT_NE(staging, nullptr) << "pinned host memory is not capped";
  pinned_host_allocator().deallocate(staging);
  set_memory_limit(cpu, 0);
  EXPECT_EQ(oom_text([] { empty({int64_t{2 * kMiB}}, {.dtype = DType::u8}); }), "(no error)");
}

TEST(ParseMemorySize, AcceptsBytesAndUnits) {
  EXPECT_EQ(parse_memory_size("0"), 0u);
  EXPECT_EQ(parse_memory_size("1073741824"), 1073741824u);
  EXPECT_EQ(parse_memory_size("512B"), 512u);
  EXPECT_EQ(parse_memory_size("512MiB"), 512 * kMiB);
  EXPECT_EQ(parse_memory_size("2GiB"), 2048 * kMiB);
  EXPECT_EQ(parse_memory_size("1.5GB"), 1500000000u);
  EXPECT_EQ(parse_memory_size("0.3GB"), 300000000u);
  EXPECT_EQ(parse_memory_size("300M"), 300 * kMiB);
  EXPECT_EQ(parse_memory_size("64k"), 64 * kKiB);
  EXPECT_EQ(parse_memory_size("64KB"), 64000u);
  EXPECT_EQ(parse_memory_size("64kib"), 64 * kKiB);
  EXPECT_EQ(parse_memory_size("1.5G"), 1536 * kMiB);
  EXPECT_EQ(parse_memory_size("0.5k"), 512u);
  EXPECT_EQ(parse_memory_size(" 1 GiB "), 1024 * kMiB);
  EXPECT_EQ(parse_memory_size("2T"), 2 * 1024 * 1024 * kMiB);
  EXPECT_EQ(parse_memory_size("3tb"), 3000000000000u);
  EXPECT_EQ(parse_memory_size("18446744073709551615"), UINT64_MAX);
}

TEST(ParseMemorySize, RejectsOtherTextNamingSourceValueAndExamples) {
  for (const char* bad : {"", "abc", "-1", "+1", "1.5", "1.5B", "12XB", "1e9", "GiB", "1.", ".5G",
                          "1 2", "1GiBs", "18446744073709551616", "17179869184GiB"}) {
    const std::string msg = test_util::error_text([&] { parse_memory_size(bad); });
    EXPECT_NE(msg.find(std::string("DDP_MEMORY_LIMIT='") + bad + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("512MiB, 2GiB, 1.5GB, 300M, 64k"), std::string::npos) << msg;
  }
  const std::string msg = test_util::error_text([] { parse_memory_size("2X", "--memory-limit"); });
  EXPECT_NE(msg.find("--memory-limit='2X' is not a memory size"), std::string::npos) << msg;
  EXPECT_NE(test_util::error_text([] {
              parse_memory_size("17179869184GiB");
            }).find("larger than 2^64-1 bytes"),
            std::string::npos);
}

}  // namespace
}  // namespace ddp
