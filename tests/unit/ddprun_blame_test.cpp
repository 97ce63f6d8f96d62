// launcher/blame.h: which rank ddprun blames (Note [blame]), and
// --store-secret-file's checks. The processes: tests/e2e/ddprun_stopped.sh.
#include "launcher/blame.h"
#include "launcher/options.h"
#include "launcher/secret_file.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace ddp::launcher {
namespace {

using std::chrono::seconds;

const Clock::time_point t0 = Clock::time_point() + std::chrono::hours(1);

RankRecord running(int rank) {
  RankRecord r;
  r.rank = rank;
  r.pid = 100 + rank;
  r.start = t0;
  return r;
}
RankRecord exited(int rank, int wait_status, double at_s, bool signalled = false) {
  RankRecord r = running(rank);
  r.wait_status = wait_status;
  r.exit_time =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at_s));
  r.signalled = signalled;
  return r;
}
RankRecord stopped(int rank, double since_s) {
  RankRecord r = running(rank);
  r.stopped_since =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(since_s));
  r.stop_signal = SIGSTOP;
  return r;
}
int exit_status(int code) {
  return code << 8;
}  // as waitpid reports exit(code)
int signal_status(int sig) {
  return sig;
}  // killed by sig, no core

BlamePolicy policy_of(seconds stopped, seconds progress = seconds(0)) {
  BlamePolicy p;
  p.stopped_timeout = stopped;
  p.progress_timeout = progress;
  return p;
}
const BlamePolicy kPolicy = policy_of(seconds(30));

TEST(DdprunBlame, NothingWrongWhileRanksRunOrSucceed) {
  EXPECT_FALSE(find_blame({running(0), exited(1, 0, 5)}, t0 + seconds(100), kPolicy));
  EXPECT_FALSE(find_blame({}, t0, kPolicy));
}

TEST(DdprunBlame, TheFirstRankToFailOnItsOwn) {
  const auto b = find_blame({exited(0, exit_status(1), 9), exited(1, exit_status(3), 4),
                             exited(2, signal_status(SIGTERM), 2, /*signalled=*/true)},
                            t0 + seconds(10), kPolicy);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->index, 1u);  // rank 2 died earlier, but of ddprun's SIGTERM
  EXPECT_EQ(b->reason, BlameReason::failed);
  EXPECT_EQ(b->exit_code, 3);
  EXPECT_EQ(b->what, "rank 1 (pid 101) failed: exit code 3 after 4.0 s");
  const auto k = find_blame({exited(0, signal_status(SIGKILL), 1)}, t0 + seconds(2), kPolicy);
  ASSERT_TRUE(k);
  EXPECT_EQ(k->exit_code, 128 + SIGKILL);
}

TEST(DdprunBlame, AStoppedRankEndsTheJobAtItsTimeoutNotBefore) {
  const std::vector<RankRecord> ranks = {running(0), stopped(1, 10)};
  EXPECT_FALSE(find_blame(ranks, t0 + seconds(39), kPolicy));
  const auto b = find_blame(ranks, t0 + seconds(40), kPolicy);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->index, 1u);
  EXPECT_EQ(b->reason, BlameReason::stopped);
  EXPECT_EQ(b->exit_code, 128 + SIGSTOP);
  EXPECT_EQ(b->what,
            "rank 1 (pid 101) has been stopped by SIGSTOP for 30.0 s (--stopped-timeout 30 s; 0 "
            "waits for ever)");
  EXPECT_FALSE(find_blame(ranks, t0 + seconds(1000), policy_of(seconds(0))));
}

// Item 5 of issue 15: the rank whose collective timed out first is not the culprit.
TEST(DdprunBlame, AStoppedRankIsBlamedForAFailureAfterItStopped) {
  const BlamePolicy never = policy_of(seconds(0));
  const auto b = find_blame({exited(0, exit_status(1), 310), stopped(1, 5), running(2)},
                            t0 + seconds(311), never);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->index, 1u);
  EXPECT_EQ(b->reason, BlameReason::stopped);
  EXPECT_EQ(b->exit_code, 128 + SIGSTOP);
  EXPECT_NE(b->what.find("rank 1 (pid 101) was stopped by SIGSTOP 305.0 s before rank 0 (pid 100) "
                         "failed: exit code 1"),
            std::string::npos)
      << b->what;
  // Stopped only after the failure: the failure is first.
  const auto f = find_blame({exited(0, exit_status(1), 3), stopped(1, 5)}, t0 + seconds(6), never);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->index, 0u);
  EXPECT_EQ(f->reason, BlameReason::failed);
}

// Note [stop clocks]: a whole-job pause ends nothing; a failure still blames.
TEST(DdprunBlame, EveryRunningRankStoppedIsAPauseNotAFault) {
  EXPECT_FALSE(find_blame({stopped(0, 1), stopped(1, 2)}, t0 + seconds(1000), kPolicy));
  EXPECT_FALSE(
      find_blame({exited(0, exit_status(0), 1), stopped(1, 2)}, t0 + seconds(1000), kPolicy));
  EXPECT_TRUE(every_running_rank_stopped({exited(0, exit_status(0), 1), stopped(1, 2)}));
  EXPECT_FALSE(every_running_rank_stopped({running(0), stopped(1, 2)}));
  EXPECT_FALSE(every_running_rank_stopped({exited(0, exit_status(0), 1)}));
  const auto b =
      find_blame({exited(0, exit_status(3), 9), stopped(1, 2)}, t0 + seconds(10), kPolicy);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->index, 1u);  // stopped before rank 0 failed
}

// Across nodes, this node's ranks all stopped is no pause: the other nodes' ranks
// wait for them (one rank per node), so --stopped-timeout ends the job.
TEST(DdprunBlame, EveryLocalRankStoppedAcrossNodesIsAFault) {
  BlamePolicy across = kPolicy;
  across.across_nodes = true;
  EXPECT_FALSE(job_paused({stopped(0, 1)}, across));
  EXPECT_TRUE(job_paused({stopped(0, 1)}, kPolicy));
  EXPECT_FALSE(find_blame({stopped(0, 1)}, t0 + seconds(30), across));
  const auto b = find_blame({stopped(0, 1)}, t0 + seconds(31), across);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->reason, BlameReason::stopped);
  EXPECT_FALSE(stop_clocks_restart({stopped(0, 1)}, t0 + seconds(10),
                                   t0 + seconds(10) + std::chrono::milliseconds(250), across));
}

TEST(DdprunBlame, StopClocksRestartOnAPauseOrAGapInDdprunsOwnRun) {
  EXPECT_FALSE(stop_clocks_restart({running(0), stopped(1, 2)}, t0 + seconds(10),
                                   t0 + seconds(10) + std::chrono::milliseconds(300), kPolicy));
  EXPECT_TRUE(stop_clocks_restart({running(0), stopped(1, 2)}, t0 + seconds(10), t0 + seconds(15),
                                  kPolicy));
  EXPECT_TRUE(stop_clocks_restart({stopped(0, 1), stopped(1, 2)}, t0 + seconds(10),
                                  t0 + seconds(10) + std::chrono::milliseconds(250), kPolicy));
  // Restarted at 100 s: a 30 s limit is reached at 130 s, not at 32 s; the
  // message still says how long the rank has really been stopped.
  RankRecord r = stopped(1, 2);
  r.stop_clock_restart = t0 + seconds(100);
  EXPECT_FALSE(find_blame({running(0), r}, t0 + seconds(129), kPolicy));
  const auto b = find_blame({running(0), r}, t0 + seconds(130), kPolicy);
  ASSERT_TRUE(b);
  EXPECT_NE(b->what.find("for 128.0 s"), std::string::npos) << b->what;
}

TEST(DdprunBlame, TheEarliestTroubleWinsTiesToTheLowerRank) {
  const auto b = find_blame({stopped(0, 8), stopped(1, 2), stopped(2, 2), running(3)},
                            t0 + seconds(40), kPolicy);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->index, 1u);
}

// What the hang detector feeds: no progress since T.
TEST(DdprunBlame, NoProgressPastItsLimit) {
  const BlamePolicy policy = policy_of(seconds(0), seconds(60));
  RankRecord a = running(0), b = running(1);
  a.last_progress = t0 + seconds(50);
  b.last_progress = t0 + seconds(10);
  EXPECT_FALSE(find_blame({a, b}, t0 + seconds(69), policy));
  const auto blame = find_blame({a, b}, t0 + seconds(70), policy);
  ASSERT_TRUE(blame);
  EXPECT_EQ(blame->index, 1u);
  EXPECT_EQ(blame->reason, BlameReason::no_progress);
  EXPECT_EQ(blame->exit_code, kNoProgressExitCode);
  EXPECT_EQ(blame->what, "rank 1 (pid 101) made no progress for 60.0 s (--hang-timeout 60 s)");
  EXPECT_FALSE(find_blame({a, b}, t0 + seconds(1000), kPolicy));  // not judged without a limit
}

// Note [blame]: a stalled rank (the diagnosis's suspect) counts as soon as
// another rank fails after it stalled, long before the hang timeout: the
// others' collectives timed out waiting for it.
TEST(DdprunBlame, AStalledRankIsBlamedForAFailureAfterItStalled) {
  const BlamePolicy policy = policy_of(seconds(30), seconds(360));
  RankRecord timed_out = exited(0, exit_status(1), 310);
  RankRecord stalled = running(1);
  stalled.last_progress = t0 + seconds(10);
  auto b = find_blame({timed_out, stalled}, t0 + seconds(311), policy);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->index, 1u);
  EXPECT_EQ(b->reason, BlameReason::no_progress);
  EXPECT_EQ(b->exit_code, kNoProgressExitCode);
  EXPECT_EQ(b->what,
            "rank 1 (pid 101) made no progress 300.0 s before rank 0 (pid 100) failed: exit code "
            "1 after 310.0 s, and still makes none: the others most likely failed waiting for it");
  // Also with the detector off (--hang-timeout 0).
  b = find_blame({timed_out, stalled}, t0 + seconds(311), kPolicy);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->index, 1u);
  // Progress after the failure: the failure stands.
  stalled.last_progress = t0 + std::chrono::milliseconds(310500);
  b = find_blame({timed_out, stalled}, t0 + seconds(311), policy);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->index, 0u);
  EXPECT_EQ(b->reason, BlameReason::failed);
}

// Note [hang blame]: a hung job always ends as a failure.
TEST(DdprunBlame, AHangBlamesASuspectThatExitedOrTheFirstWaitingRank) {
  const BlamePolicy policy = policy_of(seconds(30), seconds(10));
  RankRecord waiter = running(0);
  waiter.last_progress = t0 + seconds(50);
  // Rank 1 exited with status 0 (its data ran out) while rank 0 waits for it.
  const RankRecord done = exited(1, exit_status(0), 45);
  HangVerdict v;
  v.silent_s = 10.5;
  v.waiting = {0};
  v.waiting_index = {0};
  v.suspects = {1};
  EXPECT_FALSE(find_blame({running(0), done}, t0 + seconds(61), policy));  // nobody, alone
  Blame b = blame_hang({running(0), done}, t0 + seconds(61), policy, v);
  EXPECT_EQ(b.index, 1u);
  EXPECT_EQ(b.exit_code, kNoProgressExitCode);
  EXPECT_EQ(b.reason, BlameReason::no_progress);
  EXPECT_EQ(b.what,
            "rank 1 (pid 101) exited (exit code 0) 16.0 s ago while rank 0 waits for it in a "
            "collective; no rank made progress for 10.5 s (--hang-timeout 10 s)");
  // No suspect on this node: the first waiting rank stands for the hang.
  v.suspects.clear();
  b = blame_hang({running(0), done}, t0 + seconds(61), policy, v);
  EXPECT_EQ(b.index, 0u);
  EXPECT_EQ(b.exit_code, kNoProgressExitCode);
  EXPECT_NE(b.what.find("the diagnosis names no rank of this node: rank 0 (pid 100), the first "
                        "that waits"),
            std::string::npos)
      << b.what;
  // A running suspect with its last progress: find_blame's word.
  RankRecord stuck = running(1);
  stuck.last_progress = t0 + seconds(20);
  v.suspects = {1};
  b = blame_hang({running(0), stuck}, t0 + seconds(61), policy, v);
  EXPECT_EQ(b.index, 1u);
  EXPECT_EQ(b.what, "rank 1 (pid 101) made no progress for 41.0 s (--hang-timeout 10 s)");
}

class DdprunSecretFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() / ("ddprun_secret_" + std::to_string(getpid())))
                .string();
  }
  void TearDown() override { std::filesystem::remove_all(path_); }
  void write(const std::string& text, mode_t mode) {
    std::ofstream(path_) << text;
    ::chmod(path_.c_str(), mode);
  }
  std::string error() {
    try {
      read_secret_file(path_);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "<no error>";
  }
  std::string path_;
};

TEST_F(DdprunSecretFile, PrivateFileWithoutTheNewline) {
  write("s3cret\n", 0600);
  EXPECT_EQ(read_secret_file(path_), "s3cret");
  write("s3cret", 0400);
  EXPECT_EQ(read_secret_file(path_), "s3cret");
}

TEST_F(DdprunSecretFile, RefusedWhenOthersMayReadItOrItIsEmpty) {
  write("s3cret\n", 0644);
  EXPECT_NE(error().find("mode 0644 lets others read or change the secret; it must be private to "
                         "its owner: chmod 600 " +
                         path_),
            std::string::npos)
      << error();
  write("s3cret\n", 0660);
  EXPECT_NE(error().find("mode 0660"), std::string::npos);
  write("\n", 0600);
  EXPECT_NE(error().find("the file is empty"), std::string::npos);
  std::filesystem::remove(path_);
  EXPECT_NE(error().find("cannot open it"), std::string::npos);
}

// Opening a FIFO for reading waits for a writer: refused without opening it
// for good (a hang here is the bug).
TEST_F(DdprunSecretFile, RefusedWhenNotARegularFile) {
  ASSERT_EQ(::mkfifo(path_.c_str(), 0600), 0);
  EXPECT_NE(error().find("not a regular file"), std::string::npos) << error();
  std::filesystem::remove(path_);
  std::filesystem::create_directory(path_);
  EXPECT_NE(error().find("not a regular file"), std::string::npos) << error();
}

// Root can make a file another user's; elsewhere the case cannot be set up.
TEST_F(DdprunSecretFile, RefusedWhenOwnedByAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give the file to another user";
  write("s3cret\n", 0600);
  ASSERT_EQ(::chown(path_.c_str(), 65534, 65534), 0);
  EXPECT_NE(error().find("owned by uid 65534, not by this user (uid 0)"), std::string::npos)
      << error();
}

}  // namespace
}  // namespace ddp::launcher
