// The timeline's files and the collective observer's records (Note [trace
// files], Note [timeline collectives]): restarts keep their own files, the
// files are valid UTF-8 whatever the names, a failed write names its reason and
// leaves no temporary, and collectives' flow arrows are distinct and land on
// the right tracks.
#include "collectives/collective_events.h"
#include "collectives/trace_collectives.h"
#include "runtime/trace.h"
#include "runtime/trace/clock.h"
#include "runtime/trace/file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

namespace ddp::trace {
namespace {

namespace fs = std::filesystem;

RankInfo rank_info_of(int rank, const std::string& run_id, int restart) {
  RankInfo info;
  info.rank = rank;
  info.world_size = rank + 1;
  info.run_id = run_id;
  info.restart = restart;
  return info;
}

class TraceFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("ddp_trace_file_test_{}_{}", ::getpid(), std::random_device{}());
    fs::create_directories(dir_);
    start({.dir = dir_.string(), .max_events = 1000, .handle_signals = false});
  }
  void TearDown() override {
    start({.dir = "", .max_events = 1000, .handle_signals = false});  // no file at exit
    stop();
    fs::remove_all(dir_);
  }
  static std::string read(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  fs::path dir_;
};

// ddprun --max-restarts: the failed attempt's files stay; the merge takes the last.
TEST_F(TraceFileTest, RestartsKeepFilesOfTheirOwn) {
  EXPECT_EQ(rank_file_name(3), "rank_3.json");
  EXPECT_EQ(rank_file_name(3, 2), "rank_3_restart2.json");
  set_rank_info(rank_info_of(0, "r", 0));
  instant("attempt 0", "test");
  const std::string first = write_file();
  set_rank_info(rank_info_of(0, "r", 1));
  instant("attempt 1", "test");
  const std::string second = write_file();
  EXPECT_NE(first, second);
  EXPECT_TRUE(fs::exists(first));
  EXPECT_TRUE(fs::exists(second));
  EXPECT_EQ(parse_rank_file(read(first), first).rank.restart, 0);
  const MergeReport last = merge_trace_dir(dir_.string());
  EXPECT_EQ(last.restart, 1);
  EXPECT_EQ(last.ranks, std::vector<int>{0});
  const MergeReport failed = merge_trace_dir(
      dir_.string(),
      {.run_id = "r", .restart = 0, .expected_ranks = 0, .output = (dir_ / "r0.json").string()});
  EXPECT_EQ(failed.restart, 0);
  EXPECT_EQ(failed.ranks, std::vector<int>{0});
}

// A rank's file cut short is unreadable, not missing: the merge's summary names it so
// and never as a rank that wrote no trace.
TEST_F(TraceFileTest, AnUnreadableRankFileIsNotAMissingOne) {
  RankInfo info = rank_info_of(0, "r", 0);
  info.world_size = 3;
  set_rank_info(info);
  instant("step", "test");
  write_file();
  std::ofstream(dir_ / "rank_1.json") << "{\"traceEvents\": [{\"name\": \"st";
  const MergeReport report = merge_trace_dir(dir_.string());
  EXPECT_EQ(report.ranks, std::vector<int>{0});
  EXPECT_EQ(report.unreadable, std::vector<int>{1});
  EXPECT_EQ(report.missing, std::vector<int>{2});
  ASSERT_EQ(report.skipped.size(), 1u);
  EXPECT_NE(report.skipped[0].find("rank_1.json"), std::string::npos) << report.skipped[0];
  const std::string text = describe(report);
  EXPECT_NE(text.find("; the trace file of rank(s) 1 is unreadable, left out"), std::string::npos)
      << text;
  EXPECT_NE(text.find("; no trace from rank(s) 2 (killed"), std::string::npos) << text;
  // An unreadable file of another restart says nothing of this one's rank 1.
  fs::rename(dir_ / "rank_1.json", dir_ / "rank_1_restart3.json");
  EXPECT_EQ(merge_trace_dir(dir_.string()).missing, (std::vector<int>{1, 2}));
}

bool is_valid_utf8(std::string_view text) {
  return valid_utf8(text) == text;
}

TEST(TraceUtf8, InvalidBytesBecomeReplacementCharacters) {
  EXPECT_EQ(valid_utf8("plain"), "plain");
  EXPECT_EQ(valid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(valid_utf8("a\xff"
                       "b"),
            "a\xef\xbf\xbd"
            "b");
  EXPECT_EQ(valid_utf8("cut \xe2\x82"), "cut \xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(valid_utf8("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");                  // overlong '/'
  EXPECT_EQ(valid_utf8("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // a surrogate
}

TEST_F(TraceFileTest, FilesAreValidUtf8WhateverTheNames) {
  set_rank_info(rank_info_of(1, "r\xff", 0));
  instant("bad \xfe\xff name", "test");
  name_thread("thread \xc3");
  const std::string path = write_file();
  const std::string text = read(path);
  EXPECT_TRUE(is_valid_utf8(text));
  EXPECT_NE(text.find("bad \xef\xbf\xbd\xef\xbf\xbd name"), std::string::npos) << text;
  std::ostringstream merged;
  write_chrome_trace(merged, {parse_rank_file(text, path)});
  EXPECT_TRUE(is_valid_utf8(merged.str()));
}

// A collective's label and slice names are cut at a character boundary.
TEST_F(TraceFileTest, LongLabelsAreCutAtACharacterBoundary) {
  attach_trace_observer();
  std::string label(kMaxLabelBytes - 1, 'x');
  label += "\xc3\xa9\xc3\xa9";  // é straddles kMaxLabelBytes
  CollectiveInfo info{.backend = "shm", .kind = CollectiveKind::all_reduce};
  {
    const CollectiveLabel labelled(label);
    EXPECT_TRUE(is_valid_utf8(current_collective_label()));
    EXPECT_EQ(current_collective_label(), std::string(kMaxLabelBytes - 1, 'x'));
    // The observer's "enqueue all_reduce (<label>)" exceeds kMaxNameBytes.
    info.label = std::string(30, 'y').append("\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac");
    notify_collective(info, CollectiveState::enqueued);
  }
  bool found = false;
  for (const TraceEvent& e : snapshot().events) {
    if (!e.name.starts_with("enqueue all_reduce (yyy")) continue;
    found = true;
    EXPECT_TRUE(is_valid_utf8(e.name)) << e.name;
    EXPECT_LE(e.name.size(), kMaxNameBytes);
  }
  EXPECT_TRUE(found);
}

// /dev/full behind the temporary: the write fails with the system's reason, and
// the temporary is gone.
TEST_F(TraceFileTest, AFailedWriteNamesTheReasonAndLeavesNoTemporary) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this machine";
  const fs::path target = dir_ / "out.json";
  const fs::path temporary = dir_ / fmt::format("out.json.tmp.{}", ::getpid());
  fs::create_symlink("/dev/full", temporary);
  try {
    write_atomically(target.string(), [](std::ostream& out) {
      for (int i = 0; i < 100000; ++i) out << "0123456789";
    });
    FAIL() << "writing into /dev/full succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(fs::symlink_status(temporary))) << "the temporary was left behind";
  EXPECT_FALSE(fs::exists(target));
  write_atomically(target.string(), [](std::ostream& out) { out << "ok"; });
  EXPECT_EQ(read(target), "ok");
}

// Flow ids of collectives: distinct for communicators and sequence numbers that
// agree in their low bits.
TEST_F(TraceFileTest, CollectiveFlowIdsAreDistinct) {
  attach_trace_observer();
  std::set<uint64_t> ids;
  int enqueues = 0;
  for (int comm : {0, 128, 1 << 20}) {
    for (int64_t seq :
         {int64_t{5}, int64_t{5} + (int64_t{1} << 24), int64_t{5} + (int64_t{1} << 32)}) {
      const CollectiveInfo info{.comm_id = comm,
                                .backend = "gloo",
                                .kind = CollectiveKind::broadcast,
                                .sequence = seq,
                                .label = "flow ids"};
      notify_collective(info, CollectiveState::enqueued);
    }
  }
  for (const TraceEvent& e : snapshot().events) {
    if (e.name != "enqueue broadcast (flow ids)") continue;
    ++enqueues;
    EXPECT_TRUE(e.flow.out);
    ids.insert(e.flow.id);
  }
  EXPECT_EQ(enqueues, 9);
  EXPECT_EQ(ids.size(), 9u);
}

// An nccl collective that failed before it was seen starting (a launch NCCL
// refused) is marked on its stream's track, not on the thread that told it.
TEST_F(TraceFileTest, AnNcclFailureBeforeTheStartLandsOnTheStreamTrack) {
  attach_trace_observer();
  const CollectiveInfo info{
      .comm_id = 77, .backend = "nccl", .kind = CollectiveKind::all_gather, .sequence = 3};
  notify_collective(info, CollectiveState::enqueued);
  notify_collective(info, CollectiveState::failed);
  const Snapshot s = snapshot();
  const TraceEvent* failed = nullptr;
  for (const TraceEvent& e : s.events) {
    if (e.name == "failed: all_gather") failed = &e;
  }
  ASSERT_NE(failed, nullptr);
  std::string track;
  for (const TrackInfo& t : s.tracks) {
    if (t.id == failed->track) track = t.name;
  }
  EXPECT_EQ(track, "nccl stream (comm 77)");
}

// start() forgets every track: the observer's cached stream tracks must follow.
TEST_F(TraceFileTest, AnotherStartMakesTheStreamTracksAnew) {
  attach_trace_observer();
  CollectiveInfo info{.comm_id = 78, .backend = "nccl", .kind = CollectiveKind::barrier};
  for (int round = 0; round < 2; ++round) {
    start({.dir = dir_.string(), .max_events = 1000, .handle_signals = false});
    info.sequence = round;
    notify_collective(info, CollectiveState::started, 100);
    notify_collective(info, CollectiveState::completed, 200);
    const Snapshot s = snapshot();
    ASSERT_EQ(s.events.size(), 1u) << "round " << round;
    std::string track = "none";
    for (const TrackInfo& t : s.tracks) {
      if (t.id == s.events[0].track) track = t.name;
    }
    EXPECT_EQ(track, "nccl stream (comm 78)") << "round " << round;
  }
}

// The merge maps every record through the clock samples, sorted once.
TEST(TraceClockMap, MapsLikeOffsetAt) {
  const std::vector<ClockSample> samples = {
      {.local_ns = 3000, .offset_ns = 400, .error_ns = 0, .reference = "a"},
      {.local_ns = 1000, .offset_ns = 200, .error_ns = 0, .reference = "a"},
      {.local_ns = 2000, .offset_ns = 100, .error_ns = 0, .reference = "a"}};
  const ClockMap map(samples);
  for (int64_t t : {0, 1000, 1500, 2000, 2500, 3000, 9000}) {
    EXPECT_EQ(map.offset_at(t), offset_at(samples, t)) << t;
  }
  EXPECT_EQ(map.offset_at(1500), 150);
  EXPECT_EQ(map.offset_at(2500), 250);
  EXPECT_EQ(ClockMap({}).offset_at(5), 0);
}

}  // namespace
}  // namespace ddp::trace
