// ddprun's side of the flight recorder: the hang detector's decision (Note
// [hang detector]), --hang-timeout, the ranks' environment and `ddprun
// analyze`. The processes: tests/e2e/flight_*.sh.
#include "collectives/flight/flight_dump.h"
#include "collectives/flight/flight_recorder.h"
#include "launcher/analyze.h"
#include "launcher/flight_watch.h"
#include "launcher/options.h"
#include "launcher/process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

namespace ddp::launcher {
namespace {

constexpr int64_t kS = 1'000'000'000;

WatchedRank watched(int rank, int64_t progress_s, bool waits, bool exited = false) {
  WatchedRank w;
  w.rank = rank;
  w.exited = exited;
  w.status.last_progress_ns = progress_s * kS;
  w.status.waiters = waits ? 1 : 0;
  return w;
}

TEST(HangDetector, NoProgressWhileARankWaits) {
  // Rank 2 stopped at 100 s; the others progressed until 110 s and wait since.
  const std::vector<WatchedRank> ranks = {watched(0, 110, true), watched(1, 110, true),
                                          watched(2, 100, false), watched(3, 110, true)};
  EXPECT_FALSE(find_hang(ranks, 119 * kS, 10 * kS, 0));
  const auto hang = find_hang(ranks, 121 * kS, 10 * kS, 0);
  ASSERT_TRUE(hang);
  EXPECT_DOUBLE_EQ(hang->silent_s, 11.0);
  EXPECT_EQ(hang->waiting, (std::vector<int>{0, 1, 3}));
  EXPECT_FALSE(find_hang(ranks, 121 * kS, 0, 0));  // --hang-timeout 0: never
}

TEST(HangDetector, NobodyWaitingIsNoHang) {
  // Rank 0 computes (saves a checkpoint) for a long time; nobody waits yet.
  EXPECT_FALSE(find_hang({watched(0, 10, false), watched(1, 10, false)}, 500 * kS, 10 * kS, 0));
  // An exited rank waits for nothing: only running waiters count.
  EXPECT_FALSE(
      find_hang({watched(0, 10, true, true), watched(1, 10, false)}, 500 * kS, 10 * kS, 0));
  // ... but one that exited makes no progress either: the others wait for it in vain.
  EXPECT_TRUE(find_hang({watched(0, 10, false, true), watched(1, 12, true)}, 500 * kS, 10 * kS, 0));
}

// Note [hang on several nodes]: another node's ranks wait; here, the rank stuck in
// compute (waiting in no collective, silent for the timeout) is the one they wait for.
TEST(HangDetector, AnotherNodesHangFindsTheStalledRankHere) {
  const std::vector<WatchedRank> ranks = {watched(2, 100, false), watched(3, 115, false),
                                          watched(4, 100, true), watched(5, 100, false, true)};
  // Rank 3 progressed 5 s ago, rank 4 waits in a collective, rank 5 exited.
  EXPECT_EQ(find_stalled(ranks, 120 * kS, 10 * kS, 0, 1), std::vector<int>{2});
  EXPECT_TRUE(find_stalled(ranks, 109 * kS, 10 * kS, 0, 1).empty());
  EXPECT_TRUE(find_stalled(ranks, 120 * kS, 10 * kS, 115 * kS, 1).empty());  // paused until 115 s
  EXPECT_TRUE(find_stalled(ranks, 120 * kS, 0, 0, 1).empty());               // --hang-timeout 0
  // One that never issued a collective counts from the ranks' start.
  EXPECT_EQ(find_stalled({watched(6, 0, false)}, 120 * kS, 10 * kS, 0, 100 * kS),
            std::vector<int>{6});
  EXPECT_TRUE(find_stalled({watched(6, 0, false)}, 120 * kS, 10 * kS, 0, 115 * kS).empty());
}

TEST(HangDetector, TheClockRestartsAfterAPause) {
  const std::vector<WatchedRank> ranks = {watched(0, 10, true), watched(1, 10, true)};
  EXPECT_TRUE(find_hang(ranks, 100 * kS, 10 * kS, 0));
  EXPECT_FALSE(find_hang(ranks, 100 * kS, 10 * kS, 95 * kS));  // every rank was stopped until 95 s
  EXPECT_TRUE(find_hang(ranks, 106 * kS, 10 * kS, 95 * kS));
}

TEST(HangTimeout, FlagAndDefault) {
  const char* argv[] = {"ddprun", "--hang-timeout", "60", "train"};
  EXPECT_DOUBLE_EQ(*parse_ddprun_args(4, argv).options.hang_timeout_s, 60);
  const char* plain[] = {"ddprun", "train"};
  EXPECT_FALSE(parse_ddprun_args(2, plain).options.hang_timeout_s.has_value());
  const char* negative[] = {"ddprun", "--hang-timeout", "-1", "train"};
  try {
    parse_ddprun_args(4, negative);
    ADD_FAILURE() << "--hang-timeout -1 was accepted";
  } catch (const ValueError& e) {
    EXPECT_EQ(std::string(e.what()), "--hang-timeout -1: must be >= 0 seconds (0: never)");
  }
  // Note [default hang timeout]: the ranks' longest collective timeout + 60 s.
  EXPECT_EQ(default_hang_timeout(300 * kS), std::chrono::seconds(360));
  EXPECT_EQ(default_hang_timeout(1800 * kS), std::chrono::seconds(1860));
  EXPECT_EQ(default_hang_timeout(0), std::chrono::seconds(0));  // not known yet: no detection
  EXPECT_NE(std::string(kDdprunUsage).find("--hang-timeout S"), std::string::npos);
  EXPECT_NE(std::string(kDdprunUsage).find("ddprun analyze DIR"), std::string::npos);
}

TEST(FlightOptions, DirectoriesAndTheRanksEnvironment) {
  ::unsetenv("DDP_FLIGHT_DIR");
  FlightOptions o = flight_options("abc", 0, "", std::chrono::seconds(5));
  EXPECT_EQ(o.dump_dir, flight::private_dump_base() + "/abc");
  EXPECT_NE(o.dump_dir.find(fmt::format("/ddp_flight-{}/", ::geteuid())), std::string::npos);
  EXPECT_FALSE(o.shm_parent.empty());
  EXPECT_EQ(*o.hang_timeout, std::chrono::seconds(5));
  EXPECT_FALSE(flight_options("abc", 0, "", std::nullopt).hang_timeout);
  EXPECT_EQ(flight_options("abc", 2, "logs", {}).dump_dir, "logs/restart_2");
  ::setenv("DDP_FLIGHT_DIR", "/mine", 1);
  o = flight_options("abc", 0, "logs", {});
  EXPECT_EQ(o.dump_dir, "/mine");
  ::unsetenv("DDP_FLIGHT_DIR");
  std::vector<std::string> env = {"PATH=/bin", "DDP_FLIGHT_DIR=/old"};
  set_flight_environment(env, "/dev/shm/x", o.dump_dir);
  EXPECT_EQ(env, (std::vector<std::string>{"PATH=/bin", "DDPRUN_FLIGHT_SHM=/dev/shm/x",
                                           "DDP_FLIGHT_DIR=/mine"}));
}

// A temporary directory for the regions of one test.
class FlightWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    parent_ = ::testing::TempDir() + "flight_watch_" + std::to_string(::getpid());
    std::filesystem::remove_all(parent_);
    std::filesystem::create_directories(parent_);
  }
  void TearDown() override { std::filesystem::remove_all(parent_); }
  FlightOptions options(std::optional<std::chrono::milliseconds> hang = std::nullopt) const {
    FlightOptions o;
    o.shm_parent = parent_;
    o.restart = 1;
    o.dump_dir = parent_ + "/dumps";
    o.hang_timeout = hang;
    return o;
  }
  static flight::RecorderOptions recorder(const std::string& shm_dir) {
    return {.capacity = 8,
            .shm_dir = shm_dir,
            .dump_dir = "",
            .handle_sigusr1 = false,
            .dump_on_failure = false};
  }
  static void enqueue(flight::FlightRecorder& r, int64_t sequence, int64_t t) {
    CollectiveInfo info;
    info.world_size = 2;
    info.backend = "shm";
    info.kind = CollectiveKind::all_reduce;
    info.sequence = sequence;
    info.count = 1;
    info.dtype = DType::f32;
    info.bytes = 4;
    r.on_collective({info, CollectiveState::enqueued, t});
  }
  std::string parent_;
};

// Note [region directory]: private, locked while ddprun runs, removed after.
TEST_F(FlightWatchTest, RegionDirectoryIsPrivateLockedAndRemoved) {
  std::string dir;
  {
    FlightWatch watch(options(), {0, 1});
    dir = watch.shm_dir();
    ASSERT_TRUE(watch.enabled());
    EXPECT_EQ(dir.rfind(fmt::format("{}/ddprun-flight-{}-1-", parent_, ::getpid()), 0), 0u) << dir;
    struct stat st {};
    ASSERT_EQ(::stat(dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    std::vector<std::string> env;
    watch.set_environment(env);
    EXPECT_EQ(env, (std::vector<std::string>{"DDPRUN_FLIGHT_SHM=" + dir,
                                             "DDP_FLIGHT_DIR=" + parent_ + "/dumps"}));
    remove_stale_region_dirs(parent_);  // ours: alive
    EXPECT_TRUE(std::filesystem::is_directory(dir));
    // Two directories of a ddprun that is gone (a child that exited): one
    // whose lock nobody holds is removed; one still locked (another pid
    // namespace's live ddprun) stays, as does an unlocked one of a live pid.
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);
    ::waitpid(child, nullptr, 0);
    const std::string stale = fmt::format("{}/ddprun-flight-{}-0-aaaaaa", parent_, child);
    const std::string locked = fmt::format("{}/ddprun-flight-{}-1-bbbbbb", parent_, child);
    const std::string alive = fmt::format("{}/ddprun-flight-{}-0", parent_, ::getppid());
    for (const auto& d : {stale, locked, alive}) std::filesystem::create_directories(d + "/x");
    const int fd = ::open(locked.c_str(), O_RDONLY | O_DIRECTORY);
    ASSERT_EQ(::flock(fd, LOCK_EX), 0);
    remove_stale_region_dirs(parent_);
    ::close(fd);
    EXPECT_FALSE(std::filesystem::exists(stale));
    EXPECT_TRUE(std::filesystem::exists(locked));
    EXPECT_TRUE(std::filesystem::exists(alive));
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// Note [region file]: a second program of a rank replaces its region; a
// region whose header the rank overwrote is skipped, never thrown up.
TEST_F(FlightWatchTest, MovesToANewerRegionAndSurvivesABrokenOne) {
  FlightWatch watch(options(), {0});
  EXPECT_FALSE(watch.last_progress(0));
  auto first = std::make_unique<flight::FlightRecorder>(recorder(watch.shm_dir()), 0, 2);
  enqueue(*first, 0, 1000);
  watch.refresh();
  ASSERT_TRUE(watch.last_progress(0));
  EXPECT_EQ(watch.last_progress(0)->time_since_epoch(), std::chrono::nanoseconds(1000));
  EXPECT_FALSE(std::filesystem::exists(watch.shm_dir() + "/rank_0"));  // mapped: unlinked
  // The rank's next program (same rank, same directory).
  flight::FlightRecorder second(recorder(watch.shm_dir()), 0, 2);
  enqueue(second, 0, 5000);
  first.reset();  // the old program is gone
  watch.refresh();
  ASSERT_TRUE(watch.last_progress(0));
  EXPECT_EQ(watch.last_progress(0)->time_since_epoch(), std::chrono::nanoseconds(5000));
  // The rank scribbles over its header: nothing to read, nothing thrown.
  auto* magic = static_cast<std::atomic<uint64_t>*>(const_cast<void*>(second.region()));
  magic->store(42);
  EXPECT_FALSE(watch.last_progress(0));
  EXPECT_FALSE(watch.check_hang({RankRecord{}}, Clock::now()));
  EXPECT_EQ(watch.straggler_line(), "");
  watch.capture({RankRecord{}}, "test");
  EXPECT_EQ(watch.diagnosis().lines.size(), 0u);  // no snapshot: no diagnosis
}

// Note [default hang timeout]: derived from the regions, unless given.
TEST_F(FlightWatchTest, TheDefaultHangTimeoutComesFromTheRanksTimeouts) {
  FlightWatch derived(options(), {0, 1});
  EXPECT_EQ(derived.hang_timeout(), std::chrono::milliseconds(0));  // no region yet
  flight::FlightRecorder a(recorder(derived.shm_dir()), 0, 2), b(recorder(derived.shm_dir()), 1, 2);
  a.note_timeout(std::chrono::seconds(5));
  b.note_timeout(std::chrono::seconds(900));
  b.note_timeout(std::chrono::seconds(20));  // the longest of a rank's communicators stays
  derived.refresh();
  EXPECT_EQ(derived.hang_timeout(), std::chrono::seconds(960));
  FlightWatch given(options(std::chrono::seconds(7)), {0});
  EXPECT_EQ(given.hang_timeout(), std::chrono::seconds(7));
  FlightWatch off(options(std::chrono::seconds(0)), {0});
  EXPECT_EQ(off.hang_timeout(), std::chrono::seconds(0));
}

flight::RankSnapshot dump(int rank, int64_t last, bool open) {
  flight::RankSnapshot s;
  s.rank = rank;
  s.world_size = 2;
  s.job = "j";
  s.backend = "gloo";
  s.taken_ns = 50 * kS;
  for (int64_t i = 0; i <= last; ++i) {
    flight::CollectiveRecord r;
    r.sequence = i;
    r.kind = CollectiveKind::all_reduce;
    r.count = 10;
    r.bytes = 40;
    r.label = "ddp bucket 0";
    r.state = open && i == last ? flight::RecordState::started : flight::RecordState::completed;
    s.records.push_back(r);
  }
  if (open) {
    s.status.waiters = 1;
    s.status.wait_comm = 0;
    s.status.wait_sequence = last;
    s.status.wait_since_ns = 20 * kS;
  }
  return s;
}

// Note [SIGUSR1 to ddprun]: ddprun forwards SIGUSR1 only to a process that catches
// it (a rank with a flight recorder); one with its default action would die of it.
TEST(SignalForwarding, OnlyToAProcessThatCatchesTheSignal) {
  const std::string caught = "Name:\ttrain\nSigIgn:\t0000000000001000\nSigCgt:\t0000000180004200\n";
  EXPECT_TRUE(catches_signal_in(caught, SIGUSR1));  // bit 10 - 1 = 9: 0x200
  EXPECT_TRUE(catches_signal_in(caught, SIGTERM));  // 15: 0x4000
  EXPECT_FALSE(catches_signal_in(caught, SIGUSR2));
  EXPECT_FALSE(catches_signal_in(caught, SIGPIPE));  // ignored, not caught
  EXPECT_FALSE(catches_signal_in("Name:\ttrain\nSigCgt:\t0000000000000000\n", SIGUSR1));
  EXPECT_FALSE(catches_signal_in("Name:\ttrain\n", SIGUSR1));
  EXPECT_FALSE(catches_signal_in(caught, 0));
  // This process: gtest installs no SIGUSR1 handler; one installed is seen.
  struct sigaction old {};
  struct sigaction sa {};
  sa.sa_handler = [](int) {};
  ::sigemptyset(&sa.sa_mask);
  ASSERT_EQ(::sigaction(SIGUSR1, &sa, &old), 0);
  EXPECT_TRUE(catches_signal(::getpid(), SIGUSR1));
  ::sigaction(SIGUSR1, &old, nullptr);
  EXPECT_EQ(catches_signal(::getpid(), SIGUSR1),
            old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN);
}

TEST(Analyze, PrintsTheDiagnosisOfADirectory) {
  const std::string dir = ::testing::TempDir() + "analyze_" + std::to_string(::getpid());
  flight::write_dump(dir, dump(0, 7, true));  // rank 1 never entered #7
  flight::write_dump(dir, dump(1, 6, false));
  std::ostringstream out, err;
  EXPECT_EQ(run_analyze({dir}, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("2 dumps of job j (world size 2, backend gloo)"), std::string::npos)
      << out.str();
  EXPECT_NE(out.str().find("rank 1 never entered all_reduce #7 (ddp bucket 0, 40 B); rank 0 has "
                           "waited 30.0 s in it"),
            std::string::npos)
      << out.str();
  std::filesystem::remove_all(dir);
  std::ostringstream out2, err2;
  EXPECT_EQ(run_analyze({dir}, out2, err2), 1);
  EXPECT_NE(err2.str().find("not a directory"), std::string::npos) << err2.str();
  EXPECT_EQ(run_analyze({}, out2, err2), 2);
  EXPECT_EQ(run_analyze({"a", "b"}, out2, err2), 2);
}

}  // namespace
}  // namespace ddp::launcher
