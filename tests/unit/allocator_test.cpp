#include "runtime/memory/allocator.h"
#include "runtime/cuda_graph.h"
#include "runtime/error.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/memory/cpu_allocator.h"
#include "runtime/tensor.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <utility>

namespace ddp {
namespace {

// A fake stream of the fake device: a CUDA stream as the allocator sees it (no CUDA
// call is made on it). Handle 0 is the default stream of `device`.
Stream fake_stream(intptr_t handle, int device = 0) {
  return Stream::from_external(Device::cuda(device), reinterpret_cast<void*>(handle));
}

// A fake device: raw memory from malloc with a capacity, streams are integers,
// events complete when the test finishes their stream.
struct FakeDevice {
  struct FakeEvent {
    Stream stream;
    bool done = false;
  };
  size_t capacity = 64 << 20;
  size_t used = 0;
  int raw_allocs = 0;
  std::map<void*, size_t> live;
  Stream stream = fake_stream(1);
  std::set<FakeEvent*> events;
  int fail_record_after = -1;  // record_event throws after this many, as a CUDA error would
  int event_queries = 0;
  int raw_frees = 0;

  // After the allocator (declared later, destroyed first): what it still holds, such
  // as a leaked block, goes back so that sanitizer builds see no leak.
  ~FakeDevice() {
    for (auto& [p, n] : live) std::free(p);
    for (FakeEvent* e : events) delete e;
  }

  // Every event recorded on `s` so far completes.
  void finish(const Stream& s) {
    for (FakeEvent* e : events) e->done = e->done || e->stream == s;
  }
  void finish_all() {
    for (FakeEvent* e : events) e->done = true;
  }

  CachingAllocator::Backend backend() {
    CachingAllocator::Backend b;
    b.name = "fake:0";
    b.raw_alloc = [this](size_t n) -> void* {
      if (used + n > capacity) return nullptr;
      void* p = std::malloc(n);
      live[p] = n;
      used += n;
      ++raw_allocs;
      return p;
    };
    b.raw_free = [this](void* p) {
      used -= live.at(p);
      live.erase(p);
      ++raw_frees;
      std::free(p);
    };
    b.current_stream = [this] { return stream; };
    b.record_event = [this](const Stream& s) -> void* {
      if (fail_record_after == 0) throw CudaError("cudaEventRecord failed: fake");
      if (fail_record_after > 0) --fail_record_after;
      auto* e = new FakeEvent{s};
      events.insert(e);
      return e;
    };
    b.event_done = [this](void* e) {
      ++event_queries;
      return static_cast<FakeEvent*>(e)->done;
    };
    b.destroy_event = [this](void* e) {
      events.erase(static_cast<FakeEvent*>(e));
      delete static_cast<FakeEvent*>(e);
    };
    b.oom_hint = [] { return std::string("fake hint"); };
    return b;
  }
};

TEST(CachingAllocator, RoundsToSizeBins) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(1 << 20), size_t{1} << 20);
  EXPECT_EQ(CachingAllocator::round_size((1 << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(CachingAllocator::round_size((5 << 20) + 7), size_t{6} << 20);
}

TEST(CachingAllocator, ReusesFreedBlockAndCountsStats) {
  FakeDevice dev;
  CachingAllocator alloc(dev.backend());
  void* a = alloc.allocate(1000);
  MemoryStats s = alloc.stats();
  EXPECT_EQ(s.allocated, 1024u);
  EXPECT_EQ(s.reserved, 1024u);
  alloc.deallocate(a);
  s = alloc.stats();
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.reserved, 1024u);   // cached, not returned
  void* b = alloc.allocate(900);  // same bin
  EXPECT_EQ(b, a);
  s = alloc.stats();
  EXPECT_EQ(s.num_raw_allocs, 1u);
  EXPECT_EQ(s.num_cache_hits, 1u);
  EXPECT_EQ(s.num_allocs, 2u);
  EXPECT_EQ(dev.raw_allocs, 1);
  alloc.deallocate(b);
}

TEST(CachingAllocator, DoesNotHandOutBlocksMuchLargerThanAsked) {
  FakeDevice dev;
  CachingAllocator alloc(dev.backend());
  void* big = alloc.allocate(8 << 20);
  alloc.deallocate(big);
  void* small = alloc.allocate(1000);
  EXPECT_NE(small, big);
  EXPECT_EQ(alloc.stats().num_raw_allocs, 2u);
  alloc.deallocate(small);
}

TEST(CachingAllocator, BlocksBelongToTheirStream) {
  FakeDevice dev;
  CachingAllocator alloc(dev.backend());
  void* a = alloc.allocate(4096);
  alloc.deallocate(a);
  dev.stream = fake_stream(2);
  void* b = alloc.allocate(4096);
  EXPECT_NE(a, b) << "a block cached for stream 1 was handed to stream 2";
  dev.stream = fake_stream(1);
  void* c = alloc.allocate(4096);
  EXPECT_EQ(a, c);
  alloc.deallocate(b);
  alloc.deallocate(c);
}

TEST(CachingAllocator, RecordedStreamDelaysReuseUntilEventCompletes) {
  FakeDevice dev;
  CachingAllocator alloc(dev.backend());
  void* a = alloc.allocate(4096);
  alloc.record_stream(a, fake_stream(7));
  alloc.deallocate(a);
  ASSERT_EQ(dev.events.size(), 1u);
  EXPECT_EQ((*dev.events.begin())->stream, fake_stream(7)) << "the event must be on stream 7";
  void* b = alloc.allocate(4096);
  EXPECT_NE(a, b) << "reused while stream 7 may still read it";
  dev.finish(fake_stream(7));
  alloc.deallocate(b);
  void* c = alloc.allocate(4096);
  EXPECT_TRUE(c == a || c == b);
  EXPECT_TRUE(dev.events.empty()) << "completed events must be destroyed";
  void* d = alloc.allocate(4096);
  EXPECT_TRUE((d == a || d == b) && d != c) << "both blocks are free again";
  EXPECT_EQ(alloc.stats().num_raw_allocs, 2u);
  alloc.deallocate(c);
  alloc.deallocate(d);
}

TEST(CachingAllocator, BlockWaitsForEveryRecordedStream) {
  FakeDevice dev;
  CachingAllocator alloc(dev.backend());
  void* a = alloc.allocate(4096);
  alloc.record_stream(a, fake_stream(7));
  alloc.record_stream(a, fake_stream(8));
  alloc.record_stream(a, fake_stream(7));  // once per stream
  alloc.deallocate(a);
  EXPECT_EQ(dev.events.size(), 2u);
  dev.finish(fake_stream(7));
  void* b = alloc.allocate(4096);
  EXPECT_NE(a, b) << "reused while stream 8 may still read it";
  dev.finish(fake_stream(8));
  alloc.deallocate(b);
  void* c = alloc.allocate(4096);
  void* d = alloc.allocate(4096);
  EXPECT_TRUE((c == a && d == b) || (c == b && d == a));
  EXPECT_TRUE(dev.events.empty());
  alloc.deallocate(c);
  alloc.deallocate(d);
}

// Work queued on a stream after the free is not waited for: the event is taken at
// the free, so a stream that keeps working does not hold the block forever.
TEST(CachingAllocator, TheEventIsRecordedAtTheFree) {
  FakeDevice dev;
  CachingAllocator alloc(dev.backend());
  void* a = alloc.allocate(4096);
  alloc.record_stream(a, fake_stream(7));
  EXPECT_TRUE(dev.events.empty()) << "no event before the block is freed";
  alloc.deallocate(a);
  EXPECT_EQ(dev.events.size(), 1u);
  dev.finish(fake_stream(7));
  EXPECT_EQ(alloc.allocate(4096), a);
  alloc.deallocate(a);
}

TEST(CachingAllocator, OwnStreamAndCpuStreamNeedNoEvent) {
  FakeDevice dev;
  CachingAllocator alloc(dev.backend());
  void* a = alloc.allocate(4096);
  alloc.record_stream(a, dev.stream);  // the block's own stream: ordered anyway
  alloc.record_stream(a, Stream());    // the CPU stream is synchronous
  alloc.deallocate(a);
  EXPECT_TRUE(dev.events.empty());
  EXPECT_EQ(alloc.allocate(4096), a);
  alloc.deallocate(a);
}

// The handle nullptr is the default stream of each device: the default stream of
// cuda:1 is another stream than that of cuda:0, and its event is recorded on cuda:1.
TEST(CachingAllocator, DefaultStreamsOfTwoDevicesAreDifferentStreams) {
  FakeDevice dev;
  dev.stream = fake_stream(0, /*device=*/0);
  CachingAllocator alloc(dev.backend());
  void* a = alloc.allocate(4096);
  alloc.record_stream(a, fake_stream(0, /*device=*/1));
  alloc.deallocate(a);
  ASSERT_EQ(dev.events.size(), 1u) << "cuda:1's default stream was taken for the block's own";
  EXPECT_EQ((*dev.events.begin())->stream.device(), Device::cuda(1));
  void* b = alloc.allocate(4096);
  EXPECT_NE(b, a);
  dev.finish_all();
  void* c = alloc.allocate(4096);
  EXPECT_EQ(c, a);
  alloc.deallocate(b);
  alloc.deallocate(c);
}

TEST(CachingAllocator, EmptyCacheKeepsBlocksOtherStreamsStillUse) {
  FakeDevice dev;
  CachingAllocator alloc(dev.backend());
  void* a = alloc.allocate(4096);
  alloc.record_stream(a, fake_stream(7));
  alloc.deallocate(a);
  alloc.deallocate(alloc.allocate(2 << 20));  // a plain cached block
  alloc.empty_cache();
  EXPECT_EQ(dev.used, 4096u) << "only the block stream 7 may still use is kept";
  EXPECT_EQ(alloc.stats().reserved, 4096u);
  EXPECT_EQ(dev.live.count(a), 1u);
  dev.finish(fake_stream(7));
  alloc.empty_cache();
  EXPECT_EQ(dev.used, 0u);
  EXPECT_EQ(alloc.stats().reserved, 0u);
  EXPECT_TRUE(dev.events.empty());
}

TEST(CachingAllocator, AFailedEventRecordLeaksTheBlockInsteadOfReusingIt) {
  FakeDevice dev;
  CachingAllocator alloc(dev.backend());
  void* a = alloc.allocate(4096);
  alloc.record_stream(a, fake_stream(7));
  alloc.record_stream(a, fake_stream(8));
  dev.fail_record_after = 1;  // the event on stream 7 is made, the one on 8 fails
  EXPECT_THROW(alloc.deallocate(a), CudaError);
  dev.fail_record_after = -1;
  EXPECT_TRUE(dev.events.empty()) << "the events recorded before the failure must be destroyed";
  EXPECT_EQ(alloc.stats().allocated, 0u);
  void* b = alloc.allocate(4096);
  EXPECT_NE(b, a) << "a block whose readers are unknown was handed out";
  alloc.deallocate(b);
  EXPECT_EQ(alloc.allocate(4096), b);
  alloc.deallocate(b);
}

TEST(CachingAllocator, PeakAndReset) {
  FakeDevice dev;
  CachingAllocator alloc(dev.backend());
  void* a = alloc.allocate(3 << 20);
  void* b = alloc.allocate(1 << 20);
  alloc.deallocate(a);
  EXPECT_EQ(alloc.stats().max_allocated, (size_t{4} << 20) + (size_t{1} << 20));
  alloc.reset_peak_stats();
  EXPECT_EQ(alloc.stats().max_allocated, size_t{1} << 20);
  alloc.deallocate(b);
}

TEST(CachingAllocator, EmptyCacheReturnsMemory) {
  FakeDevice dev;
  CachingAllocator alloc(dev.backend());
  alloc.deallocate(alloc.allocate(10 << 20));
  EXPECT_GT(dev.used, 0u);
  alloc.empty_cache();
  EXPECT_EQ(dev.used, 0u);
  EXPECT_EQ(alloc.stats().reserved, 0u);
}

TEST(CachingAllocator, OutOfMemoryReleasesCacheThenRetries) {
  FakeDevice dev;
  dev.capacity = 16 << 20;
  CachingAllocator alloc(dev.backend());
  alloc.deallocate(alloc.allocate(10 << 20));  // cached 10 MiB
  void* p = alloc.allocate(12 << 20);          // fits only after the cache is released
  EXPECT_NE(p, nullptr);
  alloc.deallocate(p);
}

TEST(CachingAllocator, OutOfMemoryMessageNamesEverything) {
  FakeDevice dev;
  dev.capacity = 16 << 20;
  CachingAllocator alloc(dev.backend());
  void* held = alloc.allocate(8 << 20);
  try {
    alloc.allocate(100 << 20);
    FAIL() << "no error";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fake:0 out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("100.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("8.00 MiB allocated"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fake hint"), std::string::npos) << msg;
  }
  alloc.deallocate(held);
}

// Note [no caching]: exact raw blocks, returned at once, for a checker of raw allocations.
TEST(CachingAllocator, WithoutCachingEachAllocationIsItsOwnExactRawBlock) {
  FakeDevice dev;
  CachingAllocator::Backend backend = dev.backend();
  backend.caching = false;
  backend.no_caching_source = "DDP_NO_CUDA_MEMORY_CACHING=1";
  CachingAllocator alloc(std::move(backend));
  void* a = alloc.allocate(1000);
  ASSERT_EQ(dev.live.count(a), 1u);
  EXPECT_EQ(dev.live.at(a), 1000u) << "the raw block was rounded";
  MemoryStats s = alloc.stats();
  EXPECT_EQ(s.allocated, 1000u);
  EXPECT_EQ(s.reserved, 1000u);
  alloc.record_stream(a, fake_stream(2));  // freeing waits for the device, not for events
  alloc.deallocate(a);
  EXPECT_EQ(dev.raw_frees, 1) << "the freed block was kept";
  EXPECT_TRUE(dev.events.empty());
  s = alloc.stats();
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.reserved, 0u);
  void* b = alloc.allocate(1000);
  void* c = alloc.allocate(1000);
  EXPECT_NE(b, c);
  s = alloc.stats();
  EXPECT_EQ(s.num_raw_allocs, 3u);
  EXPECT_EQ(s.num_cache_hits, 0u);
  EXPECT_EQ(s.max_allocated, 2000u);
  alloc.deallocate(b);
  alloc.deallocate(c);
  EXPECT_EQ(dev.raw_frees, 3);
  EXPECT_TRUE(dev.live.empty());
  try {
    (void)alloc.begin_capture(fake_stream(3), fake_stream(1), 0);
    FAIL() << "a capture began without the cache";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("fake:0: a CUDA graph capture needs the caching "
                                         "allocator"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("DDP_NO_CUDA_MEMORY_CACHING=1"), std::string::npos)
        << e.what();
  }
}

TEST(CpuAllocator, StatsFollowTensors) {
  const Device cpu = Device::cpu();
  reset_peak_memory_stats(cpu);
  const uint64_t before = memory_allocated(cpu);
  {
    Tensor t = empty({1000}, {.device = cpu});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u)
        << "cpu memory is 64-byte aligned";
    EXPECT_EQ(memory_allocated(cpu), before + 4032);  // 4000 bytes rounded to 64
    EXPECT_GE(max_memory_allocated(cpu), before + 4032);
  }
  EXPECT_EQ(memory_allocated(cpu), before);
  EXPECT_GE(max_memory_allocated(cpu), before + 4032);
  reset_peak_memory_stats(cpu);
  EXPECT_EQ(max_memory_allocated(cpu), before);
}

TEST(CpuAllocator, OutOfMemoryIsATypedErrorWithTheSize) {
  try {
    empty({int64_t{1} << 58}, {.dtype = DType::u8});
    FAIL() << "no error";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("cpu out of memory: tried to allocate 256.00 PiB"),
              std::string::npos)
        << e.what();
  }
}

// Note [cpu block cache]: large blocks come back for the same size without a raw
// allocation; small ones, or any block past the limit, go back to the C library.
// Note [capture pools]: the capture stream is 2, the stream it is ordered after 1.
TEST(CapturePools, ACapturedBlockIsThePoolsUntilReleased) {
  FakeDevice dev;
  CachingAllocator alloc(dev.backend());
  void* a = alloc.allocate(4096);  // an eager step's block of stream 1, cached
  alloc.deallocate(a);
  const uint64_t pool = alloc.begin_capture(fake_stream(2), fake_stream(1), 0);
  EXPECT_NE(pool, 0u);
  dev.stream = fake_stream(2);
  void* x = alloc.allocate(4096);
  EXPECT_EQ(x, a) << "the capture should take the free block of the stream it follows";
  alloc.deallocate(x);
  void* y = alloc.allocate(4096);
  EXPECT_EQ(y, a) << "a block freed in the capture is reused by it, in stream order";
  alloc.deallocate(y);
  alloc.end_capture(fake_stream(2));
  EXPECT_EQ(alloc.stats().num_raw_allocs, 1u);
  alloc.empty_cache();
  EXPECT_EQ(dev.live.count(a), 1u) << "empty_cache returned the graph's block to the system";

  // After the capture the graph replays at `a`: no eager allocation may have it.
  void* on_2 = alloc.allocate(4096);
  dev.stream = fake_stream(1);
  void* on_1 = alloc.allocate(4096);
  EXPECT_NE(on_2, a);
  EXPECT_NE(on_1, a);
  // A second capture into the same pool gets it back.
  EXPECT_EQ(alloc.begin_capture(fake_stream(2), fake_stream(1), pool), pool);
  dev.stream = fake_stream(2);
  void* again = alloc.allocate(4096);
  EXPECT_EQ(again, a);
  alloc.deallocate(again);
  alloc.end_capture(fake_stream(2));

  // Released by one graph, the pool still belongs to the other; then it goes back.
  const int frees = dev.raw_frees;
  alloc.release_pool(pool);
  EXPECT_EQ(dev.raw_frees, frees) << "a graph still replays in the pool";
  alloc.release_pool(pool);
  EXPECT_EQ(dev.raw_frees, frees + 1);
  EXPECT_EQ(dev.live.count(a), 0u);
  EXPECT_EQ(alloc.stats().reserved, 2 * 4096u);
  alloc.deallocate(on_1);
  alloc.deallocate(on_2);
}

TEST(CapturePools, BlocksFreedDuringACaptureStayWithIt) {
  FakeDevice dev;
  CachingAllocator alloc(dev.backend());
  void* before = alloc.allocate(4096);  // stream 1, used by captured kernels, then freed
  dev.stream = fake_stream(3);
  void* other = alloc.allocate(4096);  // stream 3: not ordered before the replays
  dev.stream = fake_stream(1);
  void* shared = alloc.allocate(8192);
  alloc.record_stream(shared, fake_stream(5));

  const uint64_t pool = alloc.begin_capture(fake_stream(2), fake_stream(1), 0);
  dev.stream = fake_stream(2);
  alloc.deallocate(before);
  alloc.deallocate(other);
  alloc.deallocate(shared);
  EXPECT_TRUE(dev.events.empty()) << "no event may be recorded for a block freed in a capture";
  void* reused = alloc.allocate(4096);
  EXPECT_EQ(reused, before) << "stream 1's block is ordered before every replay";
  void* fresh = alloc.allocate(4096);
  EXPECT_NE(fresh, other) << "stream 3's block may still be in use at a replay";
  void* big = alloc.allocate(8192);
  EXPECT_NE(big, shared) << "stream 5 used it";
  alloc.deallocate(reused);
  alloc.deallocate(fresh);
  alloc.deallocate(big);
  alloc.end_capture(fake_stream(2));

  for (int s : {1, 2, 3, 5}) {  // no eager allocation gets any of them
    dev.stream = fake_stream(s);
    void* p = alloc.allocate(4096);
    void* q = alloc.allocate(8192);
    for (void* kept : {before, other, shared, fresh, big}) {
      EXPECT_NE(p, kept) << "stream " << s;
      EXPECT_NE(q, kept) << "stream " << s;
    }
    alloc.deallocate(p);
    alloc.deallocate(q);
  }
  alloc.release_pool(pool);
  for (void* kept : {before, other, shared, fresh, big}) {
    EXPECT_EQ(dev.live.count(kept), 0u) << "the pool's blocks go back to the system";
  }
}

TEST(CapturePools, NoEventQueryNoFreeAndNoRetryWhileCapturing) {
  FakeDevice dev;
  dev.capacity = 16 << 10;
  CachingAllocator alloc(dev.backend());
  void* a = alloc.allocate(4096);
  alloc.record_stream(a, fake_stream(7));
  alloc.deallocate(a);  // parked on an event of stream 7
  dev.stream = fake_stream(4);
  void* b = alloc.allocate(8192);
  alloc.deallocate(b);  // cached for stream 4
  const int queries = dev.event_queries;

  const uint64_t pool = alloc.begin_capture(fake_stream(2), fake_stream(1), 0);
  dev.stream = fake_stream(2);
  alloc.empty_cache();
  EXPECT_EQ(dev.raw_frees, 0) << "cudaFree would break the capture";
  void* c = alloc.allocate(2048);
  EXPECT_EQ(dev.event_queries, queries) << "cudaEventQuery is not allowed while capturing";
  try {
    alloc.allocate(8192);  // 4 + 8 + 0.5 KiB held: the fake device has no room
    ADD_FAILURE() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA graph capture is running"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(dev.raw_frees, 0);
  alloc.deallocate(c);
  alloc.end_capture(fake_stream(2));
  alloc.release_pool(pool);

  dev.stream = fake_stream(1);
  dev.finish(fake_stream(7));
  void* d = alloc.allocate(8192);  // now the cache goes back and the retry succeeds
  EXPECT_GT(dev.event_queries, queries);
  alloc.deallocate(d);
}

TEST(CapturePools, ALiveOutputOutlivesItsPool) {
  FakeDevice dev;
  CachingAllocator alloc(dev.backend());
  const uint64_t pool = alloc.begin_capture(fake_stream(2), fake_stream(1), 0);
  dev.stream = fake_stream(2);
  void* out = alloc.allocate(4096);  // the graph's output, read after each replay
  alloc.end_capture(fake_stream(2));
  alloc.release_pool(pool);
  EXPECT_EQ(dev.live.count(out), 1u) << "a live block must not go back to the system";
  alloc.deallocate(out);
  void* on_2 = alloc.allocate(4096);  // stream 2 dies with its graph: not its block
  EXPECT_NE(on_2, out);
  dev.stream = fake_stream(1);
  void* next = alloc.allocate(4096);  // an ordinary block of stream 1, which the graph followed
  EXPECT_EQ(next, out);
  alloc.deallocate(next);
  alloc.deallocate(on_2);
}

TEST(CapturePools, MisuseIsNamed) {
  FakeDevice dev;
  CachingAllocator alloc(dev.backend());
  EXPECT_THROW(alloc.begin_capture(fake_stream(2), fake_stream(1), 42), Error);
  const uint64_t pool = alloc.begin_capture(fake_stream(2), fake_stream(1), 0);
  EXPECT_THROW(alloc.begin_capture(fake_stream(2), fake_stream(1), 0), Error);
  EXPECT_THROW(alloc.begin_capture(fake_stream(3), fake_stream(1), pool), Error)
      << "one pool, two captures at once";
  EXPECT_THROW(alloc.release_pool(pool), Error) << "released while it captures";
  EXPECT_THROW(alloc.end_capture(fake_stream(3)), Error);
  alloc.end_capture(fake_stream(2));
  alloc.release_pool(pool);
  EXPECT_THROW(alloc.release_pool(pool), Error);
  try {
    CudaGraph graph;
    graph.capture(Device::cpu(), [] {});
    ADD_FAILURE() << "a CUDA graph of the CPU";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("need a CUDA device"), std::string::npos) << e.what();
  }
  try {
    device_allocator(Device::cpu()).begin_capture(Stream(), Stream(), 0);
    ADD_FAILURE() << "the CPU allocator cannot capture";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos) << e.what();
  }
}

TEST(CpuAllocator, LargeBlocksAreReusedForTheSameSize) {
  CpuAllocator alloc({.min_cached_bytes = 1 << 20, .cache_limit_bytes = 8 << 20});
  void* a = alloc.allocate(3 << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  alloc.deallocate(a);
  EXPECT_EQ(alloc.stats().allocated, 0u);
  EXPECT_EQ(alloc.stats().reserved, size_t{3} << 20) << "the freed block is kept";
  void* b = alloc.allocate((3 << 20) - 100);  // the same rounded size
  EXPECT_EQ(b, a);
  EXPECT_EQ(alloc.stats().num_raw_allocs, 1u);
  EXPECT_EQ(alloc.stats().num_cache_hits, 1u);
  EXPECT_EQ(alloc.stats().allocated, size_t{3} << 20);
  // Much smaller requests do not take a large block (at most 1/8 slack).
  void* c = alloc.allocate(2 << 20);
  EXPECT_NE(c, b);
  EXPECT_EQ(alloc.stats().num_raw_allocs, 2u);
  alloc.deallocate(b);
  alloc.deallocate(c);
  EXPECT_EQ(alloc.stats().reserved, size_t{5} << 20);
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().reserved, 0u);
  EXPECT_EQ(alloc.stats().num_raw_frees, 2u);
}

TEST(CpuAllocator, SmallBlocksAndBlocksPastTheLimitAreFreed) {
  CpuAllocator alloc({.min_cached_bytes = 1 << 20, .cache_limit_bytes = 4 << 20});
  alloc.deallocate(alloc.allocate(4000));
  EXPECT_EQ(alloc.stats().reserved, 0u) << "small blocks are not cached";
  void* a = alloc.allocate(3 << 20);
  void* b = alloc.allocate(3 << 20);
  alloc.deallocate(a);  // cached: 3 MiB of 4
  alloc.deallocate(b);  // would make 6 MiB: freed
  EXPECT_EQ(alloc.stats().reserved, size_t{3} << 20);
  EXPECT_EQ(alloc.stats().num_raw_frees, 2u);  // the small block and b
  CpuAllocator off({.min_cached_bytes = 1 << 20, .cache_limit_bytes = 0});
  off.deallocate(off.allocate(3 << 20));
  EXPECT_EQ(off.stats().reserved, 0u) << "a limit of 0 turns the cache off";
}

TEST(CpuAllocator, TheEnvironmentSetsTheLimit) {
  ASSERT_EQ(setenv("DDP_CPU_CACHE_MB", "5", 1), 0);
  const CpuCacheOptions five = CpuAllocator::from_environment();
  ASSERT_EQ(setenv("DDP_CPU_CACHE_MB", "-1", 1), 0);
  EXPECT_THROW(CpuAllocator::from_environment(), ValueError);
  ASSERT_EQ(unsetenv("DDP_CPU_CACHE_MB"), 0);
  const CpuCacheOptions standard = CpuAllocator::from_environment();
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  EXPECT_EQ(five.cache_limit_bytes, 0u) << "sanitizers must see every free";
  EXPECT_EQ(standard.cache_limit_bytes, 0u);
#else
  EXPECT_EQ(five.cache_limit_bytes, size_t{5} << 20);
  EXPECT_EQ(standard.cache_limit_bytes, size_t{1024} << 20);
#endif
}

TEST(PinnedAllocator, WorksWithoutAGpu) {
  Tensor t = empty({256}, {.device = Device::cpu(), .pinned = true});
  EXPECT_TRUE(t.is_pinned());
  EXPECT_NE(t.data_ptr(), nullptr);
  EXPECT_THROW(empty({4}, {.device = Device::cuda(0), .pinned = true}), ValueError);
}

TEST(FormatBytes, Units) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(uint64_t{3} << 30), "3.00 GiB");
}

}  // namespace
}  // namespace ddp
