// The gloo backend's own tests. Its collectives run the shared Conformance suite
// (conformance_test.cpp, instantiated for gloo 2, 3 and 4); here are its fault
// behaviour, which differs from the shared fault tests because gloo's errors name
// a socket, not the failed rank (a killed rank fails the peers promptly, a
// stopped rank gives a CommTimeoutError or "connection closed", mismatched
// collectives are caught with DDP_DEBUG=detail), and its construction errors.
#include "collectives/backends.h"
#include "collectives/store/tcp_store.h"
#include "runtime/env.h"
#include "tests/multirank/conformance.h"
#include "tests/multirank/spawn.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <thread>

// A namespace of its own: helpers named as in other files of the unity build (Note
// [unity test builds] in tests/CMakeLists.txt).
namespace ddp::test::gloo_conformance_test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const CommOptions kFaultComm{.timeout = 2s};

class GlooFaults : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }
};

// ---- faults: a prompt, typed error, never a hang ------------------------------------------

struct Failure {
  bool timed_out = false;  // a CommTimeoutError
  double seconds = 0.0;    // from the call to the throw
  std::string text;
};

// Runs the collective, which must throw a CommError of the gloo backend naming the sequence.
Failure expect_comm_error(const std::function<void()>& collective) {
  const auto start = Clock::now();
  try {
    collective();
  } catch (const CommError& e) {
    Failure f{dynamic_cast<const CommTimeoutError*>(&e) != nullptr,
              std::chrono::duration<double>(Clock::now() - start).count(), e.what()};
    require(f.text.find("on the gloo backend") != std::string::npos && e.sequence() >= 0,
            "the error does not name the backend and sequence: " + f.text);
    return f;
  }
  throw std::runtime_error("the collective succeeded although a rank was faulty");
}

const double kFaultLimit = std::chrono::duration<double>(kFaultComm.timeout).count();

TEST_P(GlooFaults, KilledRankFailsThePeers) {
  const auto results = spawn_ranks(world(), [&](int rank, int size) {
    auto comm = make_backend("gloo", rank, size, kFaultComm);
    Tensor t = make_input(DType::f32, 1023, rank);
    comm->all_reduce(t)->wait();  // the group works before the fault
    if (rank == 1) inject_fault(Fault::kill);
    const Failure f = expect_comm_error([&] { comm->all_reduce(t)->wait(); });
    require(!f.timed_out && f.seconds < kFaultLimit / 2,
            fmt::format("expected a prompt CommError, got after {:.2f} s: {}", f.seconds, f.text));
    // Broken after the first failure: the next collective fails at once.
    const auto start = Clock::now();
    expect_comm_error([&] { comm->barrier()->wait(); });
    require(Clock::now() - start < 100ms, "a broken communicator did not fail at once");
    return 0;
  });
  EXPECT_EQ(results[1].signal, SIGKILL) << results[1].describe();
  for (const RankResult& r : results) {
    if (r.rank != 1) {
      EXPECT_TRUE(r.ok()) << r.describe();
    }
  }
}

// Note [gloo timeout spread]: the ranks waiting on the stopped one time out; gloo
// then closes their connections, so a rank that waited on one of them may see
// "connection closed" (a CommError) at the same moment instead of its own timeout.
TEST_P(GlooFaults, StoppedRankTimesOut) {
  constexpr int kTimedOut = 0, kClosed = 10;  // exit codes of the ranks that were not stopped
  SpawnOptions spawn;
  for (int r = 0; r < world(); ++r) {
    if (r != 1) spawn.wait_for.push_back(r);  // then SIGKILL the stopped rank 1
  }
  const auto results = spawn_ranks(
      world(),
      [&](int rank, int size) {
        auto comm = make_backend("gloo", rank, size, kFaultComm);
        if (rank == 1) inject_fault(Fault::stop);
        Tensor t = make_input(DType::f32, 1023, rank);
        // gloo gives up before Work::wait does (Note [gloo deadline]): its error arrives.
        const Failure f = expect_comm_error([&] { comm->all_reduce(t)->wait(); });
        require(f.seconds > kFaultLimit * 0.8 && f.seconds < kFaultLimit * 3,
                fmt::format("expected the failure after about {:.1f} s, got it after {:.2f} s: {}",
                            kFaultLimit, f.seconds, f.text));
        return f.timed_out ? kTimedOut : kClosed;
      },
      spawn);
  EXPECT_TRUE(results[1].killed_by_harness) << results[1].describe();
  int timed_out = 0;
  for (const RankResult& r : results) {
    if (r.rank == 1) continue;
    EXPECT_TRUE(r.signal == 0 && (r.exit_code == kTimedOut || r.exit_code == kClosed))
        << r.describe();
    timed_out += r.exit_code == kTimedOut ? 1 : 0;
  }
  EXPECT_GE(timed_out, 1) << "no rank reported a CommTimeoutError";
  if (world() == 2) {
    EXPECT_EQ(results[0].exit_code, kTimedOut) << results[0].describe();
  }
}

// Rank 1 broadcasts while the others all-reduce: DDP_DEBUG=detail fails every rank.
TEST_P(GlooFaults, MismatchFailsWithDebugDetail) {
  const auto results = spawn_ranks(
      world(),
      [&](int rank, int size) {
        auto comm = make_backend("gloo", rank, size, kFaultComm);
        Tensor t = make_input(DType::f32, 7, rank);
        try {
          (rank == 1 ? comm->broadcast(t, 0) : comm->all_reduce(t))->wait();
        } catch (const CommError& e) {
          require(std::string(e.what()).find("collective mismatch") != std::string::npos,
                  std::string("expected 'collective mismatch', got: ") + e.what());
          return 0;
        }
        throw std::runtime_error("mismatched collectives succeeded");
      },
      {.env = {{"DDP_DEBUG", "detail"}}});
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

// Note [gloo mismatch]: without DDP_DEBUG, rank 1 all-reduces 10x the elements
// of the others. gloo notices in its network thread; the rank that notices
// exits 1 with our message (not SIGABRT with gloo's line), and no rank hangs.
TEST_P(GlooFaults, MismatchWithoutDebugIsNamedInOurWords) {
  const auto results =
      spawn_ranks(world(),
                  [&](int rank, int size) {
                    auto comm = make_backend("gloo", rank, size, kFaultComm);
                    comm->barrier()->wait();  // every rank connected: the failure is the mismatch's
                    Tensor t = make_input(DType::f32, rank == 1 ? 70 : 7, rank);
                    try {
                      comm->all_reduce(t)->wait();
                    } catch (const CommError& e) {
                      return 5;  // a rank whose peer exited: "connection reset", "timed out"
                    }
                    return 0;
                  },
                  {.env = {{"DDP_DEBUG", "off"}}});
  int named = 0;
  for (const RankResult& r : results) {
    EXPECT_EQ(r.signal, 0) << r.describe();
    EXPECT_FALSE(r.killed_by_harness) << r.describe();
    const std::string& err = r.stderr_text;
    if (err.find("collective mismatch on the gloo backend") != std::string::npos) {
      ++named;
      EXPECT_EQ(r.exit_code, 1) << r.describe();
      EXPECT_NE(err.find("all_reduce(sum) #1 of"), std::string::npos) << r.describe();
      EXPECT_NE(err.find("DDP_DEBUG=detail"), std::string::npos) << r.describe();
    } else {
      EXPECT_EQ(r.exit_code, 5) << r.describe();  // a CommError: its peer exited
    }
  }
  EXPECT_GE(named, 1) << "no rank reported the mismatch in our words";
}

INSTANTIATE_TEST_SUITE_P(Gloo, GlooFaults, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return fmt::format("gloo_{}", info.param); });

const GlooOptions kLoneRank{
    .rank = 0, .size = 1, .hostname = "127.0.0.1", .comm = {}, .store_prefix = "", .abandon = {}};

// World size 1 needs no store: the collectives are the identity.
TEST(GlooCommunicator, WorldSizeOneWithoutAStore) {
  auto comm = make_gloo_communicator(nullptr, kLoneRank);
  EXPECT_EQ(comm->backend(), "gloo");
  Tensor t = make_input(DType::bf16, 1000, 0);
  comm->all_reduce(t, ReduceOp::avg)->wait();
  expect_values(
      t, [](int64_t i) { return input_value(DType::bf16, 0, i); }, "avg over 1 rank");
  Tensor out = zeros({1000}, {.dtype = DType::bf16});
  comm->all_gather(t, out)->wait();
  expect_values(
      out, [](int64_t i) { return input_value(DType::bf16, 0, i); }, "all_gather");
  comm->barrier()->wait();
}

TEST(GlooCommunicator, WorldSizeTwoNeedsAStore) {
  EXPECT_THROW(
      make_gloo_communicator(
          nullptr,
          GlooOptions{
              .rank = 0, .size = 2, .hostname = "", .comm = {}, .store_prefix = "", .abandon = {}}),
      ValueError);
}

TEST(GlooCommunicator, RejectsU8ReductionsAndIntegerAvg) {
  auto comm = make_gloo_communicator(nullptr, kLoneRank);
  Tensor u8 = zeros({4}, {.dtype = DType::u8});
  EXPECT_THROW(comm->all_reduce(u8), ValueError);
  Tensor i32 = zeros({4}, {.dtype = DType::i32});
  EXPECT_THROW(comm->all_reduce(i32, ReduceOp::avg), ValueError);
}

TEST(GlooCommunicator, UnresolvableHostnameIsACommErrorNamingIt) {
  try {
    make_gloo_communicator(nullptr, {.rank = 0,
                                     .size = 1,
                                     .hostname = "no-such-host.invalid",
                                     .comm = {},
                                     .store_prefix = "",
                                     .abandon = {}});
    FAIL() << "connected on an unresolvable hostname";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-host.invalid"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddp::test::gloo_conformance_test
