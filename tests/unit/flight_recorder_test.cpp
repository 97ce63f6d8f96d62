// The flight recorder's memory and dumps (collectives/flight/): what a reader
// of the region sees after each moment of a collective, the ring's wrap, a
// record caught mid-write, the wait and step accounting, and the JSON dump's
// round trip and errors. The processes: tests/e2e/flight_*.sh.
#include "collectives/flight/flight_recorder.h"
#include "collectives/flight/flight_dump.h"
#include "runtime/env.h"
#include "runtime/error.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
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
  int64_t decoded = 0;  // records the reader checked: a reader that decodes none proves nothing
  std::thread reader([&] {
    while (!done) {
      for (const CollectiveRecord& c : r.snapshot().records) {
        ASSERT_EQ(c.label, fmt::format("label {}", c.sequence % 7)) << c.sequence;
        ASSERT_EQ(c.count, c.sequence * 3);
        ++decoded;
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
  EXPECT_GT(decoded, 0);
}

TEST(FlightRecorder, AStoppedWaitSectionIsReportedTorn) {
  FlightRecorder r(options(4), 0, 2);
  tell(r, info(0), CollectiveState::enqueued, 10);
  tell(r, info(0), CollectiveState::wait_begin, 20);
  EXPECT_FALSE(r.status().wait_torn);
  // A rank stopped inside wait_begin/wait_end leaves the wait section's lock odd.
  auto* h = static_cast<SharedHeader*>(const_cast<void*>(r.region()));
  h->wait_lock.fetch_add(1);
  const RankStatus s = r.status();
  EXPECT_TRUE(s.wait_torn);
  EXPECT_EQ(s.waiters, 1);  // the last copy, not "not waiting"
  EXPECT_EQ(s.wait_since_ns, 20);
  h->wait_lock.fetch_add(1);
  EXPECT_FALSE(r.status().wait_torn);
}

TEST(FlightRecorder, NotesTheLongestCollectiveTimeout) {
  FlightRecorder r(options(4), 0, 2);
  EXPECT_EQ(r.status().collective_timeout_ns, 0);
  r.note_timeout(std::chrono::seconds(300));
  r.note_timeout(std::chrono::seconds(30));
  EXPECT_EQ(r.status().collective_timeout_ns, 300'000'000'000);
  r.note_timeout(std::chrono::seconds(1800));
  EXPECT_EQ(r.status().collective_timeout_ns, 1'800'000'000'000);
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
  // The first step is also kept apart (Note [straggler report]); later ones are not.
  EXPECT_EQ(s.first_step_ns, s.step_ns);
  EXPECT_EQ(s.first_step_blocked_ns, 2'000'000);
  r.step_begin();
  r.step_end();
  const RankStatus after = r.status();
  EXPECT_EQ(after.steps, 2);
  EXPECT_EQ(after.first_step_ns, s.step_ns);
  EXPECT_EQ(after.first_step_blocked_ns, 2'000'000);
  EXPECT_GE(after.step_ns, s.step_ns);
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
  EXPECT_EQ(o.dump_dir, private_dump_base());
}

// Note [job id]: torchrun's run id was ignored, so two torchrun jobs' dumps in one
// directory were not told apart; a Slurm job's steps share SLURM_JOB_ID.
TEST(FlightRecorder, TheJobIdOfEachLauncher) {
  const char* names[] = {"DDPRUN_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID",
                         "OMPI_MCA_ess_base_jobid"};
  std::vector<std::pair<const char*, std::optional<std::string>>> saved;
  for (const char* n : names) {
    saved.emplace_back(n, env::get(n));
    unsetenv(n);
  }
  set_job_id("");
  EXPECT_EQ(job_id_from_env(), "");
  set_job_id("4242-0badcafe");  // a hand-started job's, from rank 0 (Note [job check])
  EXPECT_EQ(job_id_from_env(), "4242-0badcafe");
  setenv("SLURM_JOB_ID", "1234", 1);
  EXPECT_EQ(job_id_from_env(), "1234");
  setenv("SLURM_STEP_ID", "2", 1);
  EXPECT_EQ(job_id_from_env(), "1234.2");
  setenv("TORCHELASTIC_RUN_ID", "none", 1);  // torchrun's default: no id
  EXPECT_EQ(job_id_from_env(), "1234.2");
  setenv("TORCHELASTIC_RUN_ID", "3f2a-run", 1);
  EXPECT_EQ(job_id_from_env(), "3f2a-run");
  setenv("DDPRUN_RUN_ID", "ddprun-7", 1);
  EXPECT_EQ(job_id_from_env(), "ddprun-7");
  set_job_id("");
  for (const auto& [n, v] : saved) {
    if (v)
      setenv(n, v->c_str(), 1);
    else
      unsetenv(n);
  }
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

// Note [region file]: links or files planted where the rank writes its region
// are never followed or truncated.
TEST(FlightRecorder, ARegionNeverWritesThroughAPlantedLink) {
  const std::string dir = ::testing::TempDir() + "flight_planted_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string victim = dir + "/victim";
  std::ofstream(victim) << "precious";
  RecorderOptions o = options(8);
  o.shm_dir = dir;
  std::filesystem::create_symlink(victim, dir + "/rank_3");
  {
    FlightRecorder r(o, 3, 4);
    EXPECT_EQ(r.region_path(), dir + "/rank_3");
    EXPECT_TRUE(std::filesystem::is_regular_file(std::filesystem::symlink_status(dir + "/rank_3")));
  }
  std::filesystem::remove(dir + "/rank_3");
  // A link where the temporary goes: no region file, anonymous memory instead.
  std::filesystem::create_symlink(victim, fmt::format("{}/rank_3.{}", dir, ::getpid()));
  {
    FlightRecorder r(o, 3, 4);
    EXPECT_EQ(r.region_path(), "");
    tell(r, info(1), CollectiveState::enqueued, 7);
    EXPECT_EQ(r.snapshot().records.size(), 1u);
  }
  std::ifstream in(victim);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "precious");
  std::filesystem::remove_all(dir);
}

// Note [flight recorder and fork]: the child's copy writes nothing into the
// parent's region.
TEST(FlightRecorder, AForkedChildLeavesTheParentsRegionAlone) {
  const std::string dir = ::testing::TempDir() + "flight_fork_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  RecorderOptions o = options(8);
  o.shm_dir = dir;  // MAP_SHARED: what a child writes, the parent would see
  FlightRecorder r(o, 0, 2);
  tell(r, info(0), CollectiveState::enqueued, 10);
  // ensure_recorder() registers the fork handlers; a world of 1 installs nothing.
  ensure_recorder(0, 1);
  ensure_recorder(0, 2);
  const pid_t child = ::fork();
  if (child == 0) {
    tell(r, info(1), CollectiveState::enqueued, 20);
    r.step_begin();
    r.step_end();
    ::_exit(recorder() == nullptr ? 0 : 3);  // the child starts over
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const RankSnapshot s = r.snapshot();
  EXPECT_EQ(s.recorded, 1);
  EXPECT_EQ(s.status.steps, 0);
  EXPECT_EQ(s.pid, ::getpid());
  std::filesystem::remove_all(dir);
}

// Note [flight recorder and fork]: SIGUSR1 to a forked child dumps nothing of
// the parent's and leaves the child alive; the child's own recorder dumps.
// Run in a child of the test, so that the process's recorder is this test's.
TEST(FlightRecorder, SigusrOneInAForkedChildIsTheChildsOwn) {
  const std::string dir = ::testing::TempDir() + "flight_usr1_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  auto wait_for = [](const std::string& path) {
    for (int i = 0; i < 500 && !std::filesystem::exists(path); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return std::filesystem::exists(path);
  };
  const pid_t parent = ::fork();
  if (parent == 0) {
    ::setenv("DDP_FLIGHT_DIR", dir.c_str(), 1);
    ::unsetenv("DDPRUN_FLIGHT_SHM");
    ::unsetenv("DDP_FLIGHT_RECORDER_SIZE");
    ::signal(SIGUSR1, SIG_DFL);
    ensure_recorder(0, 2);
    if (recorder() == nullptr) ::_exit(3);
    // Let the recorder's signal thread finish starting before the fork: a fork while
    // it starts copies the ASan allocator's lock held (GCC 12's ASan does not take
    // it around fork), and the child then deadlocks in its first malloc (seen on
    // CI's ASan run, and reproduced with gdb: both of the child's threads waiting
    // in SizeClassAllocator64::GetFromAllocator).
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const pid_t child = ::fork();
    if (child == 0) {
      if (recorder() != nullptr) ::_exit(4);
      ::raise(SIGUSR1);  // must neither kill it nor make the parent dump
      ensure_recorder(1, 2);
      ::raise(SIGUSR1);  // its own recorder's dump
      ::_exit(wait_for(dir + "/flight_rank_1.json") ? 0 : 5);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ::_exit(10 + WEXITSTATUS(status));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (std::filesystem::exists(dir + "/flight_rank_0.json")) ::_exit(6);  // the child's signal
    ::raise(SIGUSR1);
    ::_exit(wait_for(dir + "/flight_rank_0.json") ? 0 : 7);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(parent, &status, 0), parent);
  EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
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
  r.step_begin();
  r.step_end();
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
  EXPECT_EQ(back.status.steps, 1);
  EXPECT_GT(back.status.first_step_ns, 0);
  EXPECT_EQ(back.status.first_step_ns, s.status.first_step_ns);
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

// A world size of 2e9 passed, and ddprun analyze died of std::bad_alloc listing its ranks.
TEST(FlightDump, AWorldSizePastTheBoundNamesTheFile) {
  const std::string text = to_json(sample_snapshot());
  const std::string field = fmt::format("\"world_size\": {}", sample_snapshot().world_size);
  const auto at = text.find(field);
  ASSERT_NE(at, std::string::npos);
  for (const char* world : {"2000000000", "4294967298"}) {
    std::string bad = text;
    bad.replace(at, field.size(), fmt::format("\"world_size\": {}", world));
    try {
      from_json(bad, "d/flight_rank_1.json");
      ADD_FAILURE() << "world size " << world << " was read";
    } catch (const ValueError& e) {
      EXPECT_NE(
          std::string(e.what()).find(fmt::format(
              "d/flight_rank_1.json: \"world_size\" is {}; expected 1 to 4194304 ranks", world)),
          std::string::npos)
          << e.what();
    }
  }
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
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 2);  // no temporaries
  std::filesystem::remove_all(dir);
  EXPECT_THROW(read_dumps(dir), ValueError);
}

// Two dumps of one process at once (SIGUSR1's thread and a timeout) each
// write a temporary of their own: every write succeeds and the dump parses.
TEST(FlightDump, ConcurrentDumpsOfOneProcess) {
  const std::string dir = ::testing::TempDir() + "flight_concurrent_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  FlightRecorder r(options(2000), 1, 4);
  for (int64_t i = 0; i < 2000; ++i) tell(r, info(i), CollectiveState::enqueued, 10 + i);
  const RankSnapshot big = r.snapshot();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        try {
          write_dump(dir, big);
        } catch (const Error&) {
          ++failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  const auto dumps = read_dumps(dir);
  ASSERT_EQ(dumps.size(), 1u);
  EXPECT_EQ(dumps[0].records.size(), 2000u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1);
  std::filesystem::remove_all(dir);
}

// Note [dump directories]: the default parent is the user's own.
TEST(FlightDump, TheDefaultDirectoryIsPrivate) {
  const std::string tmp = ::testing::TempDir() + "flight_tmp_" + std::to_string(::getpid());
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  const auto saved = env::get("TMPDIR");
  ::setenv("TMPDIR", tmp.c_str(), 1);
  const std::string base = private_dump_base();
  EXPECT_EQ(base, fmt::format("{}/ddp_flight-{}", tmp, ::geteuid()));
  const RankSnapshot s = sample_snapshot();
  write_dump(base + "/job", s);
  struct stat st {};
  ASSERT_EQ(::lstat(base.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // Others may write to it (another user made it first): refused, with the fix.
  ::chmod(base.c_str(), 0777);
  try {
    write_dump(base + "/job", s);
    ADD_FAILURE() << "a dump went into a directory others may write";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(base + " is not a private directory of yours"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("set DDP_FLIGHT_DIR"), std::string::npos) << e.what();
  }
  // A link planted in its place: refused, nothing written through it.
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(tmp + "/elsewhere");
  std::filesystem::create_directory_symlink(tmp + "/elsewhere", base);
  EXPECT_THROW(write_dump(base, s), Error);
  EXPECT_TRUE(std::filesystem::is_empty(tmp + "/elsewhere"));
  // A directory the user names is used as it is.
  EXPECT_EQ(write_dump(tmp + "/mine", s), tmp + "/mine/flight_rank_1.json");
  if (saved) {
    ::setenv("TMPDIR", saved->c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace ddp::flight
