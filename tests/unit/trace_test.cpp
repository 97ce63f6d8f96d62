// The timeline's pure parts (docs/observability.md): the recorder's pairing of
// spans per track and thread, the rank file written and read back, the clock
// offset estimate from bounds (Note [trace clocks]) and its interpolation, the
// merge into a Chrome trace and the choice of a run's files, the store's TIME,
// and the GPU clock and device spans on CPU events (Note [gpu clock]).
#include "runtime/trace.h"
#include "collectives/collective_events.h"
#include "collectives/store/tcp_store.h"
#include "collectives/trace_collectives.h"
#include "runtime/trace/clock.h"
#include "runtime/trace/file.h"
#include "runtime/trace/gpu.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

namespace ddp::trace {
namespace {

namespace fs = std::filesystem;

class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("ddp_trace_test_{}_{}", ::getpid(), std::random_device{}());
    start({.dir = "", .max_events = 1000, .handle_signals = false});
  }
  void TearDown() override {
    start({.dir = "", .max_events = 1000, .handle_signals = false});  // no file at exit
    stop();
    fs::remove_all(dir_);
  }
  static const TraceEvent* find(const Snapshot& s, std::string_view name) {
    for (const TraceEvent& e : s.events) {
      if (e.name == name) return &e;
    }
    return nullptr;
  }
  static std::string track_name(const Snapshot& s, Track id) {
    for (const TrackInfo& t : s.tracks) {
      if (t.id == id) return t.name;
    }
    return "?";
  }
  fs::path dir_;
};

TEST_F(TraceTest, SpansPairPerThreadAndNest) {
  {
    const Span outer("outer", "test", {{"step", 7}});
    begin("inner", "test", {}, 1000);
    end(3000);
    instant("mark", "test", {{"bucket", 2}});
  }
  std::thread([] {
    name_thread("worker");
    const Span span("on worker", "test");
  }).join();
  const Snapshot s = snapshot();
  const TraceEvent* outer = find(s, "outer");
  const TraceEvent* inner = find(s, "inner");
  const TraceEvent* worker = find(s, "on worker");
  ASSERT_TRUE(outer && inner && worker && find(s, "mark"));
  EXPECT_EQ(outer->phase, 'X');
  ASSERT_EQ(outer->args.size(), 1u);
  EXPECT_STREQ(outer->args[0].key, "step");
  EXPECT_EQ(outer->args[0].value, 7);
  EXPECT_EQ(inner->ts, 1000);
  EXPECT_EQ(inner->duration_ns, 2000);
  EXPECT_FALSE(outer->unfinished);
  EXPECT_EQ(track_name(s, outer->track), "main");
  EXPECT_EQ(track_name(s, worker->track), "worker");
  EXPECT_NE(worker->track, outer->track);
  EXPECT_EQ(find(s, "mark")->phase, 'i');
}

TEST_F(TraceTest, OpenSpansAreUnfinishedAndEndsWithoutBeginsAreIgnored) {
  end(5);  // recording began inside this span: no begin to pair
  begin("open", "test", {}, 100);
  const Snapshot s = snapshot();
  ASSERT_EQ(s.events.size(), 1u);
  EXPECT_TRUE(s.events[0].unfinished);
  EXPECT_EQ(s.events[0].duration_ns, s.taken_ns - 100);
  end(200);
}

TEST_F(TraceTest, PhasesEndWhereTheNextBegins) {
  {
    Phases p("train");
    p.next("data wait");
    p.next("forward", {{"micro_batch", 0}});
  }
  const Snapshot s = snapshot();
  const TraceEvent* data = find(s, "data wait");
  const TraceEvent* forward = find(s, "forward");
  ASSERT_TRUE(data && forward);
  EXPECT_EQ(data->ts + data->duration_ns, forward->ts);
  EXPECT_FALSE(forward->unfinished);
}

TEST_F(TraceTest, StreamTracksAreNamedOnceAndNotThreads) {
  const Track a = stream_track("nccl stream (comm 0)");
  EXPECT_EQ(stream_track("nccl stream (comm 0)"), a);
  begin("all_reduce", "collective", {}, 10, a);
  end(20, a);
  const Snapshot s = snapshot();
  ASSERT_EQ(s.events.size(), 1u);
  EXPECT_EQ(s.events[0].track, a);
  EXPECT_EQ(track_name(s, a), "nccl stream (comm 0)");
}

TEST_F(TraceTest, RecordsBeyondTheMaximumAreCountedAsDropped) {
  for (int i = 0; i < 1005; ++i) instant("x", "test");
  const Snapshot s = snapshot();
  EXPECT_EQ(s.events.size(), 1000u);
  EXPECT_EQ(s.dropped, 5);
}

TEST_F(TraceTest, LongNamesAreCutAtACharacterBoundary) {
  const std::string name = std::string(kMaxNameBytes - 1, 'a') + "\xc3\xa9tail";  // é straddles
  instant(name, "test");
  const Snapshot s = snapshot();
  ASSERT_EQ(s.events.size(), 1u);
  EXPECT_EQ(s.events[0].name, std::string(kMaxNameBytes - 1, 'a'));
}

TEST_F(TraceTest, OffNothingIsRecorded) {
  stop();
  {
    const Span span("ignored", "test");
    Phases phases("train", Device::cpu());
    phases.next("ignored phase");
    instant("ignored too", "test");
  }
  EXPECT_TRUE(snapshot().events.empty());
}

TEST_F(TraceTest, RankFileRoundTrips) {
  start({.dir = dir_.string(), .max_events = 1000, .handle_signals = false});
  set_rank_info({.rank = 3,
                 .world_size = 4,
                 .run_id = "r1",
                 .restart = 2,
                 .launcher = "ddprun",
                 .backend = "gloo"});
  add_clock_sample({.local_ns = 10, .offset_ns = -5, .error_ns = 2, .reference = "store \"x\""});
  {
    const Span span("step", "train", {{"step", 1}});
    complete("enqueue", "collective", 0, 1, {}, 0, {.id = 42, .out = true});
  }
  begin("unfinished", "train", {}, 0, 0, {.id = 7, .in = true});
  const std::string path = write_file();
  EXPECT_EQ(fs::path(path).filename(), "rank_3_restart2.json");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const Snapshot back = parse_rank_file(text.str(), path);
  const Snapshot now = snapshot();
  EXPECT_EQ(back.rank.rank, 3);
  EXPECT_EQ(back.rank.world_size, 4);
  EXPECT_EQ(back.rank.run_id, "r1");
  EXPECT_EQ(back.rank.restart, 2);
  EXPECT_EQ(back.rank.backend, "gloo");
  ASSERT_EQ(back.clock.size(), 1u);
  EXPECT_EQ(back.clock[0].offset_ns, -5);
  EXPECT_EQ(back.clock[0].reference, "store \"x\"");
  ASSERT_EQ(back.events.size(), 3u);
  EXPECT_EQ(back.events[0].name, "step");
  EXPECT_EQ(back.events[0].args[0].value, 1);
  EXPECT_EQ(back.events[0].flow, FlowBinding{});
  EXPECT_EQ(back.events[1].name, "enqueue");
  EXPECT_EQ(back.events[1].flow, (FlowBinding{.id = 42, .out = true, .in = false}));
  EXPECT_TRUE(back.events[2].unfinished);
  EXPECT_EQ(back.events[2].flow, (FlowBinding{.id = 7, .out = false, .in = true}));
  EXPECT_EQ(back.tracks.size(), now.tracks.size());
  end();
}

TEST(TraceFile, DamagedFilesAreNamed) {
  auto message = [](std::string_view text) {
    try {
      parse_rank_file(text, "DIR/rank_1.json");
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("{").find("DIR/rank_1.json: not valid JSON"), std::string::npos);
  EXPECT_NE(message("{\"format\": \"other\"}").find("not a ddp trace file"), std::string::npos);
  EXPECT_NE(message("{\"format\": \"ddp-trace\", \"version\": 9}").find("version 9"),
            std::string::npos);
}

// ---- Note [trace clocks] -------------------------------------------------------------

// A server whose clock is `offset` ahead answers at a random point of each round trip.
TEST(TraceClock, RequestsBoundTheOffsetAndTheEstimateIsWithinItsError) {
  std::mt19937 rng(7);
  const int64_t offset = 1'234'567'891;
  std::vector<OffsetBound> bounds;
  int64_t t = 1'000'000;
  int64_t best_rtt = INT64_MAX;
  for (int i = 0; i < 16; ++i) {
    const int64_t out = 5'000 + static_cast<int64_t>(rng() % 200'000);
    const int64_t back = 5'000 + static_cast<int64_t>(rng() % 200'000);
    const int64_t remote = t + out + offset;
    bounds.push_back(bound_from_request(t, remote, t + out + back));
    best_rtt = std::min(best_rtt, out + back);
    t += 1'000'000;
  }
  const OffsetEstimate e = estimate_offset(bounds);
  EXPECT_TRUE(e.intersected);
  EXPECT_LE(std::abs(e.offset_ns - offset), e.error_ns);
  EXPECT_LE(e.error_ns, best_rtt / 2 + 1);  // never worse than the best round trip
  EXPECT_GT(e.local_ns, 1'000'000);
}

// all_gather rounds (Note [trace clocks]): a rank leaves only after every rank entered.
TEST(TraceClock, GatherRoundsBoundTheOffset) {
  const int64_t skew = -987'654'321;  // our clock = reference clock - skew... i.e. offset
  std::mt19937 rng(3);
  std::vector<OffsetBound> bounds;
  int64_t real = 50'000'000;
  for (int k = 0; k < 8; ++k) {
    const int64_t ref_enter = real + static_cast<int64_t>(rng() % 30'000);
    const int64_t my_enter = real + static_cast<int64_t>(rng() % 30'000);
    const int64_t last = std::max(ref_enter, my_enter);
    const int64_t ref_exit = last + 2'000 + static_cast<int64_t>(rng() % 20'000);
    const int64_t my_exit = last + 2'000 + static_cast<int64_t>(rng() % 20'000);
    // Reference clock = real time; ours reads real - skew.
    bounds.push_back(bound_from_round(my_enter - skew, my_exit - skew, ref_enter, ref_exit));
    real += 100'000;
  }
  const OffsetEstimate e = estimate_offset(bounds);
  EXPECT_TRUE(e.intersected);
  EXPECT_LE(std::abs(e.offset_ns - skew), e.error_ns);
  int64_t narrowest = INT64_MAX;
  for (const OffsetBound& b : bounds) narrowest = std::min(narrowest, b.high_ns - b.low_ns);
  EXPECT_LE(e.error_ns, narrowest / 2 + 1);  // never worse than the tightest round
}

TEST(TraceClock, DisagreeingBoundsFallBackToTheNarrowest) {
  const OffsetEstimate e = estimate_offset({{.local_ns = 0, .low_ns = 0, .high_ns = 100},
                                            {.local_ns = 9, .low_ns = 500, .high_ns = 520}});
  EXPECT_FALSE(e.intersected);
  EXPECT_EQ(e.offset_ns, 510);
  EXPECT_EQ(e.error_ns, 10);
  EXPECT_EQ(e.local_ns, 9);
  EXPECT_THROW(estimate_offset({}), ValueError);
  EXPECT_THROW(estimate_offset({{.local_ns = 0, .low_ns = 5, .high_ns = 4}}), ValueError);
}

TEST(TraceClock, OffsetIsInterpolatedBetweenSamplesAndHeldOutside) {
  const std::vector<ClockSample> samples = {
      {.local_ns = 3000, .offset_ns = 400, .error_ns = 0, .reference = "a"},
      {.local_ns = 1000, .offset_ns = 200, .error_ns = 0, .reference = "a"}};
  EXPECT_EQ(offset_at({}, 5), 0);
  EXPECT_EQ(offset_at(samples, 0), 200);
  EXPECT_EQ(offset_at(samples, 2000), 300);
  EXPECT_EQ(offset_at(samples, 2500), 350);
  EXPECT_EQ(offset_at(samples, 9000), 400);
}

// ---- the merge ------------------------------------------------------------------------

Snapshot rank_trace(int rank, const std::string& run, int restart, int64_t offset) {
  Snapshot s;
  s.rank = {.rank = rank,
            .world_size = 3,
            .run_id = run,
            .restart = restart,
            .launcher = "ddprun",
            .backend = "shm"};
  s.clock = {{.local_ns = 0, .offset_ns = offset, .error_ns = 1, .reference = "test"}};
  s.tracks = {{.id = 1, .name = "main", .os_tid = 10}, {.id = 2, .name = "idle", .os_tid = 11}};
  TraceEvent step;
  step.phase = 'X';
  step.track = 1;
  step.ts = 10'000 - offset;  // 10 us on the reference clock
  step.duration_ns = 2'500;
  step.name = "step";
  step.category = "train";
  step.args = {{"step", 1}};
  s.events.push_back(step);
  TraceEvent collective = step;
  collective.name = "all_reduce";
  collective.category = "collective";
  collective.flow = {.id = 5, .out = false, .in = true};
  collective.args.clear();
  s.events.push_back(collective);
  return s;
}

TEST(TraceMerge, RanksBecomeProcessesOnTheReferenceClock) {
  std::ostringstream out;
  write_chrome_trace(out, {rank_trace(0, "a", 0, 0), rank_trace(1, "a", 0, 7'000'000'000)});
  const std::string text = out.str();
  // Both steps at reference time 10 us: the first event of the run, so at 0.
  // Rank R is pid R + 1 (Perfetto takes pid 0 for the idle process).
  EXPECT_NE(text.find("\"ph\": \"X\", \"pid\": 1, \"tid\": 1, \"ts\": 0.000, \"dur\": 2.500"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\"ph\": \"X\", \"pid\": 2, \"tid\": 1, \"ts\": 0.000, \"dur\": 2.500"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("\"pid\": 0,"), std::string::npos) << text;
  EXPECT_NE(text.find("\"pid\": 1, \"tid\": 0, \"name\": \"process_name\", \"args\": {\"name\": "
                      "\"rank 0\"}"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\"pid\": 2, \"tid\": 0, \"name\": \"process_name\", \"args\": {\"name\": "
                      "\"rank 1\"}"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\"name\": \"thread_name\", \"args\": {\"name\": \"main\"}"),
            std::string::npos);
  EXPECT_EQ(text.find("\"idle\""), std::string::npos);  // a track without events is left out
  // Flows are bound to their slices, numbered anew across the ranks: both ranks'
  // arrow 5 become two arrows.
  EXPECT_NE(text.find("\"bind_id\": 1, \"flow_in\": true, \"name\": \"all_reduce\""),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\"bind_id\": 2, \"flow_in\": true, \"name\": \"all_reduce\""),
            std::string::npos)
      << text;
}

void write_rank(const fs::path& dir, const Snapshot& s) {
  std::ofstream out(dir / rank_file_name(s.rank.rank));
  write_rank_file(out, s);
}

TEST_F(TraceTest, MergeKeepsOneRunsLatestRestartAndNamesMissingRanks) {
  fs::create_directories(dir_);
  write_rank(dir_, rank_trace(2, "old", 0, 0));
  write_rank(dir_, rank_trace(0, "new", 1, 0));
  write_rank(dir_, rank_trace(1, "new", 0, 0));  // an earlier restart of the same run
  const MergeReport report = merge_trace_dir(
      dir_.string(), {.run_id = "new", .restart = -1, .expected_ranks = 0, .output = ""});
  EXPECT_EQ(report.restart, 1);
  EXPECT_EQ(report.ranks, std::vector<int>{0});
  EXPECT_EQ(report.missing, (std::vector<int>{1, 2}));
  EXPECT_EQ(report.skipped.size(), 2u);
  EXPECT_TRUE(fs::exists(dir_ / "trace.json"));
  EXPECT_NE(describe(report).find("no trace from rank(s) 1,2"), std::string::npos);
  const MergeReport old = merge_trace_dir(dir_.string(), {.run_id = "old",
                                                          .restart = -1,
                                                          .expected_ranks = 0,
                                                          .output = (dir_ / "old.json").string()});
  EXPECT_EQ(old.ranks, std::vector<int>{2});
  EXPECT_TRUE(fs::exists(dir_ / "old.json"));
}

TEST_F(TraceTest, MergeOfADirectoryWithoutTracesIsAnError) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "rank_0.json") << "not json";
  try {
    merge_trace_dir(dir_.string());
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("holds no readable rank trace"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos);
  }
  EXPECT_THROW(merge_trace_dir((dir_ / "absent").string()), ValueError);
}

// ---- the store's clock and the GPU clock ----------------------------------------------

TEST(TraceStoreClock, ServerTimeLiesBetweenSendAndReceive) {
  TcpStoreServer server({.host = "127.0.0.1", .port = 0, .secret = "s"});
  TcpStore store({.host = "127.0.0.1", .port = server.port(), .secret = "s"});
  const int64_t before = now_ns();
  const int64_t remote = store.server_time_ns();
  const int64_t after = now_ns();
  EXPECT_LE(before, remote);
  EXPECT_LE(remote, after);
  // One process, one clock: the true offset is 0.
  const OffsetEstimate e = measure_offset_with_store(store, 8);
  EXPECT_LE(std::abs(e.offset_ns), e.error_ns);
}

TEST(TraceGpuClock, MapsEventsToTheHostClock) {
  GpuClock clock(Device::cpu());  // CPU events record the host clock (Note [gpu clock])
  const int64_t before = now_ns();
  Event event(Device::cpu(), true);
  event.record();
  const int64_t after = now_ns();
  const int64_t mapped = clock.host_ns(event, before);
  const int64_t slack = clock.error_ns() + 2'000;  // the anchor's error, float milliseconds
  EXPECT_GE(mapped, before - slack);
  EXPECT_LE(mapped, after + slack);
  EXPECT_EQ(clock.anchors(), 1u);
}

TEST_F(TraceTest, DeviceSpansBecomeCompleteSpansOnTheDevicesTrack) {
  DeviceSpans spans(Device::cpu());
  spans.boundary("forward", {{"micro_batch", 0}});
  spans.boundary("backward");
  spans.boundary("");
  spans.poll(true);
  EXPECT_EQ(spans.pending(), 0u);
  const Snapshot s = snapshot();
  const TraceEvent* forward = find(s, "forward");
  const TraceEvent* backward = find(s, "backward");
  ASSERT_TRUE(forward && backward);
  EXPECT_EQ(forward->category, "gpu");
  EXPECT_EQ(track_name(s, forward->track), "cpu compute stream");
  EXPECT_LE(forward->ts + forward->duration_ns, backward->ts + 2'000);
  EXPECT_EQ(forward->args.size(), 1u);
}

// Note [nccl events] through the timeline's observer: the watchdog's thread tells
// started and completed with the GPU's times; the span lands whole on the
// stream's track, even when another thread tells its end.
TEST_F(TraceTest, NcclMomentsBecomeSpansOnTheStreamTrack) {
  attach_trace_observer();
  const CollectiveInfo info{.comm_id = 4,
                            .backend = "nccl",
                            .kind = CollectiveKind::all_reduce,
                            .sequence = 9,
                            .bytes = 4096,
                            .label = "ddp bucket 1"};
  notify_collective(info, CollectiveState::enqueued, 1'000);
  std::thread([&] {
    notify_collective(info, CollectiveState::started, 5'000);
    notify_collective(info, CollectiveState::completed, 8'000);
  }).join();
  CollectiveInfo other = info;
  other.sequence = 10;
  std::thread([&] { notify_collective(other, CollectiveState::started, 9'000); }).join();
  notify_collective(other, CollectiveState::failed, 12'000);  // a waiter gave up
  const Snapshot s = snapshot();
  std::vector<const TraceEvent*> runs;
  const TraceEvent* enqueue = nullptr;
  const TraceEvent* failed = nullptr;
  for (const TraceEvent& e : s.events) {
    if (e.phase == 'X' && e.name == "all_reduce (ddp bucket 1)") runs.push_back(&e);
    if (e.name == "enqueue all_reduce (ddp bucket 1)") enqueue = &e;
    if (e.name == "failed: all_reduce (ddp bucket 1)") failed = &e;
  }
  ASSERT_EQ(runs.size(), 2u);
  ASSERT_TRUE(enqueue && failed);
  std::sort(runs.begin(), runs.end(), [](auto* a, auto* b) { return a->ts < b->ts; });
  EXPECT_EQ(runs[0]->ts, 5'000);
  EXPECT_EQ(runs[0]->duration_ns, 3'000);
  EXPECT_EQ(runs[1]->ts, 9'000);
  EXPECT_EQ(runs[1]->duration_ns, 3'000);
  EXPECT_EQ(track_name(s, runs[0]->track), "nccl stream (comm 4)");
  EXPECT_EQ(runs[1]->track, runs[0]->track);
  EXPECT_EQ(failed->track, runs[0]->track);
  EXPECT_EQ(track_name(s, enqueue->track), "main");
  EXPECT_EQ(enqueue->ts, 1'000);
  // The arrow starts on the enqueue slice (1 ns long) and ends on the run itself.
  EXPECT_EQ(enqueue->duration_ns, 1);
  EXPECT_TRUE(enqueue->flow.out && !enqueue->flow.in);
  EXPECT_TRUE(runs[0]->flow.in && !runs[0]->flow.out);
  EXPECT_EQ(runs[0]->flow.id, enqueue->flow.id);
  EXPECT_TRUE(runs[1]->flow.in);
  EXPECT_NE(runs[1]->flow.id, runs[0]->flow.id);
}

}  // namespace
}  // namespace ddp::trace
