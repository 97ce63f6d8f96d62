// Multi-rank tests in real processes: spawn_ranks forks one child per rank with
// the environment contract that ddprun sets (runtime/env.h), runs a body in each,
// and collects exit statuses and each child's stderr. Never hangs: past the
// timeout the remaining children are SIGKILLed.
//
// gtest assertions inside a child are not visible to the parent: a body reports
// failure by returning non-zero or throwing (the message goes to its stderr as
// "[rank R] error: ..."); the parent asserts on the RankResults.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ddp::test {

struct SpawnOptions {
  std::chrono::milliseconds timeout{60000};  // for all ranks together; then SIGKILL
  // Extra environment variables for every rank (e.g. {"DDP_DEBUG", "detail"}).
  std::vector<std::pair<std::string, std::string>> env{};
  std::string run_id{};  // DDPRUN_RUN_ID of every rank; empty: a fresh unique_run_id()
  // Fault tests: once all these ranks exited, SIGKILL the others (e.g. a rank that
  // stopped itself) instead of waiting for them until the timeout.
  std::vector<int> wait_for{};
};

struct RankResult {
  int rank = 0;
  int exit_code = -1;              // when the child exited
  int signal = 0;                  // when a signal ended it
  bool killed_by_harness = false;  // SIGKILLed at the timeout or after `wait_for`
  std::string stderr_text;
  bool ok() const { return exit_code == 0 && signal == 0 && !killed_by_harness; }
  // "rank 1: exit code 1" (or "killed by signal 9", ...) followed by its stderr.
  std::string describe() const;
};

// Forks `n` ranks running body(rank, n); waits for all and returns them in rank order.
std::vector<RankResult> spawn_ranks(int n, const std::function<int(int rank, int size)>& body,
                                    const SpawnOptions& options = {});

// An id no other test run uses: "t<pid>-<counter>-<random>".
std::string unique_run_id();
// A TCP port on 127.0.0.1 that was free a moment ago (for MASTER_PORT).
int free_port();

// Fault injection from inside a rank's body.
enum class Fault { kill, stop };
// SIGKILL (the process dies at once, no cleanup) or SIGSTOP (it freezes) on the caller.
void inject_fault(Fault fault);

}  // namespace ddp::test
