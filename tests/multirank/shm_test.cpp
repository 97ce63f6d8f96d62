// What only the shm backend promises: its segment's name, its lifetime in
// /dev/shm (Note [shm cleanup]) and its attach errors. The collectives themselves
// are tested by the conformance suite.
#include "collectives/backends.h"
#include "collectives/collective_events.h"
#include "collectives/ddp/hook_communicator.h"
#include "collectives/shm_segment.h"
#include "tests/multirank/conformance.h"
#include "tests/multirank/spawn.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

// A namespace of its own: helpers named as in other files of the unity build (Note
// [unity test builds] in tests/CMakeLists.txt).
namespace ddp::test::shm_test {
namespace {

using namespace std::chrono_literals;

bool segment_exists(const std::string& run_id) {
  struct stat st {};
  return stat(("/dev/shm" + shm::segment_name(run_id)).c_str(), &st) == 0;
}

int all_reduce_once(const std::string& run_id, int rank, int size, CommOptions comm) {
  auto c = make_shm_communicator(
      {.rank = rank, .size = size, .run_id = run_id, .comm = comm, .abandon = {}});
  Tensor t = make_input(DType::f32, 100, rank);
  c->all_reduce(t)->wait();
  expect_values(
      t, [&](int64_t i) { return reduced_value(ReduceOp::sum, size, i); }, "sum");
  return 0;
}

// Const inputs (collectives/communicator.h): root broadcasts a const tensor,
// every rank all_gathers a temporary; the values arrive on every rank.
TEST(ShmCommunicator, ConstAndTemporaryInputsAreSent) {
  const auto results = spawn_ranks(2, [](int rank, int size) {
    auto c = make_backend("shm", rank, size, {.timeout = 20s});
    const Tensor sent = from_vector<float>({7, 8}, {2});
    Tensor received = zeros({2});
    if (rank == 0) {
      c->broadcast(sent, 0)->wait();
    } else {
      c->broadcast(received, 0)->wait();
      require(received.to_vector<float>() == std::vector<float>{7, 8},
              "a Tensor& receives the root's const tensor");
    }
    Tensor all = zeros({2 * size});
    c->all_gather(full({2}, rank + 1.0), all)->wait();
    require(all.to_vector<float>() == std::vector<float>{1, 1, 2, 2}, "all_gather of a temporary");
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

// Fails the rank unless `fn` throws a ValueError whose message has `want`.
void require_value_error(const std::function<void()>& fn, const std::string& want,
                         const std::string& what) {
  try {
    fn();
  } catch (const ValueError& e) {
    require(std::string(e.what()).find(want) != std::string::npos,
            what + ": message lacks '" + want + "': " + e.what());
    return;
  }
  require(false, what + ": no ValueError");
}

// Note [broadcast overloads]: off the root, the const overload would receive
// into a temporary and lose the data, so it is refused before it takes a
// sequence number, directly and through the hook's communicator; the Tensor&
// overload then receives.
TEST(ShmCommunicator, ConstBroadcastOffTheRootIsRefused) {
  const auto results = spawn_ranks(2, [](int rank, int size) {
    auto shm = make_backend("shm", rank, size, {.timeout = 20s});
    for (const std::shared_ptr<Communicator>& c :
         {shm, std::shared_ptr<Communicator>(std::make_shared<HookCommunicator>(shm))}) {
      Tensor t = rank == 0 ? from_vector<float>({7, 8}, {2}) : zeros({2});
      if (rank == 1) {
        const int64_t sequence = c->next_sequence();
        const std::string want =
            "rank 1 passed a const tensor or a temporary, but only the "
            "root (rank 0) sends";
        require_value_error([&] { c->broadcast(t.clone(), 0); }, want, "a temporary");
        const Tensor& constant = t;
        require_value_error([&] { c->broadcast(constant, 0); }, want, "a const tensor");
        require(c->next_sequence() == sequence, "a refused broadcast took a sequence number");
        c->broadcast(t, 0)->wait();
      } else {
        c->broadcast(t.clone(), 0)->wait();  // the root may send a temporary
      }
      require(t.to_vector<float>() == std::vector<float>{7, 8}, "broadcast into a Tensor&");
    }
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

TEST(ShmSegment, NameIsSanitised) {
  EXPECT_EQ(shm::segment_name("job-42_a.b"), "/ddp-shm-job-42_a.b");
  EXPECT_EQ(shm::segment_name("a/b c:d"), "/ddp-shm-a_b_c_d");
  EXPECT_LE(shm::segment_name(std::string(1000, 'x')).size(), 255u);
}

TEST(ShmSegment, LayoutFitsSmallShmMounts) {
  for (int size : {1, 2, 4, 8, 64}) {
    const auto layout = shm::SegmentLayout::for_size(size);
    EXPECT_EQ(layout.data_offset % 4096, 0u) << size;
    EXPECT_GE(layout.slot_bytes, size_t{64} << 10) << size;
    EXPECT_LE(layout.total_bytes, size_t{40} << 20) << "docker's default /dev/shm is 64 MiB";
  }
}

TEST(ShmCommunicator, EmptyRunIdIsAnError) {
  EXPECT_THROW(
      make_shm_communicator({.rank = 0, .size = 2, .run_id = "", .comm = {}, .abandon = {}}),
      ValueError);
}

TEST(ShmCommunicator, NothingLeftInDevShmAfterARun) {
  const SpawnOptions spawn{.run_id = unique_run_id()};
  const auto results = spawn_ranks(
      3,
      [&](int rank, int size) {
        auto comm = make_shm_communicator({.rank = rank,
                                           .size = size,
                                           .run_id = spawn.run_id,
                                           .comm = {.timeout = 20s},
                                           .abandon = {}});
        // Every rank attached, so the name is gone while the group still works.
        require(!segment_exists(spawn.run_id), "the segment name outlived the attach");
        comm->barrier()->wait();
        return 0;
      },
      spawn);
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
  EXPECT_FALSE(segment_exists(spawn.run_id));
}

TEST(ShmCommunicator, StaleSegmentOfACrashedRunIsReplaced) {
  const SpawnOptions spawn{.run_id = unique_run_id()};
  const std::string name = shm::segment_name(spawn.run_id);
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);  // as a crashed rank 0 left it
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 1 << 20), 0);
  close(fd);
  const auto results = spawn_ranks(
      2,
      [&](int rank, int size) {
        return all_reduce_once(spawn.run_id, rank, size, {.timeout = 20s});
      },
      spawn);
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
  EXPECT_FALSE(segment_exists(spawn.run_id));
}

// Rank 2 never attaches: the others fail at the timeout naming it, and rank 0 removes the segment.
TEST(ShmCommunicator, RankThatNeverAttachesIsNamed) {
  const SpawnOptions spawn{.run_id = unique_run_id()};
  const auto results = spawn_ranks(
      3,
      [&](int rank, int size) {
        if (rank == 2) return 0;
        try {
          make_shm_communicator({.rank = rank,
                                 .size = size,
                                 .run_id = spawn.run_id,
                                 .comm = {.timeout = 1s},
                                 .abandon = {}});
        } catch (const CommTimeoutError& e) {
          const std::string text = e.what();
          require(text.find("rank 2 did not attach") != std::string::npos &&
                      text.find(shm::segment_name(spawn.run_id)) != std::string::npos,
                  "unexpected message: " + text);
          // Stay a while: the other waiting rank must time out too, not see this one exit
          // first (either of ranks 0 and 1 may reach its deadline first).
          std::this_thread::sleep_for(500ms);
          return 0;
        }
        throw std::runtime_error("the group formed without rank 2");
      },
      spawn);
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
  EXPECT_FALSE(segment_exists(spawn.run_id));
}

// Note [caller runs it]: a collective issued under CallerRuns is left to its
// waiter (the sleeping communication thread is not woken: it has not run 300 ms
// later, though rank 1 waits for it), and one never waited for runs when a later
// collective wakes the communication thread.
TEST(ShmCommunicator, CallerRunsLeavesTheCollectiveToItsWaiter) {
  const auto results = spawn_ranks(2, [](int rank, int size) {
    auto c = make_backend("shm", rank, size, {.timeout = 20s});
    Tensor t = make_input(DType::f32, 1000, rank);
    Tensor u = make_input(DType::f32, 1000, rank);
    // Let the communication thread go to sleep: one that is awake (starting, or
    // back from a collective) takes what is queued without being woken.
    c->barrier()->wait();
    std::this_thread::sleep_for(200ms);
    if (rank == 1) {
      c->all_reduce(t)->wait();
      c->all_reduce(u)->wait();
      c->all_reduce(t)->wait();
    } else {
      std::shared_ptr<Work> first;
      {
        const CallerRuns caller_runs;
        first = c->all_reduce(t);
      }
      std::this_thread::sleep_for(300ms);
      require(!first->done(), "the communication thread ran a collective issued under CallerRuns");
      first->wait();
      std::shared_ptr<Work> never_waited;
      {
        const CallerRuns caller_runs;
        never_waited = c->all_reduce(u);
      }
      std::this_thread::sleep_for(100ms);
      c->all_reduce(t)->wait();  // wakes the communication thread: it runs both, in order
      require(never_waited->done(), "the collective issued under CallerRuns never ran");
      never_waited->wait();
    }
    expect_values(
        u, [&](int64_t i) { return reduced_value(ReduceOp::sum, size, i); }, "sum");
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

// More ranks than cores: waiting must yield the CPU, or this takes seconds.
TEST(ShmCommunicator, OversubscribedRanksMakeProgress) {
  const auto results =
      spawn_ranks(6,
                  [](int rank, int size) {
                    auto comm = make_backend("shm", rank, size, {.timeout = 20s});
                    Tensor t = make_input(DType::f32, 1024, rank);
                    for (int i = 0; i < 200; ++i) comm->all_reduce(t, ReduceOp::max)->wait();
                    expect_values(
                        t, [&](int64_t i) { return reduced_value(ReduceOp::max, size, i); }, "max");
                    return 0;
                  },
                  {.timeout = 20s});
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

// Note [gone before arriving]: rank 1 waits for rank 0, which arrives 35 ms
// late, completes the all_reduce (one small chunk: no second phase) and leaves
// the communicator at once. Rank 1's check of its late peers (its first at
// about 11 ms), slowed down by 60 ms after it saw rank 0's counter short, must
// still see an arrival, not a departure: the collective completes on rank 1
// too. Without the second read of the counter it fails, naming rank 0 as a rank
// "which left the communicator" before arriving.
TEST(ShmCommunicator, PeerThatArrivesThenLeavesIsNotGone) {
  const auto results = spawn_ranks(2, [](int rank, int size) {
    ::setenv("DDP_TEST_SHM_CHECK_DELAY_MS", "60", 1);  // read at the first check
    auto comm = make_backend("shm", rank, size, {.timeout = 20s});
    Tensor t = make_input(DType::f32, 100, rank);
    if (rank == 0) std::this_thread::sleep_for(35ms);  // rank 1 checks every 10 ms
    comm->all_reduce(t)->wait();
    expect_values(
        t, [&](int64_t i) { return reduced_value(ReduceOp::sum, size, i); }, "sum");
    return 0;  // rank 0's communicator goes now: it sets `left`
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

// Rank 0 arrives, times out waiting for rank 1 (1 s) and leaves the communicator;
// rank 1 arrives only once it has left (a file says so). Rank 0 did arrive: rank 1
// is told that it left without completing the collective, not that it "exited
// before arriving" (which a rank that finished its collectives is still told).
TEST(ShmCommunicator, PeerThatTimedOutIsNamedAsLeftNotAsNeverArrived) {
  const std::string gone = ::testing::TempDir() + "/shm_left_" + unique_run_id();
  const auto results = spawn_ranks(2, [&](int rank, int size) {
    auto comm = make_backend("shm", rank, size, {.timeout = 1s});
    Tensor t = make_input(DType::f32, 1 << 20, rank);
    if (rank == 1) {
      for (int i = 0; i < 600 && !std::filesystem::exists(gone); ++i)
        std::this_thread::sleep_for(50ms);
      require(std::filesystem::exists(gone), "rank 0 never left");
    }
    try {
      comm->all_reduce(t)->wait();
    } catch (const CommError& e) {
      const std::string text = e.what();
      if (rank == 0) {  // its own timeout: its communicator goes (`left`), then it says so
        comm.reset();
        std::ofstream{gone} << "left\n";
        return 0;
      }
      require(
          text.find("rank 0 (pid ") != std::string::npos &&
              text.find(
                  "arrived at this collective but left the communicator without completing it") !=
                  std::string::npos &&
              text.find("exited before arriving") == std::string::npos,
          "rank 1's message: " + text);
      return 0;
    }
    throw std::runtime_error("the all_reduce completed though rank 0 gave up on it");
  });
  std::filesystem::remove(gone);
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

}  // namespace
}  // namespace ddp::test::shm_test
