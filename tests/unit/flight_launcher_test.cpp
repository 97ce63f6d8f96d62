// ddprun's side of the flight recorder: the hang detector's decision (Note
// [hang detector]), --hang-timeout, the ranks' environment and `ddprun
// analyze`. The processes: tests/e2e/flight_*.sh.
#include "collectives/flight/flight_dump.h"
#include "launcher/analyze.h"
#include "launcher/flight_watch.h"
#include "launcher/options.h"

#include <gtest/gtest.h>
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
  EXPECT_DOUBLE_EQ(default_hang_timeout_s(std::nullopt), 360);
  EXPECT_DOUBLE_EQ(default_hang_timeout_s("1800"), 1860);
  EXPECT_DOUBLE_EQ(default_hang_timeout_s("soon"), 360);
  EXPECT_NE(std::string(kDdprunUsage).find("--hang-timeout S"), std::string::npos);
  EXPECT_NE(std::string(kDdprunUsage).find("ddprun analyze DIR"), std::string::npos);
}

TEST(FlightOptions, DirectoriesAndTheRanksEnvironment) {
  ::unsetenv("DDP_FLIGHT_DIR");
  FlightOptions o = flight_options("abc", 0, "", std::chrono::seconds(5));
  EXPECT_TRUE(o.dump_dir.ends_with("/ddp_flight/abc")) << o.dump_dir;
  EXPECT_NE(o.shm_dir.find(fmt::format("ddprun-flight-{}-0", ::getpid())), std::string::npos);
  EXPECT_EQ(flight_options("abc", 2, "logs", {}).dump_dir, "logs/restart_2");
  ::setenv("DDP_FLIGHT_DIR", "/mine", 1);
  o = flight_options("abc", 0, "logs", {});
  EXPECT_EQ(o.dump_dir, "/mine");
  ::unsetenv("DDP_FLIGHT_DIR");
  std::vector<std::string> env = {"PATH=/bin", "DDP_FLIGHT_DIR=/old"};
  set_flight_environment(env, o);
  EXPECT_EQ(env, (std::vector<std::string>{"PATH=/bin", "DDPRUN_FLIGHT_SHM=" + o.shm_dir,
                                           "DDP_FLIGHT_DIR=/mine"}));
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
