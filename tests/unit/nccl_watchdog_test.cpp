// The nccl watchdog's decisions (collectives/nccl_watchdog.h) with a fake clock,
// fake completion events, NCCL errors and aborts: deadlines from each launch,
// finished collectives released in order, the first error wins and is what every
// later question gets, the abort is retried until it can run, the tear-down hook.
#include "collectives/nccl_watchdog.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace ddp {
namespace {

using namespace std::chrono_literals;
using State = NcclWatchdog::State;

// The world the watchdog sees, set by each test.
struct FakeWorld {
  NcclWatchdog::Clock::time_point now{};
  std::set<int64_t> finished;
  int64_t cuda_error_on = -1;  // finished() throws for this sequence
  std::string async_error;
  bool abort_possible = true;
  int aborts = 0;
  int abort_calls = 0;
  std::vector<std::string> torn_down;
  std::set<int64_t> started;      // start events passed
  std::vector<std::string> told;  // "0 started", "0 completed", ...

  NcclWatchdog::Backend backend(bool tear_down = false) {
    NcclWatchdog::Backend b{
        .now = [this] { return now; },
        .finished =
            [this](const NcclWatchdog::Entry& e) {
              if (e.sequence == cuda_error_on) throw CudaError("cudaEventQuery: illegal address");
              return finished.count(e.sequence) > 0;
            },
        .async_error = [this] { return async_error; },
        .abort =
            [this] {
              ++abort_calls;
              if (!abort_possible) return false;
              ++aborts;
              return true;
            },
        .tear_down = nullptr,
    };
    if (tear_down) b.tear_down = [this](const std::string& m) { torn_down.push_back(m); };
    return b;
  }
  // With the moments told (Note [nccl events] in nccl_communicator.cpp).
  NcclWatchdog::Backend telling() {
    NcclWatchdog::Backend b = backend();
    b.started = [this](const NcclWatchdog::Entry& e) { return started.count(e.sequence) > 0; };
    b.tell = [this](const NcclWatchdog::Notice& n) {
      told.push_back(std::to_string(n.sequence) + " " +
                     std::string(collective_state_name(n.moment)));
    };
    return b;
  }
};

NcclWatchdog::Entry entry(int64_t sequence, std::shared_ptr<void> keep_alive = nullptr,
                          std::chrono::milliseconds timeout = 10s) {
  return {.sequence = sequence,
          .description = "all_reduce(sum) #" + std::to_string(sequence) + " of 1024 f32",
          .count = 1024,
          .timeout = timeout,
          .keep_alive = std::move(keep_alive),
          .subject = nullptr};
}

template <typename E>
E thrown(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const E& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception: " << e.what();
  }
  throw std::logic_error("no exception of the expected type");
}

TEST(NcclWatchdog, ReleasesFinishedCollectivesInOrder) {
  FakeWorld w;
  NcclWatchdog dog(3, w.backend());
  auto tensors0 = std::make_shared<int>(0), tensors1 = std::make_shared<int>(1);
  dog.start(entry(0, tensors0));
  dog.start(entry(1, tensors1));
  std::weak_ptr<int> weak0 = tensors0, weak1 = tensors1;
  tensors0.reset();
  tensors1.reset();
  EXPECT_FALSE(dog.idle());
  EXPECT_EQ(dog.state(0), State::in_flight);

  // 1 finished first in this fake, but the NCCL stream finishes in order: 0 holds it.
  w.finished = {1};
  EXPECT_EQ(dog.tick(), std::nullopt);
  EXPECT_FALSE(weak0.expired());
  EXPECT_FALSE(weak1.expired());
  EXPECT_EQ(dog.state(1), State::in_flight);

  w.finished = {0, 1};
  EXPECT_EQ(dog.tick(), std::nullopt);
  EXPECT_TRUE(weak0.expired()) << "the tensors of a finished collective are released";
  EXPECT_TRUE(weak1.expired());
  EXPECT_EQ(dog.state(0), State::finished);
  EXPECT_EQ(dog.state(1), State::finished);
  EXPECT_EQ(dog.state(2), State::in_flight) << "not started yet";
  EXPECT_TRUE(dog.idle());
  EXPECT_EQ(dog.error(), nullptr);
  EXPECT_EQ(w.abort_calls, 0);
}

TEST(NcclWatchdog, TimesOutEachCollectiveFromItsOwnLaunch) {
  FakeWorld w;
  NcclWatchdog dog(2, w.backend());
  dog.start(entry(0, nullptr, 10s));
  w.now += 6s;
  dog.start(entry(1, nullptr, 10s));
  w.finished = {0};
  w.now += 9s;  // 15 s after #0 (finished), 9 s after #1
  EXPECT_EQ(dog.tick(), std::nullopt);
  w.now += 1s;  // #1's deadline
  const std::optional<std::string> message = dog.tick();
  ASSERT_TRUE(message.has_value());
  EXPECT_NE(message->find("rank 2: all_reduce(sum) #1 of 1024 f32 timed out after 10.0 s"),
            std::string::npos)
      << *message;
  EXPECT_NE(message->find("ncclCommAbort"), std::string::npos) << *message;
  const auto e = thrown<CommTimeoutError>(dog.error());
  EXPECT_EQ(e.rank(), 2);
  EXPECT_EQ(e.sequence(), 1);
  EXPECT_EQ(e.count(), 1024);
  EXPECT_EQ(e.op(), "all_reduce(sum) #1 of 1024 f32");
  EXPECT_EQ(w.aborts, 1);
  EXPECT_EQ(dog.state(0), State::finished) << "finished before the failure: still good";
  EXPECT_EQ(dog.state(1), State::failed);
}

TEST(NcclWatchdog, FirstErrorWinsAndLaterCollectivesGetIt) {
  FakeWorld w;
  NcclWatchdog dog(0, w.backend());
  dog.start(entry(4));
  dog.start(entry(5));
  w.async_error = "unhandled system error (ncclResult_t 2)";
  const std::optional<std::string> first = dog.tick();
  ASSERT_TRUE(first.has_value());
  EXPECT_NE(first->find("all_reduce(sum) #4 of 1024 f32 failed on the nccl backend: NCCL reported "
                        "an asynchronous error: unhandled system error"),
            std::string::npos)
      << *first;
  const std::exception_ptr error = dog.error();
  EXPECT_EQ(thrown<CommError>(error).sequence(), 4);

  // Later failures are not news, and do not replace the first.
  w.now += 1h;
  EXPECT_EQ(dog.tick(), std::nullopt);
  EXPECT_EQ(dog.time_out(5, 1s), std::nullopt);
  EXPECT_EQ(dog.fail(std::make_exception_ptr(CommError("other", 0, "x", 9, 0))), std::nullopt);
  EXPECT_EQ(dog.error(), error);
  EXPECT_EQ(w.aborts, 1) << "aborted once";

  // Every collective in flight failed with it, and a new one is refused with it.
  EXPECT_EQ(dog.state(4), State::failed);
  EXPECT_EQ(dog.state(5), State::failed);
  EXPECT_EQ(dog.state(6), State::failed);
  try {
    dog.start(entry(6));
    FAIL() << "start() after a failure must throw the first error";
  } catch (const CommError& e) {
    EXPECT_EQ(e.sequence(), 4);
  }
}

TEST(NcclWatchdog, AbortWaitsForTheCommunicatorAndIsRetried) {
  FakeWorld w;
  w.abort_possible = false;  // a launch holds the communicator
  NcclWatchdog dog(1, w.backend());
  dog.start(entry(0, nullptr, 1s));
  w.now += 2s;
  ASSERT_TRUE(dog.tick().has_value());
  EXPECT_EQ(w.aborts, 0);
  EXPECT_FALSE(dog.idle()) << "the abort is still to be done";
  EXPECT_EQ(dog.tick(), std::nullopt);
  EXPECT_EQ(w.abort_calls, 2) << "tried again in the next round";
  w.abort_possible = true;
  EXPECT_EQ(dog.tick(), std::nullopt);
  EXPECT_EQ(w.aborts, 1);
  EXPECT_TRUE(dog.idle()) << "failed and aborted: nothing more to decide";
  dog.tick();
  EXPECT_EQ(w.aborts, 1) << "never aborted twice";
}

TEST(NcclWatchdog, AfterTheAbortTheTensorsAreStillReleased) {
  FakeWorld w;
  NcclWatchdog dog(0, w.backend());
  auto tensors = std::make_shared<int>(7);
  std::weak_ptr<int> weak = tensors;
  dog.start(entry(0, std::move(tensors), 1s));
  w.now += 1s;
  ASSERT_TRUE(dog.tick().has_value());
  EXPECT_FALSE(weak.expired());
  w.finished = {0};  // the abort ended the kernels
  dog.tick();
  EXPECT_TRUE(weak.expired());
  EXPECT_EQ(dog.state(0), State::failed) << "its end event passed because of the abort";
}

TEST(NcclWatchdog, CudaErrorOfAnEventFailsThatCollective) {
  FakeWorld w;
  w.cuda_error_on = 3;
  NcclWatchdog dog(0, w.backend());
  dog.start(entry(3));
  const std::optional<std::string> message = dog.tick();
  ASSERT_TRUE(message.has_value());
  EXPECT_NE(message->find("#3 of 1024 f32 failed on the nccl backend: CUDA reported an error: "
                          "cudaEventQuery: illegal address"),
            std::string::npos)
      << *message;
  EXPECT_EQ(thrown<CommError>(dog.error()).sequence(), 3);
}

TEST(NcclWatchdog, HostWaiterTimeoutFailsOnlyAnUnfinishedCollective) {
  FakeWorld w;
  NcclWatchdog dog(0, w.backend());
  dog.start(entry(0));
  dog.start(entry(1));
  w.finished = {0};
  dog.tick();
  EXPECT_EQ(dog.time_out(0, 2s), std::nullopt) << "#0 finished: nothing to fail";
  EXPECT_EQ(dog.error(), nullptr);
  const std::optional<std::string> message = dog.time_out(1, 2500ms);
  ASSERT_TRUE(message.has_value());
  EXPECT_NE(message->find("#1 of 1024 f32 timed out after 2.5 s"), std::string::npos) << *message;
  EXPECT_EQ(dog.state(1), State::failed);
  EXPECT_EQ(w.aborts, 1);
}

TEST(NcclWatchdog, LaunchFailureWithNothingInFlightFailsTheNextSequences) {
  FakeWorld w;
  NcclWatchdog dog(0, w.backend());
  dog.start(entry(0));
  w.finished = {0};
  dog.tick();
  ASSERT_TRUE(dog.fail(std::make_exception_ptr(CommError("launch refused", 0, "barrier #1", 1, 0)))
                  .has_value());
  EXPECT_EQ(dog.state(0), State::finished);
  EXPECT_EQ(dog.state(1), State::failed);
  EXPECT_EQ(w.aborts, 1);
}

TEST(NcclWatchdog, TearDownHookGetsTheMessage) {
  FakeWorld w;
  NcclWatchdog dog(5, w.backend(/*tear_down=*/true));
  dog.start(entry(0, nullptr, 1s));
  w.now += 1s;
  const std::optional<std::string> message = dog.tick();
  ASSERT_EQ(w.torn_down.size(), 1u);
  EXPECT_EQ(w.torn_down[0], *message);
  EXPECT_NE(w.torn_down[0].find("rank 5"), std::string::npos);
}

TEST(NcclWatchdog, AsyncErrorHandlingVariable) {
  const char* name = "DDP_NCCL_ASYNC_ERROR_HANDLING";
  unsetenv(name);
  EXPECT_FALSE(nccl_tear_down_on_error());
  setenv(name, "0", 1);
  EXPECT_FALSE(nccl_tear_down_on_error());
  setenv(name, "1", 1);
  EXPECT_TRUE(nccl_tear_down_on_error());
  setenv(name, "yes", 1);
  try {
    nccl_tear_down_on_error();
    FAIL() << "'yes' accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_NCCL_ASYNC_ERROR_HANDLING='yes' is not valid: 0"),
              std::string::npos)
        << e.what();
  }
  unsetenv(name);
}

// Note [nccl regroup]: the group's membership changed (ddprun --on-failure
// continue). Not asked while nothing is in flight; asked with a collective in
// flight, it fails that collective and aborts before its deadline, naming why.
TEST(NcclWatchdog, AbandonedCommunicatorFailsWhatIsInFlight) {
  FakeWorld w;
  NcclWatchdog::Backend b = w.backend();
  int asked = 0;
  std::string reason;
  b.abandoned = [&] {
    ++asked;
    return reason;
  };
  NcclWatchdog wd(2, b);
  wd.tick();
  EXPECT_EQ(asked, 0);  // idle: a healthy communicator between steps is left alone
  wd.start(entry(0));
  wd.tick();
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(wd.state(0), State::in_flight);
  reason = "the group's membership changed";
  const std::optional<std::string> news = wd.tick();
  ASSERT_TRUE(news.has_value());
  EXPECT_NE(news->find("rank 2: all_reduce(sum) #0 of 1024 f32 failed on the nccl backend: the "
                       "group's membership changed"),
            std::string::npos)
      << *news;
  EXPECT_EQ(w.aborts, 1);
  EXPECT_EQ(wd.state(0), State::failed);
  try {
    std::rethrow_exception(wd.error());
  } catch (const CommTimeoutError&) {
    ADD_FAILURE() << "a departure is not a timeout";
  } catch (const CommError& e) {
    EXPECT_EQ(e.sequence(), 0);
  }
}

// Note [nccl events]: started as the start event passes, then completed, each once
// and in stream order; a collective that finished before it was seen starting is
// told both at once.
TEST(NcclWatchdog, TellsStartedThenCompletedInOrder) {
  FakeWorld w;
  NcclWatchdog dog(0, w.telling());
  auto tensors = std::make_shared<int>(0);
  std::weak_ptr<int> weak = tensors;
  dog.start(entry(0, std::move(tensors)));
  dog.start(entry(1));
  dog.start(entry(2));
  EXPECT_EQ(dog.tick(), std::nullopt);
  EXPECT_TRUE(w.told.empty());
  w.started = {0};
  dog.tick();
  dog.tick();
  EXPECT_EQ(w.told, std::vector<std::string>{"0 started"});
  w.finished = {0, 1};
  w.started = {0, 1, 2};
  dog.tick();
  EXPECT_EQ(w.told, (std::vector<std::string>{"0 started", "0 completed", "1 started",
                                              "1 completed", "2 started"}));
  EXPECT_TRUE(weak.expired()) << "released after it was told";
  EXPECT_EQ(dog.state(2), State::in_flight);
}

// Every collective in flight when the communicator fails is told failed, once;
// one that finishes afterwards (an abort ended its kernels) is told nothing more.
TEST(NcclWatchdog, TellsFailedForEveryCollectiveInFlight) {
  FakeWorld w;
  NcclWatchdog dog(0, w.telling());
  dog.start(entry(0, nullptr, 10s));
  dog.start(entry(1, nullptr, 10s));
  w.started = {0};
  dog.tick();
  w.now += 11s;
  EXPECT_NE(dog.tick(), std::nullopt);
  EXPECT_EQ(w.told, (std::vector<std::string>{"0 started", "0 failed", "1 failed"}));
  w.finished = {0, 1};
  w.started = {0, 1};
  dog.tick();
  EXPECT_EQ(w.told, (std::vector<std::string>{"0 started", "0 failed", "1 failed"}));
  EXPECT_EQ(dog.state(1), State::failed);
}

// A host waiter's timeout fails it too, told from the waiter's thread.
TEST(NcclWatchdog, WaiterTimeoutIsToldAsAFailure) {
  FakeWorld w;
  NcclWatchdog dog(0, w.telling());
  dog.start(entry(0));
  EXPECT_NE(dog.time_out(0, 300ms), std::nullopt);
  EXPECT_EQ(w.told, std::vector<std::string>{"0 failed"});
}

// Without `tell` nothing is gathered (the watchdog of a process nobody observes).
TEST(NcclWatchdog, WithoutTellNothingIsAskedOrTold) {
  FakeWorld w;
  NcclWatchdog::Backend b = w.backend();
  int asked = 0;
  b.started = [&asked](const NcclWatchdog::Entry&) { return ++asked > 0; };
  NcclWatchdog dog(0, b);
  dog.start(entry(0));
  w.finished = {0};
  dog.tick();
  EXPECT_EQ(asked, 0);
}

// A gate an observer blocks at (a flight recorder writing its dump, say).
struct Gate {
  std::promise<void> entered, opened;
  std::shared_future<void> open = opened.get_future().share();
  std::atomic<bool> blocked{false};
};

// Note [watchdog notices]: while one thread tells a slow observer, the others
// neither wait for it nor keep the tensors alive: a waiter that gives up, a
// state() poll, a launch failure and the next tick all return.
TEST(NcclWatchdog, ASlowObserverHoldsUpNoOtherThread) {
  FakeWorld w;
  Gate gate;
  NcclWatchdog::Backend b = w.telling();
  b.tell = [&](const NcclWatchdog::Notice& n) {
    w.told.push_back(std::to_string(n.sequence) + " " +
                     std::string(collective_state_name(n.moment)));
    if (!gate.blocked.exchange(true)) {
      gate.entered.set_value();
      gate.open.wait();
    }
  };
  NcclWatchdog dog(0, b);
  auto tensors = std::make_shared<int>(0);
  std::weak_ptr<int> weak = tensors;
  dog.start(entry(0, std::move(tensors)));
  dog.start(entry(1));
  w.started = {0};
  std::thread teller([&] { dog.tick(); });  // tells "0 started", and blocks in the observer
  gate.entered.get_future().wait();
  auto others = std::async(std::launch::async, [&] {
    const bool in_flight = dog.state(1) == State::in_flight;
    const bool timed_out = dog.time_out(1, 1s).has_value();  // notices for the teller
    w.finished = {0, 1};
    dog.tick();  // #0 finished: its tensors go now, though its moment is still to be told
    return in_flight && timed_out && weak.expired() && dog.state(1) == State::failed;
  });
  const bool returned = others.wait_for(30s) == std::future_status::ready;
  gate.opened.set_value();
  teller.join();
  ASSERT_TRUE(returned) << "a thread waited for the observer another thread was telling";
  EXPECT_TRUE(others.get());
  // Everything was told, once, in order, by the teller.
  EXPECT_EQ(w.told, (std::vector<std::string>{"0 started", "0 failed", "1 failed"}));
}

// An observer may call back into the watchdog, even to fail it (run apart: the
// old design deadlocked here, and a deadlocked thread cannot be joined).
TEST(NcclWatchdog, AnObserverMayCallBackIntoTheWatchdog) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::alarm(20);  // a deadlock ends the child with SIGALRM
    FakeWorld w;
    NcclWatchdog* self = nullptr;
    NcclWatchdog::Backend b = w.telling();
    b.tell = [&](const NcclWatchdog::Notice& n) {
      w.told.push_back(std::to_string(n.sequence) + " " +
                       std::string(collective_state_name(n.moment)));
      if (n.moment == CollectiveState::started) {
        (void)self->state(n.sequence);
        self->fail(std::make_exception_ptr(CommError("from an observer", 0, "x", 1, 0)));
      }
    };
    NcclWatchdog dog(0, b);
    self = &dog;
    dog.start(entry(0));
    w.started = {0};
    dog.tick();
    const bool ok = w.told == std::vector<std::string>{"0 started", "0 failed"} &&
                    dog.state(0) == State::failed;
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << (WIFSIGNALED(status) ? "ended by signal " + std::to_string(WTERMSIG(status))
                              : "exit " + std::to_string(WEXITSTATUS(status)));
}

}  // namespace
}  // namespace ddp
