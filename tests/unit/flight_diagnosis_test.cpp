// The hang diagnosis (Note [hang diagnosis]) and the straggler report (Note
// [straggler report]): pure functions over hand-made snapshots, each case the
// text a user reads. The processes: tests/e2e/flight_*.sh.
#include "collectives/flight/diagnosis.h"
#include "collectives/flight/straggler.h"

#include <gtest/gtest.h>

namespace ddp::flight {
namespace {

constexpr int64_t kS = 1'000'000'000;  // ns per second

CollectiveRecord rec(int64_t sequence, RecordState state, std::string label = "ddp bucket 3",
                     int64_t count = 300'000) {
  CollectiveRecord r;
  r.sequence = sequence;
  r.kind = CollectiveKind::all_reduce;
  r.op = ReduceOp::avg;
  r.dtype = DType::f32;
  r.count = count;
  r.bytes = count * 4;
  r.label = std::move(label);
  r.state = state;
  r.enqueued_ns = 99 * kS;
  if (state == RecordState::completed) r.finished_ns = 99 * kS;
  return r;
}

RankSnapshot rank(int r, std::vector<CollectiveRecord> records, int world = 4) {
  RankSnapshot s;
  s.rank = r;
  s.world_size = world;
  s.pid = 1000 + r;
  s.taken_ns = 400 * kS;
  s.process = ProcessState::running;
  s.records = std::move(records);
  return s;
}

// `s` waits in #sequence since `since_s`.
RankSnapshot waiting(RankSnapshot s, int64_t sequence, int64_t since_s) {
  s.status.waiters = 1;
  s.status.wait_comm = 0;
  s.status.wait_sequence = sequence;
  s.status.wait_since_ns = since_s * kS;
  return s;
}

RankSnapshot stopped(RankSnapshot s) {
  s.process = ProcessState::stopped;
  s.process_detail = "SIGSTOP";
  return s;
}

std::vector<CollectiveRecord> done_through(int64_t last) {
  std::vector<CollectiveRecord> out;
  for (int64_t i = last - 2; i <= last; ++i) out.push_back(rec(i, RecordState::completed));
  return out;
}

std::vector<CollectiveRecord> plus(std::vector<CollectiveRecord> v, CollectiveRecord r) {
  v.push_back(std::move(r));
  return v;
}

TEST(HangDiagnosis, NamesTheRankThatNeverEntered) {
  const auto in_it = plus(done_through(1233), rec(1234, RecordState::started));
  const Diagnosis d =
      diagnose({waiting(rank(0, in_it), 1234, 100), waiting(rank(1, in_it), 1234, 100),
                stopped(rank(2, done_through(1233))), waiting(rank(3, in_it), 1234, 100)});
  ASSERT_GE(d.lines.size(), 2u);
  EXPECT_EQ(d.lines[0],
            "rank 2 never entered all_reduce #1234 (ddp bucket 3, 1.2 MB); ranks 0,1,3 have "
            "waited 300 s in it");
  EXPECT_EQ(d.lines[1],
            "rank 2 (stopped by SIGSTOP): its last collective is all_reduce #1233 (ddp bucket 3, "
            "1.2 MB), completed 301 s before this report; it is in no collective");
  EXPECT_EQ(d.lines.size(), 2u) << d.lines.back();  // the stop is said once
  EXPECT_EQ(d.suspects, std::vector<int>{2});
}

TEST(HangDiagnosis, NamesAMismatchAndTheOddRankOut) {
  CollectiveRecord b = rec(57, RecordState::started, "ddp bucket order", 10);
  b.kind = CollectiveKind::broadcast;
  b.dtype = DType::i64;
  b.bytes = 80;
  const auto theirs = plus(done_through(56), rec(57, RecordState::started, "ddp bucket 3", 1024));
  const Diagnosis d =
      diagnose({waiting(rank(0, theirs), 57, 395), rank(1, plus(done_through(56), b)),
                waiting(rank(2, theirs), 57, 395), waiting(rank(3, theirs), 57, 395)});
  ASSERT_FALSE(d.lines.empty());
  EXPECT_EQ(d.lines[0],
            "collective mismatch at #57: rank 1 called broadcast(root 0) of 10 i64 ('ddp bucket "
            "order'), ranks 0,2,3 all_reduce(avg) of 1024 f32 ('ddp bucket 3')");
  EXPECT_EQ(d.suspects, std::vector<int>{1});
}

TEST(HangDiagnosis, ASkippedAllReduceShowsAsDifferentCountsAndLabels) {
  // Rank 1 skipped bucket 0 at #20: its #20 is bucket 1, and every later
  // collective is one off.
  const auto theirs =
      plus(plus(done_through(19), rec(20, RecordState::started, "ddp bucket 0", 68362)),
           rec(21, RecordState::enqueued, "ddp bucket 1", 200704));
  const auto its = plus(done_through(19), rec(20, RecordState::started, "ddp bucket 1", 200704));
  const Diagnosis d = diagnose({rank(0, theirs, 3), rank(1, its, 3), rank(2, theirs, 3)});
  ASSERT_FALSE(d.lines.empty());
  EXPECT_EQ(d.lines[0],
            "collective mismatch at #20: rank 1 called all_reduce(avg) of 200704 f32 ('ddp bucket "
            "1'), ranks 0,2 all_reduce(avg) of 68362 f32 ('ddp bucket 0')");
  EXPECT_EQ(d.suspects, std::vector<int>{1});
  // Only the label differs: still a mismatch (another call site).
  const Diagnosis l =
      diagnose({rank(0, {rec(5, RecordState::started, "eval loss", 2)}, 2),
                rank(1, {rec(5, RecordState::started, "nonfinite step check", 2)}, 2)});
  EXPECT_EQ(l.lines[0],
            "collective mismatch at #5 (same shape, different labels): rank 0 called "
            "all_reduce(avg) of 2 f32 ('eval loss'), rank 1 all_reduce(avg) of 2 f32 "
            "('nonfinite step check')");
  EXPECT_TRUE(l.suspects.empty());  // one against one: no minority
  // Shapes that differ are not said to be the same.
  EXPECT_EQ(d.lines[0].find("same shape"), std::string::npos) << d.lines[0];
}

TEST(HangDiagnosis, ATornWaitStatusIsSaid) {
  RankSnapshot s = rank(0, done_through(4));
  s.status.wait_torn = true;
  const auto lines = rank_lines({s});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("its wait status being written"), std::string::npos) << lines[0];
  EXPECT_EQ(rank_lines({rank(0, done_through(4))})[0].find("being written"), std::string::npos);
}

TEST(HangDiagnosis, EveryRankEnteredSomeCompleted) {
  const auto done = done_through(57);
  const auto open = plus(done_through(56), rec(57, RecordState::started));
  const Diagnosis d = diagnose({rank(0, done), rank(1, done), rank(2, open), rank(3, done)});
  EXPECT_EQ(d.lines[0],
            "every rank entered all_reduce #57 (ddp bucket 3, 1.2 MB); ranks 0,1,3 completed it, "
            "rank 2 did not (rank 2 entered it and is not waiting for it yet)");
  EXPECT_EQ(d.suspects, std::vector<int>{2});
  // Two did not; the stopped one holds the other back.
  const Diagnosis s = diagnose({rank(0, done), waiting(rank(1, open), 57, 395),
                                stopped(waiting(rank(2, open), 57, 395)), rank(3, done)});
  EXPECT_EQ(s.lines[0],
            "every rank entered all_reduce #57 (ddp bucket 3, 1.2 MB); ranks 0,3 completed it, "
            "ranks 1,2 did not (rank 1 has waited 5.0 s in it; rank 2 is stopped by SIGSTOP "
            "inside it)");
  EXPECT_EQ(s.suspects, std::vector<int>{2});
}

TEST(HangDiagnosis, EveryRankEnteredNoneCompletedOneStopped) {
  const auto open = plus(done_through(56), rec(57, RecordState::started));
  const Diagnosis d =
      diagnose({waiting(rank(0, open), 57, 395), waiting(rank(1, open), 57, 395),
                stopped(waiting(rank(2, open), 57, 395)), waiting(rank(3, open), 57, 394)});
  EXPECT_EQ(d.lines[0],
            "every rank entered all_reduce #57 (ddp bucket 3, 1.2 MB) and none completed it: ranks "
            "0,1,3 have waited 5.0 s to 6.0 s in it; rank 2 is stopped by SIGSTOP inside it");
  EXPECT_EQ(d.lines.size(), 1u);
  EXPECT_EQ(d.suspects, std::vector<int>{2});
}

TEST(HangDiagnosis, FailedAndExitedRanksAreSaidSo) {
  const auto open = plus(done_through(56), rec(57, RecordState::started));
  RankSnapshot dead = rank(1, open);
  dead.process = ProcessState::exited;
  dead.process_detail = "killed by SIGKILL";
  const Diagnosis d =
      diagnose({rank(0, plus(done_through(56), rec(57, RecordState::failed))), dead},
               {.expected_ranks = {0, 1}});
  EXPECT_EQ(d.lines[0],
            "every rank entered all_reduce #57 (ddp bucket 3, 1.2 MB) and none completed it: rank "
            "0 failed in it; rank 1 exited (killed by SIGKILL) inside it");
  EXPECT_EQ(d.suspects, std::vector<int>{1});
}

// A collective the rank's own timeout ended (shm, gloo, mpi: state failed, timed_out
// set) reads as timed out, as the rank's error said, not as failed.
TEST(HangDiagnosis, ATimedOutRankIsSaidToHaveTimedOut) {
  auto ended = rec(6, RecordState::failed);
  ended.timed_out = true;
  const Diagnosis d = diagnose({rank(0, plus(done_through(5), ended), 2)});
  EXPECT_EQ(d.lines[0],
            "every rank with a dump entered all_reduce #6 (ddp bucket 3, 1.2 MB) and none "
            "completed it: rank 0 timed out in it");
}

TEST(HangDiagnosis, ASnapshotOfARunningJobIsNoHang) {
  // SIGUSR1 dumps of a healthy job: rank 1 is a collective ahead, rank 0 just
  // began to wait.
  const Diagnosis d =
      diagnose({waiting(rank(0, plus(done_through(9), rec(10, RecordState::started)), 2), 10, 400),
                rank(1, done_through(10), 2)});
  ASSERT_EQ(d.lines.size(), 2u);
  EXPECT_EQ(d.lines[1],
            "no rank has waited 1 s or more in a collective: a snapshot of a running job (a "
            "SIGUSR1 dump?), not a hang");
}

TEST(HangDiagnosis, AHealthyJobAndMissingRanks) {
  const auto done = done_through(9);
  Diagnosis d = diagnose({rank(0, done, 3), rank(1, done, 3), rank(2, done, 3)});
  ASSERT_EQ(d.lines.size(), 1u);
  EXPECT_EQ(d.lines[0],
            "no collective is pending or mismatched: every rank completed every collective it "
            "issued");
  EXPECT_TRUE(d.suspects.empty());
  d = diagnose({rank(0, done, 3), rank(2, done, 3)});
  ASSERT_EQ(d.lines.size(), 2u);
  EXPECT_EQ(d.lines[1], "rank 1: no dump; not part of this diagnosis");
}

TEST(HangDiagnosis, ARankWithoutADumpNeverTimedOut) {
  // mpirun: rank 0 timed out in #6 and dumped; rank 1 (stuck in its forward)
  // did not, and was killed when rank 0 exited.
  RankSnapshot r0 = waiting(rank(0, plus(done_through(5), rec(6, RecordState::failed)), 2), 6, 395);
  Diagnosis d = diagnose({r0});
  ASSERT_EQ(d.lines.size(), 2u);
  EXPECT_EQ(d.lines[0],
            "every rank with a dump entered all_reduce #6 (ddp bucket 3, 1.2 MB) and none "
            "completed it: rank 0 failed in it");
  EXPECT_EQ(d.lines[1],
            "rank 1: no dump; no collective timed out or failed on it, so it most likely never "
            "entered all_reduce #6 (ddp bucket 3, 1.2 MB) (stopped, stuck outside collectives, or "
            "killed first)");
  EXPECT_EQ(d.suspects, std::vector<int>{1});
  // ddprun's regions: a rank without one says nothing of where it is.
  d = diagnose({r0}, {.expected_ranks = {0, 1},
                      .missing_reason = "no flight recorder",
                      .missing_would_have_dumped = false});
  EXPECT_EQ(d.lines[1], "rank 1: no flight recorder; not part of this diagnosis");
  EXPECT_TRUE(d.suspects.empty());
}

TEST(HangDiagnosis, OneNodesViewOfALargerJob) {
  const auto open = plus(done_through(56), rec(57, RecordState::started));
  const Diagnosis d = diagnose({waiting(rank(2, open), 57, 100), waiting(rank(3, open), 57, 100)},
                               {.expected_ranks = {2, 3}, .other_ranks_elsewhere = true});
  ASSERT_EQ(d.lines.size(), 2u);
  EXPECT_EQ(d.lines[0],
            "every rank of this node entered all_reduce #57 (ddp bucket 3, 1.2 MB) and none "
            "completed it: ranks 2,3 have waited 300 s in it");
  EXPECT_EQ(d.lines[1].rfind("ranks 0,1 run on other nodes", 0), 0u) << d.lines[1];
  EXPECT_TRUE(d.suspects.empty());
  // Rank 0 completed it (gloo lets some ranks out early), rank 1 waits in it:
  // on one node of a larger world rank 1 waits for ranks elsewhere and is no
  // suspect (Note [hang on several nodes]); in the whole world it is.
  const auto done = plus(done_through(56), rec(57, RecordState::completed));
  const std::vector<RankSnapshot> node0 = {rank(0, done), waiting(rank(1, open), 57, 100)};
  const Diagnosis part = diagnose(node0, {.expected_ranks = {0, 1}, .other_ranks_elsewhere = true});
  EXPECT_EQ(part.lines[0],
            "every rank of this node entered all_reduce #57 (ddp bucket 3, 1.2 MB); rank 0 "
            "completed it, rank 1 did not (rank 1 has waited 300 s in it)");
  EXPECT_TRUE(part.suspects.empty());
  EXPECT_EQ(diagnose(node0, {.expected_ranks = {0, 1}}).suspects, std::vector<int>{1});
}

// Note [hang on several nodes]: node 1 answers node 0's hang; its rank 1 is stuck
// outside any collective. Its view holds nothing pending, yet it is no healthy
// job nor a running job's snapshot: the capture is for a hang.
TEST(HangDiagnosis, AHangAnsweredFromANodeStalledOutsideCollectives) {
  const DiagnosisOptions node1{.expected_ranks = {1}, .other_ranks_elsewhere = true, .hang = true};
  Diagnosis d = diagnose({rank(1, done_through(9), 2)}, node1);
  ASSERT_EQ(d.lines.size(), 2u);
  EXPECT_EQ(d.lines[0],
            "a hang, yet every rank of this node completed every collective it issued: rank 1 is "
            "stalled outside any collective (in compute, data loading or I/O) while ranks on "
            "other nodes wait in one for them");
  EXPECT_EQ(d.lines[1].rfind("rank 0 run on other nodes", 0), 0u) << d.lines[1];
  EXPECT_EQ(d.suspects, std::vector<int>{1});
  // Its bucket's all_reduce issued (asynchronously), not waited in yet.
  d = diagnose({rank(1, plus(done_through(9), rec(10, RecordState::started)), 2)}, node1);
  ASSERT_EQ(d.lines.size(), 3u);
  EXPECT_EQ(d.lines[2],
            "a hang, yet no rank of this node has waited 1 s or more in a collective: rank 1 is "
            "stalled outside any collective (in compute, data loading or I/O) while ranks on "
            "other nodes wait in one for them");
  for (const std::string& line : d.lines) {
    EXPECT_EQ(line.find("SIGUSR1"), std::string::npos) << line;
  }
  EXPECT_EQ(d.suspects, std::vector<int>{1});
  // Not for a hang (a failure elsewhere tore it down): as before.
  d = diagnose({rank(1, done_through(9), 2)},
               {.expected_ranks = {1}, .other_ranks_elsewhere = true});
  EXPECT_EQ(d.lines[0].rfind("no collective is pending or mismatched", 0), 0u) << d.lines[0];
  EXPECT_TRUE(d.suspects.empty());
}

TEST(HangDiagnosis, SeveralCommunicatorsAreNamed) {
  auto other = rec(3, RecordState::started);
  other.comm = 1;
  const auto r0 = plus(done_through(9), other);
  auto r1 = done_through(9);
  const Diagnosis d = diagnose({waiting(rank(0, r0, 2), 3, 390), rank(1, r1, 2)});
  ASSERT_FALSE(d.lines.empty());
  EXPECT_EQ(d.lines[0].rfind("rank 1 never entered all_reduce #3 of comm 1 (", 0), 0u)
      << d.lines[0];
}

TEST(HangDiagnosis, Formatting) {
  EXPECT_EQ(rank_list({3, 0, 1}), "ranks 0,1,3");
  EXPECT_EQ(rank_list({5, 0, 1, 2, 3}), "ranks 0-3,5");
  EXPECT_EQ(rank_list({2}), "rank 2");
  EXPECT_EQ(id_list({1, 2, 3, 5}, "node", "nodes"), "nodes 1-3,5");
  std::vector<int> even;
  for (int i = 0; i < 100; i += 2) even.push_back(i);
  EXPECT_EQ(id_list(even, "node", "nodes"), "nodes 0,2,4,6,8,10,12,14,16,18,20,22,... (50 in all)");
  EXPECT_EQ(human_bytes(1'200'000), "1.2 MB");
  EXPECT_EQ(human_bytes(4096), "4.1 KB");
  EXPECT_EQ(human_bytes(12), "12 B");
  CollectiveRecord barrier = rec(1, RecordState::started);
  barrier.kind = CollectiveKind::barrier;
  EXPECT_EQ(describe_shape(barrier), "barrier");
  CollectiveRecord reduce = rec(1, RecordState::started, "", 8);
  reduce.kind = CollectiveKind::reduce;
  reduce.op = ReduceOp::max;
  reduce.root = 2;
  EXPECT_EQ(describe_shape(reduce), "reduce(max, root 2) of 8 f32");
}

TEST(StragglerReport, NamesTheRankThatComputesLonger) {
  const StragglerReport r =
      straggler_report({{.rank = 0, .compute_s = 10.0, .wait_s = 3.1, .steps = 100},
                        {.rank = 1, .compute_s = 10.2, .wait_s = 3.0, .steps = 100},
                        {.rank = 2, .compute_s = 13.5, .wait_s = 0.1, .steps = 100},
                        {.rank = 3, .compute_s = 10.1, .wait_s = 3.2, .steps = 100}});
  EXPECT_EQ(r.stragglers, std::vector<int>{2});
  EXPECT_DOUBLE_EQ(r.median_compute_s, 10.15);
  EXPECT_NE(r.text.find("rank 2 computes 33% more than the median (13.5 s vs 10.1 s): the others "
                        "wait for it"),
            std::string::npos)
      << r.text;
  EXPECT_NE(r.text.find("over 100 steps"), std::string::npos) << r.text;
}

TEST(StragglerReport, NobodyWithinTenPercentOrAFewMilliseconds) {
  StragglerReport r = straggler_report({{.rank = 0, .compute_s = 10.0},
                                        {.rank = 1, .compute_s = 10.9},
                                        {.rank = 2, .compute_s = 10.5}});
  EXPECT_TRUE(r.stragglers.empty());
  EXPECT_NE(r.text.find("no rank computes more than 10% above the median"), std::string::npos)
      << r.text;
  // 50% above, but 10 ms in all: noise of a short run.
  r = straggler_report({{.rank = 0, .compute_s = 0.02}, {.rank = 1, .compute_s = 0.03}});
  EXPECT_TRUE(r.stragglers.empty());
  // Fewer than two ranks with figures: no report.
  EXPECT_EQ(straggler_report({{.rank = 0, .compute_s = 1}, {.rank = 1}}).text, "");
}

TEST(StragglerReport, AMedianOfZeroHasNoRatio) {
  const StragglerReport r = straggler_report({{.rank = 0, .compute_s = 0, .wait_s = 2},
                                              {.rank = 1, .compute_s = 0, .wait_s = 2},
                                              {.rank = 2, .compute_s = 1.5, .wait_s = 0.1}});
  EXPECT_EQ(r.stragglers, std::vector<int>{2});
  EXPECT_EQ(r.text.find("inf"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("rank 2 computes 1.5 s, the median 0: the others wait for it"),
            std::string::npos)
      << r.text;
}

TEST(StragglerReport, UnevenSharesCompareComputePerStep) {
  // Join (uneven data): ranks 0 and 3 trained 3 steps, ranks 1 and 2 ran out
  // after 2 (their shadowed steps are not marked). Per step they are equal.
  const StragglerReport even_pace =
      straggler_report({{.rank = 0, .compute_s = 0.30, .wait_s = 0.01, .steps = 3},
                        {.rank = 1, .compute_s = 0.20, .wait_s = 0.01, .steps = 2},
                        {.rank = 2, .compute_s = 0.20, .wait_s = 0.01, .steps = 2},
                        {.rank = 3, .compute_s = 0.30, .wait_s = 0.01, .steps = 3}});
  EXPECT_TRUE(even_pace.stragglers.empty()) << even_pace.text;
  EXPECT_TRUE(even_pace.per_step);
  EXPECT_NE(even_pace.text.find("over 2-3 steps, uneven shares: compute per step compared"),
            std::string::npos)
      << even_pace.text;
  EXPECT_NE(even_pace.text.find("compute per step 0.1 0.1 0.1 0.1 s"), std::string::npos)
      << even_pace.text;
  // A rank slow per step is still named, with per-step figures.
  const StragglerReport slow =
      straggler_report({{.rank = 0, .compute_s = 0.30, .wait_s = 0.5, .steps = 3},
                        {.rank = 1, .compute_s = 0.60, .wait_s = 0.0, .steps = 2},
                        {.rank = 2, .compute_s = 0.20, .wait_s = 0.5, .steps = 2}});
  EXPECT_EQ(slow.stragglers, std::vector<int>{1});
  EXPECT_NE(slow.text.find("rank 1 computes 200% more than the median (0.3 s vs 0.1 s per step)"),
            std::string::npos)
      << slow.text;
  // Even shares: totals, as before.
  EXPECT_FALSE(straggler_report({{.rank = 0, .compute_s = 1, .steps = 2},
                                 {.rank = 1, .compute_s = 1, .steps = 2}})
                   .per_step);
}

// Note [straggler report after a failure]: rank 1 stalled outside collectives (its
// stall is in no figure), rank 0 computed one more step before it waited; the
// teardown left their step counts one apart.
TEST(StragglerReport, AfterAHangNamesOnlyTheBlamedRank) {
  const std::vector<RankActivity> hung = {
      {.rank = 0, .compute_s = 1.23, .wait_s = 0.1, .steps = 5},
      {.rank = 1, .compute_s = 1.00, .wait_s = 0.1, .steps = 5}};
  EXPECT_EQ(straggler_report(hung).stragglers, std::vector<int>{0});  // a healthy run's verdict
  const StragglerOptions blamed_1{.after_failure = true, .blamed = {1}};
  StragglerReport r = straggler_report(hung, blamed_1);
  EXPECT_TRUE(r.stragglers.empty()) << r.text;
  EXPECT_EQ(r.text.find("wait for it"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("straggler report up to the failure (a stalled rank's stall is in no "
                        "figure) (ranks 0,1, over 5 steps)"),
            std::string::npos)
      << r.text;
  EXPECT_NE(r.text.find("no rank named: the figures end before the failure"), std::string::npos)
      << r.text;
  // The blamed rank is named when its figures show it.
  r = straggler_report(hung, {.after_failure = true, .blamed = {0}});
  EXPECT_EQ(r.stragglers, std::vector<int>{0});
  EXPECT_NE(r.text.find("rank 0 computes 10% more than the median"), std::string::npos) << r.text;
  // A SIGSTOP teardown: one rank one step behind is no uneven share.
  const std::vector<RankActivity> cut = {{.rank = 0, .compute_s = 0.40, .wait_s = 0.1, .steps = 5},
                                         {.rank = 1, .compute_s = 0.32, .wait_s = 0.1, .steps = 4}};
  r = straggler_report(cut, blamed_1);
  EXPECT_EQ(r.text.find("uneven shares"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("over 4-5 steps, compute per step compared"), std::string::npos) << r.text;
  // Two steps apart, it is.
  r = straggler_report(
      {{.rank = 0, .compute_s = 0.6, .steps = 6}, {.rank = 1, .compute_s = 0.4, .steps = 4}},
      blamed_1);
  EXPECT_NE(r.text.find("uneven shares"), std::string::npos) << r.text;
}

// A replacement that joined late (--on-failure continue) marked few steps, the first
// of them slow with its process's warm-up: per step it looked 6x slower. Without the
// first steps the ranks compute alike.
TEST(StragglerReport, ALateJoinersWarmUpStepIsNotStraggling) {
  const auto rank = [](int r, int64_t steps, int64_t first_ns) {
    RankStatus s;
    s.steps = steps;
    s.first_step_ns = first_ns;
    s.step_ns = first_ns + (steps - 1) * (kS / 10);  // 0.1 s per later step
    return activity_of(r, s);
  };
  const StragglerReport r = straggler_report(
      {rank(0, 40, kS / 5), rank(1, 40, kS / 5), rank(2, 4, 3 * kS), rank(3, 40, kS / 5)});
  EXPECT_TRUE(r.stragglers.empty()) << r.text;
  // Counted with its first step, rank 2 would be named.
  RankStatus whole;
  whole.steps = 4;
  whole.step_ns = 3 * kS + 3 * (kS / 10);
  const StragglerReport counted =
      straggler_report({rank(0, 40, kS / 5), rank(1, 40, kS / 5), activity_of(2, whole)});
  EXPECT_EQ(counted.stragglers, std::vector<int>{2}) << counted.text;
}

TEST(StragglerReport, FiguresFromStepMarksOrTheSpan) {
  RankStatus s;
  s.steps = 10;
  s.step_ns = 5 * kS;
  s.step_blocked_ns = 2 * kS;
  s.first_ns = 1 * kS;
  s.last_ns = 100 * kS;  // the span is ignored when there are steps
  RankActivity a = activity_of(3, s);
  EXPECT_EQ(a.rank, 3);
  EXPECT_DOUBLE_EQ(a.compute_s, 3.0);
  EXPECT_DOUBLE_EQ(a.wait_s, 2.0);
  EXPECT_EQ(a.steps, 10);
  // With the first step known, it is left out (its warm-up).
  s.first_step_ns = 2 * kS;
  s.first_step_blocked_ns = kS / 2;
  a = activity_of(3, s);
  EXPECT_DOUBLE_EQ(a.compute_s, 1.5);
  EXPECT_DOUBLE_EQ(a.wait_s, 1.5);
  EXPECT_EQ(a.steps, 10);
  EXPECT_EQ(a.counted_steps(), 9);
  // A single step is all there is: kept.
  s.steps = 1;
  s.step_ns = s.first_step_ns;
  s.step_blocked_ns = s.first_step_blocked_ns;
  a = activity_of(3, s);
  EXPECT_DOUBLE_EQ(a.compute_s, 1.5);
  EXPECT_EQ(a.counted_steps(), 1);
  s.first_step_ns = s.first_step_blocked_ns = 0;
  s.steps = 0;
  s.blocked_ns = 40 * kS;
  a = activity_of(3, s);
  EXPECT_DOUBLE_EQ(a.compute_s, 59.0);
  EXPECT_DOUBLE_EQ(a.wait_s, 40.0);
}

}  // namespace
}  // namespace ddp::flight
