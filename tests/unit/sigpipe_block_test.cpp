// comm::SigpipeBlock (Note [gloo SIGPIPE]): inside one, a write to a closed pipe
// fails with EPIPE instead of ending the process; afterwards the thread's mask is
// what it was and no SIGPIPE is left pending. Each case runs in a forked child
// (a gtest death test), since the failure mode is the process being killed.
#include "collectives/sigpipe_block.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace ddp::comm {
namespace {

// Writes to a pipe whose read end is closed; returns the write's errno (0 if it wrote).
int write_to_closed_pipe() {
  int fds[2];
  if (pipe(fds) != 0) std::abort();
  close(fds[0]);
  const char byte = 'x';
  const ssize_t n = write(fds[1], &byte, 1);
  const int error = n < 0 ? errno : 0;
  close(fds[1]);
  return error;
}

bool sigpipe_blocked() {
  sigset_t mask;
  pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  return sigismember(&mask, SIGPIPE) == 1;
}

bool sigpipe_pending() {
  sigset_t pending;
  sigpending(&pending);
  return sigismember(&pending, SIGPIPE) == 1;
}

// Exit codes of the children: 0 is success, others name the failed check.
void inside_then_after() {
  int error = 0;
  {
    const SigpipeBlock block;
    error = write_to_closed_pipe();
  }
  if (error != EPIPE) std::_Exit(2);
  if (sigpipe_blocked()) std::_Exit(3);
  if (sigpipe_pending()) std::_Exit(4);
  std::_Exit(0);
}

TEST(SigpipeBlockDeathTest, WriteToAClosedPipeFailsWithEpipeInsteadOfKilling) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(inside_then_after(), ::testing::ExitedWithCode(0), "");
}

// The control: the same write without the block ends the process, so the case
// above can fail.
TEST(SigpipeBlockDeathTest, WithoutTheBlockTheSameWriteKills) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        signal(SIGPIPE, SIG_DFL);
        write_to_closed_pipe();
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGPIPE), "");
}

// A thread that had SIGPIPE blocked already (the communication thread) keeps it blocked.
TEST(SigpipeBlockDeathTest, AnAlreadyBlockedMaskIsKept) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        sigset_t pipe_set;
        sigemptyset(&pipe_set);
        sigaddset(&pipe_set, SIGPIPE);
        pthread_sigmask(SIG_BLOCK, &pipe_set, nullptr);
        { const SigpipeBlock block; }
        std::_Exit(sigpipe_blocked() ? 0 : 5);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace ddp::comm
