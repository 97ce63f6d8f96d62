// The timeline with real ranks (Note [timeline collectives], Note [trace clocks]):
// the clock offset measured over a communicator, and the collective spans the
// observer records on each rank.
#include "collectives/trace_collectives.h"
#include "collectives/backends.h"
#include "collectives/bootstrap.h"
#include "collectives/collective_events.h"
#include "collectives/communicator_base.h"
#include "collectives/store/tcp_store.h"
#include "runtime/trace.h"
#include "tests/multirank/conformance.h"
#include "tests/multirank/spawn.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>

namespace ddp::test {
namespace {

using namespace std::chrono_literals;

const trace::TraceEvent* find(const trace::Snapshot& s, char phase, std::string_view name) {
  for (const trace::TraceEvent& e : s.events) {
    if (e.phase == phase && e.name == name) return &e;
  }
  return nullptr;
}

int64_t arg(const trace::TraceEvent& e, std::string_view key) {
  for (const trace::Arg& a : e.args) {
    if (key == a.key) return a.value;
  }
  return -1;
}

std::string track_name(const trace::Snapshot& s, trace::Track id) {
  for (const trace::TrackInfo& t : s.tracks) {
    if (t.id == id) return t.name;
  }
  return "?";
}

int traced_collectives(const std::string& backend, int rank, int size) {
  trace::start({.dir = "", .max_events = 100000, .handle_signals = false});
  auto c = make_backend(backend, rank, size, {.timeout = 20s});
  // The ranks share this node's clock: the true offset is 0.
  const trace::OffsetEstimate e = measure_offset_with_comm(*c, 8);
  require(std::abs(e.offset_ns) <= e.error_ns,
          fmt::format("offset {} ns beyond its error {} ns", e.offset_ns, e.error_ns));
  require(e.error_ns < 50'000'000, fmt::format("error {} ns", e.error_ns));
  Tensor t = make_input(DType::f32, 1000, rank);
  {
    const CollectiveLabel label("ddp bucket 7");
    c->all_reduce(t)->wait();
  }
  const int64_t seq = c->next_sequence() - 1;
  const trace::Snapshot s = trace::snapshot();
  const trace::TraceEvent* enqueue = find(s, 'X', "enqueue all_reduce (ddp bucket 7)");
  const trace::TraceEvent* run = find(s, 'X', "all_reduce (ddp bucket 7)");
  require(enqueue != nullptr && run != nullptr, "the enqueue and the run of the all_reduce");
  require(arg(*run, "seq") == seq && arg(*run, "bytes") == 4000,
          fmt::format("seq {} and 4000 bytes, got {} and {}", seq, arg(*run, "seq"),
                      arg(*run, "bytes")));
  require(enqueue->ts <= run->ts, "enqueued before it started");
  require(!run->unfinished && run->duration_ns > 0, "the run ended");
  const std::string where = track_name(s, run->track);
  // The communicator's number in this process (earlier tests of the binary may have made
  // others before the fork).
  const int comm_id = dynamic_cast<const CommunicatorBase&>(*c).comm_id();
  require(where == "main" || where == fmt::format("{} comm thread (comm {})", backend, comm_id),
          fmt::format("ran on main or the comm thread, got '{}'", where));
  // The flow arrow from the enqueue to the run, bound to both slices.
  require(enqueue->flow.out && run->flow.in && enqueue->flow.id == run->flow.id &&
              enqueue->flow.id != 0 && enqueue->duration_ns > 0,
          "one flow from the enqueue (a slice of its own) to the run");
  trace::stop();
  return 0;
}

class TraceCollectives : public ::testing::TestWithParam<std::string> {};

TEST_P(TraceCollectives, OffsetOverTheCommunicatorAndCollectiveSpans) {
  const std::string backend = GetParam();
  const auto results =
      spawn_ranks(3, [&](int rank, int size) { return traced_collectives(backend, rank, size); });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

// Note [trace participation]: rank 1's tracing failed to start (DDP_TRACE is
// set, as on every rank, but it records nothing); it still runs the collectives
// tracing adds, so the program's own broadcast pairs with rank 0's, and rank 0
// merges what it has.
int participation(const std::string& backend, int rank, int size, const std::string& dir) {
  ::setenv("DDP_TRACE", dir.c_str(), 1);
  ::setenv("DDP_TRACE_MAX_EVENTS", rank == 1 ? "-1" : "100000", 1);  // rank 1: a bad value
  require(trace::start_from_env() == (rank != 1), "tracing starts on ranks 0 and 2 only");
  ProcessGroup pg;
  pg.comm = make_backend(backend, rank, size, {.timeout = 20s});
  pg.env.rank = rank;
  pg.env.world_size = size;
  trace_process_group(pg);
  Tensor t = from_vector<int64_t>({rank == 0 ? 4242 : -1}, {1}, {.dtype = DType::i64});
  pg.comm->broadcast(t, 0)->wait();
  require(
      t.to_vector<int64_t>()[0] == 4242,
      fmt::format("the program's broadcast got {}, not rank 0's 4242", t.to_vector<int64_t>()[0]));
  const std::string merged = finish_trace(&pg);
  Tensor one = from_vector<float>({1.f}, {1});
  pg.comm->all_reduce(one)->wait();
  require(one.to_vector<float>()[0] == static_cast<float>(size), "an all_reduce after the merge");
  if (rank == 0) {
    require(merged.find("merged 2 rank(s)") != std::string::npos &&
                merged.find("no trace from rank(s) 1") != std::string::npos,
            fmt::format("rank 0 merges ranks 0 and 2 and names rank 1: '{}'", merged));
  } else {
    require(merged.empty(), fmt::format("only rank 0 merges, got '{}'", merged));
  }
  trace::stop();
  ::unsetenv("DDP_TRACE");
  ::unsetenv("DDP_TRACE_MAX_EVENTS");
  return 0;
}

// A store without TIME (an older ddprun's) or gone: the sample is lost, not the run.
int store_gone(int rank, int size, const std::string& dir) {
  ::setenv("DDP_TRACE", dir.c_str(), 1);
  trace::start({.dir = dir, .max_events = 100000, .handle_signals = false});
  ProcessGroup pg;
  pg.comm = make_backend("shm", rank, size, {.timeout = 20s});
  pg.env.rank = rank;
  pg.env.world_size = size;
  pg.env.run_id = "store gone";
  pg.env.agent_store = true;
  {
    TcpStoreServer server({.host = "127.0.0.1", .port = 0, .secret = "s"});
    pg.store = std::make_shared<TcpStore>(TcpStoreOptions{.host = "127.0.0.1",
                                                          .port = server.port(),
                                                          .secret = "s",
                                                          .timeout = 2s,
                                                          .connect_timeout = 1s});
  }
  trace_process_group(pg);
  require(trace::snapshot().clock.empty(), "no clock sample without the store");
  require(trace::rank_info().run_id == "store gone", "the rank is known all the same");
  finish_trace(&pg);
  require(std::filesystem::exists(fmt::format("{}/rank_{}.json", dir, rank)),
          "the file is written all the same");
  trace::stop();
  ::unsetenv("DDP_TRACE");
  return 0;
}

std::string temporary_dir(const char* what) {
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("ddp_{}_{}_{}", what, ::getpid(), std::random_device{}());
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST_P(TraceCollectives, EveryRankRunsTracingsCollectivesEvenWhereItIsOff) {
  const std::string backend = GetParam();
  const std::string dir = temporary_dir("trace_participation");
  const auto results =
      spawn_ranks(3, [&](int rank, int size) { return participation(backend, rank, size, dir); });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Backends, TraceCollectives, ::testing::Values("shm", "gloo"),
                         [](const auto& info) { return info.param; });

TEST(TraceCollectivesStore, AFailedMeasurementCostsTheSampleNotTheRun) {
  const std::string dir = temporary_dir("trace_store_gone");
  const auto results =
      spawn_ranks(2, [&](int rank, int size) { return store_gone(rank, size, dir); });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp::test
