// The GPU clock and device spans (runtime/trace/gpu.h) on CPU events, which
// record the host clock, with a fake host clock and fake "has it passed?"
// answers (GpuClock::Hooks): anchors that keep every event mappable, a refresh
// that never waits, pooled events, and spans per thread (Note [gpu clock], Note
// [device spans]).
#include "runtime/trace.h"
#include "runtime/trace/gpu.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace ddp::trace {
namespace {

// The host clock as the clock sees it: the real one plus a shift the test moves,
// or (ticking) a clock that advances 1 us per reading, whatever the machine's load.
struct FakeHost {
  bool ticking = false;
  std::atomic<int64_t> shift{0};
  std::atomic<int64_t> ticks{0};
  std::atomic<bool> anchors_pass{true};  // do new anchors' events pass?
  GpuClock::Hooks hooks() {
    return {.now =
                [this] {
                  return ticking ? 1'000'000'000 + shift.load() + 1'000 * ticks++
                                 : now_ns() + shift.load();
                },
            .passed = [this](const Event& e) { return anchors_pass.load() && e.query(); }};
  }
};

// An event recorded now, and the host time just before.
struct Recorded {
  int64_t before = 0;
  Event event{Device::cpu(), true};
  Recorded() {
    before = now_ns();
    event.record();
  }
};

TEST(TraceGpuClock, TheFirstAnchorKeepsOldEventsMappable) {
  FakeHost host;
  GpuClock clock(Device::cpu(), host.hooks());
  const Recorded old;
  // Many anchors later (each made with the host clock moved on): more than are
  // kept. (An anchor the loaded machine saw passing too late is dropped: more rounds.)
  size_t anchors_made = 0;
  for (int round = 0; round < 100 && anchors_made < 3 * GpuClock::kMaxAnchors; ++round) {
    host.shift += GpuClock::kAnchorAge + GpuClock::kAnchorRetryNs;
    const Recorded now;
    const size_t before = clock.anchors();
    clock.host_ns(now.event, now.before + host.shift);
    if (clock.anchors() > before || before == GpuClock::kMaxAnchors + 1) ++anchors_made;
  }
  EXPECT_EQ(clock.anchors(), GpuClock::kMaxAnchors + 1) << "the newest ones and the first";
  // Only the first anchor precedes the old event: it maps it, within that anchor's
  // error (the later anchors' times are shifted by seconds). Its error is half the
  // time its event took to record and pass: microseconds at -O0 under ASan, where a
  // fixed 2 us bound failed.
  const int64_t mapped = clock.host_ns(old.event, old.before);
  EXPECT_GE(mapped, old.before - clock.first_error_ns() - 2'000);
  EXPECT_LE(mapped, old.before + clock.error_ns() + 200'000);
}

TEST(TraceGpuClock, ARefreshNeverWaitsForItsAnchor) {
  FakeHost host;
  host.ticking = true;
  GpuClock clock(Device::cpu(), host.hooks());
  EXPECT_EQ(clock.anchors(), 1u);
  host.anchors_pass = false;  // a busy GPU: the new anchor's event does not pass
  host.shift += GpuClock::kAnchorAge;
  const Recorded a;
  clock.host_ns(a.event, 0);  // returns: the first anchor maps it
  EXPECT_TRUE(clock.refreshing());
  EXPECT_EQ(clock.anchors(), 1u);
  host.anchors_pass = true;  // seen passing within the window: taken
  clock.host_ns(a.event, 0);
  EXPECT_FALSE(clock.refreshing());
  EXPECT_EQ(clock.anchors(), 2u);

  host.anchors_pass = false;
  host.shift += GpuClock::kAnchorAge + GpuClock::kAnchorRetryNs;
  clock.host_ns(a.event, 0);
  EXPECT_TRUE(clock.refreshing());
  host.shift += GpuClock::kMaxAnchorWindowNs + 1;  // not seen within the window: dropped
  clock.host_ns(a.event, 0);
  EXPECT_FALSE(clock.refreshing());
  host.anchors_pass = true;
  clock.host_ns(a.event, 0);
  EXPECT_FALSE(clock.refreshing()) << "begun again only after kAnchorRetryNs";
  EXPECT_EQ(clock.anchors(), 2u);
  host.shift += GpuClock::kAnchorRetryNs;
  clock.host_ns(a.event, 0);
  EXPECT_EQ(clock.anchors(), 3u);
}

class DeviceSpansTest : public ::testing::Test {
 protected:
  void SetUp() override { start({.dir = "", .max_events = 100000, .handle_signals = false}); }
  void TearDown() override { stop(); }
};

TEST_F(DeviceSpansTest, EventsAreReusedAcrossSteps) {
  DeviceSpans spans(Device::cpu());
  for (int step = 0; step < 100; ++step) {
    spans.boundary("forward");
    spans.boundary("backward");
    spans.boundary("optimizer");
  }
  spans.boundary("");
  spans.poll(true);
  EXPECT_EQ(spans.pending(), 0u);
  EXPECT_LE(spans.events_created(), 4) << "301 boundaries, events from the pool";
  int forwards = 0;
  for (const TraceEvent& e : snapshot().events) forwards += e.name == "forward" ? 1 : 0;
  EXPECT_EQ(forwards, 100);
}

// start() makes the tracks anew: spans made before find their track again.
TEST_F(DeviceSpansTest, AnotherStartFindsTheTrackAgain) {
  DeviceSpans spans(Device::cpu(), "cpu stream of this test");
  start({.dir = "", .max_events = 1000, .handle_signals = false});
  spans.boundary("after the start");
  spans.boundary("");
  spans.poll(true);
  const Snapshot s = snapshot();
  ASSERT_EQ(s.events.size(), 1u);
  std::string track = "none";
  for (const TrackInfo& t : s.tracks) {
    if (t.id == s.events[0].track) track = t.name;
  }
  EXPECT_EQ(track, "cpu stream of this test");
}

TEST_F(DeviceSpansTest, EachThreadHasItsOwnSpansPerDevice) {
  DeviceSpans* mine = &device_spans(Device::cpu());
  EXPECT_EQ(&device_spans(Device::cpu()), mine);
  DeviceSpans* other = nullptr;
  std::thread([&] { other = &device_spans(Device::cpu()); }).join();
  EXPECT_NE(other, mine) << "one thread's phase boundaries would end the other's phases";
}

}  // namespace
}  // namespace ddp::trace
