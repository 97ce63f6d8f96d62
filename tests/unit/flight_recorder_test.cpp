// The flight recorder's memory and dumps (collectives/flight/): what a reader
// of the region sees after each moment of a collective, the ring's wrap, a
// record caught mid-write, the wait and step accounting, and the JSON dump's
// round trip and errors. The processes: tests/e2e/flight_*.sh.
#include "collectives/flight/flight_recorder.h"
#include "collectives/flight/flight_dump.h"
#include "runtime/error.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace ddp::flight {
namespace {

CollectiveInfo info(int64_t sequence, std::string label = "ddp bucket 3", int comm = 0) {
  return {.comm_id = comm,
          .rank = 1,
          .world_size = 4,
          .backend = "shm",
          .kind = CollectiveKind::all_reduce,
          .op = ReduceOp::avg,
          .root = 0,
          .sequence = sequence,
          .count = 1024,
          .dtype = DType::f32,
          .bytes = 4096,
          .label = std::move(label)};
}

RecorderOptions options(size_t capacity) {
  return {.capacity = capacity,
          .shm_dir = "",
          .dump_dir = "",
          .handle_sigusr1 = false,
          .dump_on_failure = false};
}

void tell(FlightRecorder& r, const CollectiveInfo& i, CollectiveState s, int64_t t) {
  r.on_collective(CollectiveEvent{i, s, t});
}

TEST(FlightRecorder, RecordsEachMomentOfACollective) {
  FlightRecorder r(options(8), 1, 4);
  const auto a = info(0), b = info(1, "eval loss");
  tell(r, a, CollectiveState::enqueued, 100);
  tell(r, a, CollectiveState::started, 110);
  tell(r, a, CollectiveState::wait_begin, 120);
  tell(r, b, CollectiveState::enqueued, 125);
  RankSnapshot s = r.snapshot();
  ASSERT_EQ(s.records.size(), 2u);
  EXPECT_EQ(s.rank, 1);
  EXPECT_EQ(s.world_size, 4);
  EXPECT_EQ(s.pid, ::getpid());
  EXPECT_EQ(s.backend, "shm");
  EXPECT_EQ(s.records[0].state, RecordState::started);
  EXPECT_EQ(s.records[0].label, "ddp bucket 3");
  EXPECT_EQ(s.records[0].bytes, 4096);
  EXPECT_EQ(s.records[0].kind, CollectiveKind::all_reduce);
  EXPECT_EQ(s.records[0].op, ReduceOp::avg);
  EXPECT_EQ(s.records[0].wait_begin_ns, 120);
  EXPECT_EQ(s.records[1].state, RecordState::enqueued);
  EXPECT_EQ(s.records[1].label, "eval loss");
  // Waiting in #0 since 120: the status says so, for the hang detector.
  EXPECT_EQ(s.status.waiters, 1);
  EXPECT_EQ(s.status.wait_sequence, 0);
  EXPECT_EQ(s.status.wait_since_ns, 120);
  EXPECT_EQ(s.status.last_progress_ns, 125);

  tell(r, a, CollectiveState::completed, 150);
  tell(r, a, CollectiveState::wait_end, 160);
  tell(r, b, CollectiveState::started, 170);
  tell(r, b, CollectiveState::failed, 180);
  s = r.snapshot();
  EXPECT_EQ(s.records[0].state, RecordState::completed);
  EXPECT_EQ(s.records[0].finished_ns, 150);
  EXPECT_EQ(s.records[0].wait_ns, 40);
  EXPECT_EQ(s.records[1].state, RecordState::failed);
  EXPECT_EQ(s.status.waiters, 0);
  EXPECT_EQ(s.status.wait_sequence, -1);
  EXPECT_EQ(s.status.blocked_ns, 40);
  EXPECT_EQ(s.status.last_progress_ns, 150);  // a failure is no progress
  EXPECT_EQ(s.status.first_ns, 100);
  EXPECT_EQ(s.status.last_ns, 180);
}

TEST(FlightRecorder, KeepsTheLastNAndFindsThemByCommunicator) {
  FlightRecorder r(options(4), 0, 2);
  for (int64_t i = 0; i < 10; ++i) {
    tell(r, info(i, "", 0), CollectiveState::enqueued, 1000 + i);
    tell(r, info(i, "", 1), CollectiveState::enqueued, 2000 + i);  // another comm, same numbers
  }
  tell(r, info(8, "", 0), CollectiveState::completed, 3000);
  tell(r, info(3, "", 0), CollectiveState::completed, 3001);  // long gone: ignored
  const RankSnapshot s = r.snapshot();
  EXPECT_EQ(s.recorded, 20);
  ASSERT_EQ(s.records.size(), 4u);
  EXPECT_EQ(s.records[0].sequence, 8);
  EXPECT_EQ(s.records[0].comm, 0);
  EXPECT_EQ(s.records[0].state, RecordState::completed);
  EXPECT_EQ(s.records[1].sequence, 8);
  EXPECT_EQ(s.records[1].comm, 1);
  EXPECT_EQ(s.records[1].state, RecordState::enqueued);
  EXPECT_EQ(s.records[3].sequence, 9);
}

TEST(FlightRecorder, AReaderSkipsARecordCaughtMidWrite) {
  FlightRecorder r(options(4), 0, 2);
  for (int64_t i = 0; i < 3; ++i) tell(r, info(i), CollectiveState::enqueued, 10 + i);
  // A rank stopped inside a write leaves that record's seqlock odd.
  auto* region = static_cast<unsigned char*>(const_cast<void*>(r.region()));
  auto* records = reinterpret_cast<SharedRecord*>(region + region_bytes(0));
  records[1].lock.fetch_add(1);
  const RankSnapshot s = r.snapshot();
  EXPECT_EQ(s.torn, 1);
  ASSERT_EQ(s.records.size(), 2u);
  EXPECT_EQ(s.records[0].sequence, 0);
  EXPECT_EQ(s.records[1].sequence, 2);
  records[1].lock.fetch_add(1);
  EXPECT_EQ(r.snapshot().records.size(), 3u);
}

TEST(FlightRecorder, ConcurrentWritersAndAReaderAgree) {
  // Two slots: the writer rewrites the very records the reader copies.
  FlightRecorder r(options(2), 0, 2);
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done) {
      for (const CollectiveRecord& c : r.snapshot().records) {
        ASSERT_EQ(c.label, fmt::format("label {}", c.sequence % 7)) << c.sequence;
        ASSERT_EQ(c.count, c.sequence * 3);
      }
    }
  });
  for (int64_t i = 0; i < 1000000; ++i) {
    CollectiveInfo c = info(i, fmt::format("label {}", i % 7));
    c.count = i * 3;
    tell(r, c, CollectiveState::enqueued, i + 1);
    tell(r, c, CollectiveState::started, i + 1);
    tell(r, c, CollectiveState::completed, i + 2);
  }
  done = true;
  reader.join();
  EXPECT_EQ(r.snapshot().recorded, 1000000);
}

TEST(FlightRecorder, StepMarksSplitComputeFromWaiting) {
  FlightRecorder r(options(8), 0, 2);
  r.step_begin();
  const int64_t t = steady_now_ns();
  tell(r, info(0), CollectiveState::enqueued, t);
  tell(r, info(0), CollectiveState::wait_begin, t);
  tell(r, info(0), CollectiveState::completed, t + 2'000'000);
  tell(r, info(0), CollectiveState::wait_end, t + 2'000'000);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  r.step_end();
  const RankStatus s = r.status();
  EXPECT_EQ(s.steps, 1);
  EXPECT_EQ(s.step_blocked_ns, 2'000'000);
  EXPECT_GE(s.step_ns, 5'000'000);
  EXPECT_EQ(s.blocked_ns, 2'000'000);
}

TEST(FlightRecorder, OptionsFromTheEnvironment) {
  ::setenv("DDP_FLIGHT_RECORDER_SIZE", "-1", 1);
  try {
    recorder_options_from_env();
    ADD_FAILURE() << "a negative size was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_FLIGHT_RECORDER_SIZE=-1"), std::string::npos);
  }
  ::setenv("DDP_FLIGHT_RECORDER_SIZE", "0", 1);
  ::setenv("DDP_FLIGHT_DIR", "/some/dir", 1);
  ::setenv("DDPRUN_FLIGHT_SHM", "/dev/shm/x", 1);
  RecorderOptions o = recorder_options_from_env();
  EXPECT_EQ(o.capacity, 0u);
  EXPECT_EQ(o.dump_dir, "/some/dir");
  EXPECT_EQ(o.shm_dir, "/dev/shm/x");
  EXPECT_FALSE(o.dump_on_failure);  // ddprun dumps from the region
  ::unsetenv("DDP_FLIGHT_RECORDER_SIZE");
  ::unsetenv("DDP_FLIGHT_DIR");
  ::unsetenv("DDPRUN_FLIGHT_SHM");
  o = recorder_options_from_env();
  EXPECT_EQ(o.capacity, kDefaultCapacity);
  EXPECT_TRUE(o.dump_on_failure);
  EXPECT_TRUE(o.dump_dir.ends_with("/ddp_flight")) << o.dump_dir;
}

TEST(FlightRecorder, RegionSharedThroughAFile) {
  const std::string dir = ::testing::TempDir() + "flight_region_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  RecorderOptions o = options(8);
  o.shm_dir = dir;
  {
    FlightRecorder r(o, 3, 4);
    EXPECT_EQ(r.region_path(), dir + "/rank_3");
    tell(r, info(5), CollectiveState::enqueued, 7);
    // What another process (ddprun) maps: the file's bytes.
    std::ifstream in(r.region_path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const RankSnapshot s = read_region(bytes.data(), bytes.size(), 100);
    ASSERT_EQ(s.records.size(), 1u);
    EXPECT_EQ(s.records[0].sequence, 5);
    EXPECT_EQ(s.rank, 3);
    EXPECT_EQ(s.taken_ns, 100);
  }
  std::filesystem::remove_all(dir);
}

TEST(FlightRecorder, ReadRegionRefusesOtherBytes) {
  std::vector<uint64_t> zeros(64, 0);
  try {
    read_region(zeros.data(), zeros.size() * 8, 0);
    ADD_FAILURE() << "zeros were read as a region";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("not a flight recorder region"), std::string::npos);
  }
}

RankSnapshot sample_snapshot() {
  FlightRecorder r(options(8), 1, 4);
  tell(r, info(0, "a \"quoted\" label"), CollectiveState::enqueued, 100);
  tell(r, info(0), CollectiveState::started, 110);
  tell(r, info(0), CollectiveState::wait_begin, 120);
  tell(r, info(0), CollectiveState::timed_out, 130);
  RankSnapshot s = r.snapshot("timed out");
  s.process = ProcessState::stopped;
  s.process_detail = "SIGSTOP";
  s.job = "job1";
  return s;
}

TEST(FlightDump, RoundTripsThroughJson) {
  const RankSnapshot s = sample_snapshot();
  const RankSnapshot back = from_json(to_json(s));
  EXPECT_EQ(back.rank, 1);
  EXPECT_EQ(back.world_size, 4);
  EXPECT_EQ(back.pid, s.pid);
  EXPECT_EQ(back.job, "job1");
  EXPECT_EQ(back.reason, "timed out");
  EXPECT_EQ(back.process, ProcessState::stopped);
  EXPECT_EQ(back.process_detail, "SIGSTOP");
  EXPECT_EQ(back.taken_ns, s.taken_ns);
  EXPECT_EQ(back.status.wait_since_ns, 120);
  EXPECT_EQ(back.status.waiters, 1);
  ASSERT_EQ(back.records.size(), 1u);
  const CollectiveRecord& r = back.records[0];
  EXPECT_EQ(r.label, "a \"quoted\" label");
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.state, RecordState::started);
  EXPECT_EQ(r.kind, CollectiveKind::all_reduce);
  EXPECT_EQ(r.op, ReduceOp::avg);
  EXPECT_EQ(r.dtype, DType::f32);
  EXPECT_EQ(r.count, 1024);
  EXPECT_EQ(r.started_ns, 110);
  EXPECT_EQ(to_json(back), to_json(s));
}

TEST(FlightDump, ErrorsNameTheFileAndTheField) {
  std::string text = to_json(sample_snapshot());
  const auto at = text.find("\"op\": \"all_reduce\"");
  ASSERT_NE(at, std::string::npos);
  std::string bad = text;
  bad.replace(at, 18, "\"op\": \"all_reduse\"");
  try {
    from_json(bad, "d/flight_rank_1.json");
    ADD_FAILURE() << "an unknown op was read";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("d/flight_rank_1.json: \"op\" of collective 0 is "
                                         "'all_reduse'"),
              std::string::npos)
        << e.what();
  }
  try {
    from_json("{\"format\": \"other\", \"version\": 1}", "x.json");
    ADD_FAILURE();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("x.json: format 'other'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(from_json("{", "y.json"), ValueError);
}

TEST(FlightDump, WritesAndReadsADirectory) {
  const std::string dir = ::testing::TempDir() + "flight_dumps_" + std::to_string(::getpid());
  RankSnapshot s = sample_snapshot();
  EXPECT_EQ(write_dump(dir, s), dir + "/flight_rank_1.json");
  s.rank = 0;
  write_dump(dir, s);
  const auto dumps = read_dumps(dir);
  ASSERT_EQ(dumps.size(), 2u);
  EXPECT_EQ(dumps[0].rank, 0);
  EXPECT_EQ(dumps[1].rank, 1);
  EXPECT_TRUE(std::filesystem::is_empty(dir) == false);
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos);  // renamed
  std::filesystem::remove_all(dir);
  EXPECT_THROW(read_dumps(dir), ValueError);
}

}  // namespace
}  // namespace ddp::flight
