// Note [collective events]: every backend tells observers each collective's
// moments in order, with its label, and the waits around it.
#include "collectives/collective_events.h"
#include "collectives/backends.h"
#include "tests/multirank/conformance.h"
#include "tests/multirank/spawn.h"

#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace ddp::test {
namespace {

using namespace std::chrono_literals;

struct Seen {
  CollectiveState state;
  int64_t sequence;
  std::string label;
  int64_t bytes;
  int64_t time_ns;
};

class Recorder : public CollectiveObserver {
 public:
  void on_collective(const CollectiveEvent& e) noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    seen_.push_back({e.state, e.info.sequence, e.info.label, e.info.bytes, e.time_ns});
  }
  std::vector<Seen> seen() {
    std::lock_guard<std::mutex> lock(mutex_);
    return seen_;
  }

 private:
  std::mutex mutex_;
  std::vector<Seen> seen_;
};

// The states of one collective, in the order they came.
std::vector<CollectiveState> states_of(const std::vector<Seen>& seen, int64_t sequence) {
  std::vector<CollectiveState> out;
  for (const Seen& s : seen) {
    if (s.sequence == sequence) out.push_back(s.state);
  }
  return out;
}

int labelled_collectives(const std::string& backend, int rank, int size) {
  auto recorder = std::make_shared<Recorder>();
  add_collective_observer(recorder);
  auto c = make_backend(backend, rank, size, {.timeout = 20s});
  Tensor t = make_input(DType::f32, 1000, rank);
  {
    const CollectiveLabel outer("outer");
    const CollectiveLabel inner("ddp bucket 3");
    c->all_reduce(t)->wait();  // #0
  }
  {
    const CollectiveLabel outer("outer");
    c->barrier()->wait();  // #1
  }
  c->broadcast(t, 0)->wait();  // #2, no label
  remove_collective_observer(recorder.get());
  c->barrier()->wait();  // #3: after removal, unseen
  const auto seen = recorder->seen();

  const std::vector<CollectiveState> core = {CollectiveState::enqueued, CollectiveState::started,
                                             CollectiveState::completed};
  for (int64_t seq = 0; seq < 3; ++seq) {
    // wait_begin/wait_end may come between enqueued and completed (a waiter
    // that runs it) or not at all (finished before the wait): check the rest.
    std::vector<CollectiveState> states = states_of(seen, seq);
    std::vector<CollectiveState> without_waits;
    int begins = 0, ends = 0;
    for (CollectiveState s : states) {
      if (s == CollectiveState::wait_begin)
        ++begins;
      else if (s == CollectiveState::wait_end)
        ++ends;
      else
        without_waits.push_back(s);
    }
    require(without_waits == core, fmt::format("#{}: enqueued, started, completed in order", seq));
    require(begins == ends && begins <= 1, fmt::format("#{}: one wait_begin/wait_end pair", seq));
  }
  require(states_of(seen, 3).empty(), "no events after the observer was removed");
  for (const Seen& s : seen) {
    const std::string want = s.sequence == 0 ? "ddp bucket 3" : s.sequence == 1 ? "outer" : "";
    require(s.label == want, fmt::format("#{} labelled '{}', got '{}'", s.sequence, want, s.label));
    const int64_t bytes = s.sequence == 1 ? 0 : 4000;
    require(s.bytes == bytes, fmt::format("#{}: {} bytes, got {}", s.sequence, bytes, s.bytes));
  }
  // Times do not go back along a thread's moments: the core ones (the caller's
  // enqueued, then the thread that runs it), and a wait's end after its begin. Across
  // threads the order events arrive in need not be their times' order: a waiter takes
  // wait_begin's time, and the worker may tell started and completed before the
  // waiter's event reaches the observer (seen once in CI on gloo).
  for (int64_t seq = 0; seq < 3; ++seq) {
    int64_t core = 0, wait_begin = -1;
    for (const Seen& s : seen) {
      if (s.sequence != seq) continue;
      if (s.state == CollectiveState::wait_begin) {
        wait_begin = s.time_ns;
      } else if (s.state == CollectiveState::wait_end) {
        require(wait_begin >= 0 && s.time_ns >= wait_begin,
                fmt::format("#{}: a wait ends after it began", seq));
      } else {
        require(s.time_ns >= core, fmt::format("#{}: {} before the moment told before it", seq,
                                               collective_state_name(s.state)));
        core = s.time_ns;
      }
    }
  }
  require(current_collective_label().empty(), "labels end with their scope");
  return 0;
}

class CollectiveEvents : public ::testing::TestWithParam<std::string> {};

TEST_P(CollectiveEvents, EachCollectiveIsToldInOrderWithItsLabel) {
  const std::string backend = GetParam();
  const auto results =
      spawn_ranks(2, [&](int rank, int size) { return labelled_collectives(backend, rank, size); });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectiveEvents, ::testing::Values("shm", "gloo"),
                         [](const auto& info) { return info.param; });

// A wait that times out says so before its CommTimeoutError.
TEST(CollectiveEventsTimeout, AWaitThatGivesUpIsTold) {
  const auto results = spawn_ranks(2, [](int rank, int size) -> int {
    auto recorder = std::make_shared<Recorder>();
    add_collective_observer(recorder);
    auto c = make_backend("shm", rank, size, {.timeout = 20s});
    if (rank == 1) {
      Tensor t = zeros({4});
      auto work = c->all_reduce(t);
      // Let the communication thread take it, so that its events come in this order
      // (a wait with a timeout of its own leaves it to that thread anyway).
      const auto deadline = std::chrono::steady_clock::now() + 10s;
      while (states_of(recorder->seen(), 0).size() < 2 &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(1ms);
      }
      bool threw = false;
      try {
        work->wait(300ms);  // rank 0 never joins #0
      } catch (const CommTimeoutError&) {
        threw = true;
      }
      require(threw, "the wait timed out");
      const auto states = states_of(recorder->seen(), 0);
      const std::vector<CollectiveState> want = {
          CollectiveState::enqueued, CollectiveState::started, CollectiveState::wait_begin,
          CollectiveState::timed_out, CollectiveState::wait_end};
      std::vector<std::string_view> names;
      for (CollectiveState s : states) names.push_back(collective_state_name(s));
      require(states == want, fmt::format("told {}", fmt::join(names, ", ")));
    } else {
      std::this_thread::sleep_for(3s);  // alive, but never joins #0, until rank 1 gave up
    }
    std::_Exit(0);  // rank 1's all_reduce is still in flight: leave without teardown
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

// Work::wait(timeout) with a timeout shorter than the backend's gives up at it, whoever
// runs the collective (a waiter that ran it itself was bound by the backend's 20 s
// instead, Note [waiter runs it]), and the collective completes later all the same.
class WaitTimeout : public ::testing::TestWithParam<std::string> {};

TEST_P(WaitTimeout, AWaitGivesUpAtItsOwnTimeoutAndTheCollectiveGoesOn) {
  const std::string backend = GetParam();
  const auto results = spawn_ranks(2, [&](int rank, int size) -> int {
    auto c = make_backend(backend, rank, size, {.timeout = 20s});
    Tensor t = full({4}, static_cast<double>(rank + 1));
    if (rank == 0) std::this_thread::sleep_for(2s);  // late to #0
    auto work = c->all_reduce(t);
    if (rank == 1) {
      const auto start = std::chrono::steady_clock::now();
      bool threw = false;
      try {
        work->wait(300ms);
      } catch (const CommTimeoutError&) {
        threw = true;
      }
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      require(threw,
              fmt::format("wait(300ms) returned after {:.2f} s instead of giving up", waited));
      require(waited < 1.5, fmt::format("wait(300ms) gave up after {:.2f} s", waited));
    }
    work->wait();
    require(t.to_vector<float>() == std::vector<float>(4, 3.0f),
            "the sum after the timed-out wait");
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

// A collective queued under CallerRuns (the communication thread not woken, as DDP's
// last bucket is) and waited for with a short timeout is handed to that thread: it
// completes, instead of timing out on every rank with nobody running it.
TEST_P(WaitTimeout, AShortWaitOnACollectiveLeftToItsCallerHandsItToTheThread) {
  const std::string backend = GetParam();
  const auto results = spawn_ranks(2, [&](int rank, int size) -> int {
    auto c = make_backend(backend, rank, size, {.timeout = 20s});
    Tensor t = full({4}, static_cast<double>(rank + 1));
    std::shared_ptr<Work> work;
    {
      const CallerRuns caller_runs;
      work = c->all_reduce(t);
    }
    work->wait(5s);
    require(t.to_vector<float>() == std::vector<float>(4, 3.0f), "the sum");
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Backends, WaitTimeout, ::testing::Values("shm", "gloo"),
                         [](const auto& info) { return info.param; });

// A collective that the backend's own timeout ends (fail_timeout: shm, gloo) is told
// timed_out, then failed, as the flight recorder needs to mark it (it was told failed
// alone, so a dump read "rank 1 failed in it" under a "timed out after" error).
class CollectiveEventsBackendTimeout : public ::testing::TestWithParam<std::string> {};

TEST_P(CollectiveEventsBackendTimeout, IsToldTimedOutThenFailed) {
  const std::string backend = GetParam();
  const auto results = spawn_ranks(2, [&](int rank, int size) -> int {
    auto recorder = std::make_shared<Recorder>();
    add_collective_observer(recorder);
    auto c = make_backend(backend, rank, size, {.timeout = 500ms});
    if (rank == 1) {
      Tensor t = zeros({4});
      bool threw = false;
      try {
        c->all_reduce(t)->wait(20s);  // rank 0 never joins #0: the backend's timeout ends it
      } catch (const CommTimeoutError&) {
        threw = true;
      }
      require(threw, "the collective timed out");
      std::vector<CollectiveState> states;
      for (CollectiveState s : states_of(recorder->seen(), 0)) {
        if (s != CollectiveState::wait_begin && s != CollectiveState::wait_end) states.push_back(s);
      }
      const std::vector<CollectiveState> want = {
          CollectiveState::enqueued, CollectiveState::started, CollectiveState::timed_out,
          CollectiveState::failed};
      std::vector<std::string_view> names;
      for (CollectiveState s : states) names.push_back(collective_state_name(s));
      require(states == want, fmt::format("told {}", fmt::join(names, ", ")));
    } else {
      std::this_thread::sleep_for(2s);  // alive, but never joins #0, until rank 1 gave up
    }
    std::_Exit(0);
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectiveEventsBackendTimeout, ::testing::Values("shm", "gloo"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ddp::test
