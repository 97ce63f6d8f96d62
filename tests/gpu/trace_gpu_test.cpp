// The timeline's GPU tracks on cuda:0 (Note [gpu clock], Note [device spans],
// Note [nccl events]): the GPU clock maps events into the host's window without
// a host sync after its first anchor, refreshes its anchor without waiting,
// train's phases land on the "cuda:0 compute stream" track, and an nccl
// collective of world size 1 lands on "nccl stream (comm N)" with its flow arrow
// from the enqueue. Without a GPU (or NCCL, for the last) each test skips and
// says why.
#include "collectives/backends.h"
#include "collectives/collective_events.h"
#include "ddp/config.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/ops/ops.h"
#include "runtime/stream.h"
#include "runtime/trace.h"
#include "runtime/trace/gpu.h"
#include "tests/gpu/require_gpu.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace ddp::trace {
namespace {

using namespace std::chrono_literals;

using gpu_test::kGpu;

// Some milliseconds of work on the current stream.
void busy_gpu() {
  const Tensor a = ones({1024, 1024}, {.device = kGpu});
  Tensor b = a;
  for (int i = 0; i < 8; ++i) b = matmul(b, a);
}

class TraceGpu : public ::testing::Test {
 protected:
  void SetUp() override { start({.dir = "", .max_events = 100000, .handle_signals = false}); }
  void TearDown() override { stop(); }
  static std::string track_name(const Snapshot& s, Track id) {
    for (const TrackInfo& t : s.tracks) {
      if (t.id == id) return t.name;
    }
    return "?";
  }
};

TEST_F(TraceGpu, ClockMapsAnEventIntoTheHostWindowWithoutASync) {
  DDP_REQUIRE_CUDA();
  GpuClock clock(kGpu);
  busy_gpu();
  Event event(kGpu, true);
  const int64_t before = now_ns();
  event.record(current_stream(kGpu));
  event.synchronize();
  const int64_t after = now_ns();
  const uint64_t syncs = cuda_api::host_sync_count();
  const int64_t mapped = clock.host_ns(event, before);
  EXPECT_EQ(cuda_api::host_sync_count(), syncs) << "mapping waited for the device";
  const int64_t slack = clock.error_ns() + 50'000;  // the anchor's error, float milliseconds
  EXPECT_GE(mapped, before - slack);
  EXPECT_LE(mapped, after + slack);
}

TEST_F(TraceGpu, ClockRefreshesItsAnchorWithoutWaiting) {
  DDP_REQUIRE_CUDA();
  std::atomic<int64_t> shift{0};
  GpuClock clock(kGpu, {.now = [&] { return now_ns() + shift.load(); }, .passed = nullptr});
  Event event(kGpu, true);
  const int64_t before = now_ns();
  event.record(current_stream(kGpu));
  event.synchronize();
  const uint64_t syncs = cuda_api::host_sync_count();
  shift = GpuClock::kAnchorAge + GpuClock::kAnchorRetryNs;
  for (int i = 0; i < 100 && clock.anchors() < 2; ++i) {
    clock.host_ns(event, before);
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(cuda_api::host_sync_count(), syncs) << "the refresh waited for the device";
  EXPECT_EQ(clock.anchors(), 2u) << "an idle stream's event passes within the window";
}

TEST_F(TraceGpu, PhasesLandOnTheComputeStreamTrack) {
  DDP_REQUIRE_CUDA();
  {
    Phases phases("train", kGpu);
    phases.next("forward");
    busy_gpu();
    phases.next("backward");
    busy_gpu();
  }
  synchronize(kGpu);
  poll_device_spans();
  const Snapshot s = snapshot();
  const TraceEvent *forward = nullptr, *backward = nullptr;
  for (const TraceEvent& e : s.events) {
    if (e.category != "gpu") continue;
    if (e.name == "forward") forward = &e;
    if (e.name == "backward") backward = &e;
  }
  ASSERT_TRUE(forward && backward) << "no device spans";
  EXPECT_EQ(track_name(s, forward->track), "cuda:0 compute stream");
  EXPECT_GT(forward->duration_ns, 0);
  EXPECT_LE(forward->ts + forward->duration_ns, backward->ts + 50'000);
}

TEST_F(TraceGpu, NcclCollectivesLandOnTheStreamTrackWithTheirArrow) {
  DDP_REQUIRE_CUDA();
  if (!DDP_HAVE_NCCL) GTEST_SKIP() << "this build has no NCCL";
  std::shared_ptr<Communicator> comm;
  try {
    comm = make_nccl_communicator(nullptr,
                                  {.rank = 0, .size = 1, .device = 0, .comm = {.timeout = 30s}});
  } catch (const std::exception& e) {
    GTEST_SKIP() << "no NCCL communicator: " << e.what();
  }
  ASSERT_TRUE(collective_observers_present()) << "the timeline's observer (tracing is on)";
  Tensor t = ones({1 << 20}, {.device = kGpu});
  {
    const CollectiveLabel label("trace gpu test");
    comm->all_reduce(t)->synchronize();
  }
  // The watchdog tells started and completed a poll later.
  const TraceEvent* run = nullptr;
  Snapshot s;
  for (int i = 0; i < 1000 && run == nullptr; ++i) {
    std::this_thread::sleep_for(10ms);
    s = snapshot();
    for (const TraceEvent& e : s.events) {
      if (e.phase == 'X' && e.name == "all_reduce (trace gpu test)") run = &e;
    }
  }
  ASSERT_NE(run, nullptr) << "the collective never reached the timeline";
  EXPECT_TRUE(track_name(s, run->track).starts_with("nccl stream (comm "))
      << track_name(s, run->track);
  const TraceEvent* enqueue = nullptr;
  for (const TraceEvent& e : s.events) {
    if (e.name == "enqueue all_reduce (trace gpu test)") enqueue = &e;
  }
  ASSERT_NE(enqueue, nullptr);
  EXPECT_TRUE(enqueue->flow.out && run->flow.in && enqueue->flow.id == run->flow.id);
  EXPECT_GE(run->ts, enqueue->ts - 50'000) << "started on the GPU before it was enqueued";
  EXPECT_GE(run->duration_ns, 0);
}

}  // namespace
}  // namespace ddp::trace
