// The timeline with real ranks (Note [timeline collectives], Note [trace clocks]):
// the clock offset measured over a communicator, and the collective spans the
// observer records on each rank.
#include "collectives/trace_collectives.h"
#include "collectives/backends.h"
#include "collectives/collective_events.h"
#include "runtime/trace.h"
#include "tests/multirank/conformance.h"
#include "tests/multirank/spawn.h"

#include <gtest/gtest.h>

#include <cstdlib>

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
  require(where == "main" || where == fmt::format("{} comm thread (comm 0)", backend),
          fmt::format("ran on main or the comm thread, got '{}'", where));
  // The flow arrow from the enqueue to the run.
  int starts = 0, finishes = 0;
  for (const trace::TraceEvent& f : s.events) {
    if (f.phase == 's' && f.ts == enqueue->ts && f.track == enqueue->track) ++starts;
    if (f.phase == 'f' && f.ts == run->ts && f.track == run->track) ++finishes;
  }
  require(starts == 1 && finishes == 1, "one flow from the enqueue to the run");
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

INSTANTIATE_TEST_SUITE_P(Backends, TraceCollectives, ::testing::Values("shm", "gloo"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ddp::test
