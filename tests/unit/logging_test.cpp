// The process's logger (runtime/logging.h): threads that are still logging while
// the process exits (the flight recorder's detached SIGUSR1 dump thread, Note
// [logger lifetime] in logging.cpp) do not touch a destroyed logger.
#include "runtime/logging.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

namespace ddp {
namespace {

// Two detached threads log as fast as they can while the main thread returns
// through exit(), which runs the static destructors. Their output goes to
// /dev/null. Without the fix this child died of SIGSEGV, or under ASan hung in a
// freed logger (the alarm ends it).
void log_while_exiting() {
  ::alarm(30);  // a child stuck on a freed logger ends (SIGALRM) instead of hanging
  const int null_fd = ::open("/dev/null", O_WRONLY);
  if (null_fd < 0 || ::dup2(null_fd, STDERR_FILENO) < 0) std::_Exit(2);
  // ctest runs the tests with DDP_LOG_LEVEL=warn: at that level an info line would
  // return after the level check, which reads too little of a freed logger to crash.
  logger().set_level(spdlog::level::info);
  DDP_LOG_INFO("the logger exists before the threads start");
  for (int t = 0; t < 2; ++t) {
    std::thread([t] {
      for (long i = 0;; ++i) DDP_LOG_INFO("thread {} line {}", t, i);
    }).detach();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::exit(0);
}

TEST(LoggingDeathTest, ThreadsMayLogWhileTheProcessExits) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (int run = 0; run < 5; ++run) {
    EXPECT_EXIT(log_while_exiting(), ::testing::ExitedWithCode(0), "") << "run " << run;
  }
}

}  // namespace
}  // namespace ddp
