// The timeline's process side (runtime/trace/process.cpp): what a forked child
// inherits (Note [trace and fork]), the signals (Note [trace on signals]), the
// file at exit, and recording without memory (Note [timeline]). Each case runs in
// a process of its own (fork), since it installs handlers, raises signals or
// fails allocations; the parent test only reads how that process ended.
#include "runtime/trace.h"
#include "runtime/trace/file.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "runtime/fmt.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <new>
#include <random>
#include <thread>

// Allocations of at least t_fail_from bytes fail on the thread that sets it
// (0: none fail), so that the recorder's handling of bad_alloc can be seen. The
// replacements pair malloc with free (GCC cannot see that through the inlining).
// The pragma holds for the rest of the file's unity batch too (Note [unity test
// builds]), where GCC may inline these replacements as well; ASan's new/delete
// mismatch check still sees those files at run time.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
namespace {
thread_local size_t t_fail_from = 0;
}  // namespace

void* operator new(std::size_t bytes) {
  if (t_fail_from != 0 && bytes >= t_fail_from) throw std::bad_alloc();
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  if (t_fail_from != 0 && bytes >= t_fail_from) return nullptr;
  return std::malloc(bytes == 0 ? 1 : bytes);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace ddp::trace {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct Ended {
  bool exited = false;
  int code = -1;
  int signal = 0;
  std::string describe() const {
    return exited        ? fmt::format("exited with {}", code)
           : signal != 0 ? fmt::format("ended by signal {}", signal)
                         : "did not end";
  }
};

// Waits for `pid` at most `limit`, then kills it.
Ended wait_for(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return {};
    }
    std::this_thread::sleep_for(5ms);
  }
  if (WIFEXITED(status)) return {.exited = true, .code = WEXITSTATUS(status)};
  return {.exited = false, .code = -1, .signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0};
}

// Runs `body` in a forked process, which ends with its return value.
Ended in_process(const std::function<int()>& body, std::chrono::milliseconds limit = 20s) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = body();
    } catch (...) {
      code = 98;
    }
    ::_exit(code);
  }
  return wait_for(pid, limit);
}

class TraceProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("ddp_trace_process_{}_{}", ::getpid(), std::random_device{}());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Recording into dir_ as rank 0 (whatever rank an earlier test left set).
  void start_here(bool signals) const {
    start({.dir = dir_.string(), .max_events = 1000, .handle_signals = signals});
    set_rank_info(RankInfo{});
  }
  fs::path dir_;
};

// Note [trace and fork]: a child's SIGTERM ends the child, not the parent.
TEST_F(TraceProcessTest, AForkedChildsSignalEndsTheChildNotItsParent) {
  const Ended parent = in_process([&] {
    start_here(true);
    instant("parent", "test");
    const pid_t child = ::fork();
    if (child == 0) {
      ::raise(SIGTERM);
      ::_exit(42);  // the signal was ignored
    }
    const Ended c = wait_for(child, 10s);
    if (c.signal != SIGTERM) return 10 + (c.exited ? c.code % 10 : 0);
    std::this_thread::sleep_for(200ms);  // time for a wrongly woken signal thread to act
    return fs::exists(dir_ / "rank_0.json") ? 2 : 0;
  });
  EXPECT_TRUE(parent.exited && parent.code == 0) << "the parent " << parent.describe();
}

// A child that starts tracing itself handles its signals once, then ends.
TEST_F(TraceProcessTest, AForkedChildThatStartsTracingEndsOnItsSignal) {
  const Ended parent = in_process([&] {
    start_here(true);
    const pid_t child = ::fork();
    if (child == 0) {
      start({.dir = (dir_ / "child").string(), .max_events = 1000, .handle_signals = true});
      RankInfo info;
      info.rank = 5;
      set_rank_info(info);
      instant("child", "test");
      ::raise(SIGTERM);
      std::this_thread::sleep_for(5s);
      ::_exit(42);
    }
    const Ended c = wait_for(child, 10s);
    if (c.signal != SIGTERM) return 1;
    return fs::exists(dir_ / "child" / "rank_5.json") ? 0 : 2;
  });
  EXPECT_TRUE(parent.exited && parent.code == 0) << "the parent " << parent.describe();
}

// A child that exits (atexit handlers run) leaves the parent's rank file alone.
TEST_F(TraceProcessTest, AForkedChildsExitWritesNothing) {
  const Ended parent = in_process([&] {
    start_here(false);
    instant("parent", "test");
    const pid_t child = ::fork();
    if (child == 0) std::exit(0);
    const Ended c = wait_for(child, 10s);
    if (!c.exited) return 1;
    return fs::exists(dir_ / "rank_0.json") ? 2 : 0;
  });
  EXPECT_TRUE(parent.exited && parent.code == 0) << "the process " << parent.describe();
}

// The file at exit: written when something was recorded, not when nothing was.
TEST_F(TraceProcessTest, ExitWritesTheFileOnlyWhenSomethingWasRecorded) {
  const Ended quiet = in_process([&] {
    start_here(false);
    std::exit(0);
    return 1;
  });
  EXPECT_TRUE(quiet.exited && quiet.code == 0) << quiet.describe();
  EXPECT_FALSE(fs::exists(dir_ / "rank_0.json")) << "a process that recorded nothing wrote a file";
  const Ended busy = in_process([&] {
    start_here(false);
    instant("x", "test");
    std::exit(0);
    return 1;
  });
  EXPECT_TRUE(busy.exited && busy.code == 0) << busy.describe();
  EXPECT_TRUE(fs::exists(dir_ / "rank_0.json"));
}

TEST_F(TraceProcessTest, IgnoredSignalsStayIgnored) {
  const Ended p = in_process([&] {
    ::signal(SIGHUP, SIG_IGN);  // as nohup leaves it
    start_here(true);
    struct sigaction hup {
    }, term{};
    ::sigaction(SIGHUP, nullptr, &hup);
    ::sigaction(SIGTERM, nullptr, &term);
    if (term.sa_handler == SIG_DFL) return 2;  // SIGTERM is handled
    return hup.sa_handler == SIG_IGN ? 0 : 1;
  });
  EXPECT_TRUE(p.exited && p.code == 0) << p.describe();
}

// Note [trace on signals]: recording stops when the signal arrives, the file is
// written, then the program's own handler runs.
volatile sig_atomic_t g_own_handler_ran = 0;

TEST_F(TraceProcessTest, ASignalStopsRecordingWritesTheFileThenRunsTheProgramsHandler) {
  const Ended p = in_process([&] {
    ::signal(SIGTERM, [](int) { g_own_handler_ran = 1; });
    start_here(true);
    begin("step", "train");
    ::raise(SIGTERM);
    for (int i = 0; i < 1000 && g_own_handler_ran == 0; ++i) std::this_thread::sleep_for(10ms);
    if (g_own_handler_ran == 0) return 1;
    if (enabled()) return 2;  // still recording after the signal
    return fs::exists(dir_ / "rank_0.json") ? 0 : 3;
  });
  EXPECT_TRUE(p.exited && p.code == 0) << p.describe();
}

// A second signal while the file is being written does what it did before, at
// once: here the write blocks (its temporary file is a FIFO nobody reads).
TEST_F(TraceProcessTest, ASecondSignalWhileWritingActsAtOnce) {
  const Ended p = in_process(
      [&] {
        start_here(true);
        instant("x", "test");
        const std::string temporary =
            (dir_ / fmt::format("rank_0.json.tmp.{}", ::getpid())).string();
        if (::mkfifo(temporary.c_str(), 0600) != 0) return 3;
        ::raise(SIGTERM);  // the write begins, and blocks
        std::this_thread::sleep_for(100ms);
        ::raise(SIGINT);  // must end the process now
        std::this_thread::sleep_for(5s);
        return 1;
      },
      30s);
  EXPECT_EQ(p.signal, SIGINT) << "the process " << p.describe();
}

// Note [timeline]: recording never throws; without memory the record is dropped.
TEST_F(TraceProcessTest, RecordingWithoutMemoryDropsTheRecord) {
  const Ended p = in_process([&] {
    start({.dir = "", .max_events = 1000, .handle_signals = false});
    t_fail_from = 64 * 1024;  // a chunk of records: fails; the thread's buffer: does not
    instant("no chunk", "test");
    t_fail_from = 0;
    std::thread([] {
      t_fail_from = 1;  // not even the thread's buffer
      instant("no buffer", "test");
      t_fail_from = 0;
    }).join();
    instant("later", "test");  // memory again: recorded
    const Snapshot s = snapshot();
    if (s.dropped != 2) return 10 + static_cast<int>(s.dropped);
    return s.events.size() == 1 && s.events[0].name == "later" ? 0 : 2;
  });
  EXPECT_TRUE(p.exited && p.code == 0) << "the process " << p.describe();
}

// DDP_TRACE: a bad DDP_TRACE_MAX_EVENTS leaves tracing off without failing, but
// the rank still takes part (Note [trace participation]).
TEST_F(TraceProcessTest, StartFromEnvironmentReportsBadValuesAndStaysOff) {
  const Ended p = in_process([&] {
    ::setenv("DDP_TRACE", dir_.c_str(), 1);
    ::setenv("DDP_TRACE_MAX_EVENTS", "-3", 1);
    if (start_from_env() || enabled()) return 1;
    if (!requested()) return 2;
    ::setenv("DDP_TRACE_MAX_EVENTS", "10", 1);
    if (start_from_env()) return 3;  // once per process
    return 0;
  });
  EXPECT_TRUE(p.exited && p.code == 0) << p.describe();
  const Ended fresh = in_process([&] {
    ::setenv("DDP_TRACE", dir_.c_str(), 1);
    ::unsetenv("DDP_TRACE_MAX_EVENTS");
    ::setenv("RANK", "3", 1);
    if (!start_from_env() || !enabled()) return 1;
    instant("x", "test");
    return write_file() == (dir_ / "rank_3.json").string() ? 0 : 2;
  });
  EXPECT_TRUE(fresh.exited && fresh.code == 0) << fresh.describe();
}

}  // namespace
}  // namespace ddp::trace
