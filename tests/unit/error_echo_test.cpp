// Note [one error per job] (launcher/output.h): an error line another rank printed
// word for word within 10 s is echoed by rank, not repeated.
#include "launcher/output.h"

#include <gtest/gtest.h>

namespace ddp::launcher {
namespace {

using std::chrono::seconds;

TEST(ErrorEcho, NamesTheFirstRankOfTheSameLineWithinTheWindow) {
  ErrorEcho echo;
  const auto t0 = ErrorEcho::Clock::now();
  EXPECT_EQ(echo.earlier_rank("train: error: x.csv: file not found", 2, t0), -1);
  EXPECT_EQ(echo.earlier_rank("train: error: x.csv: file not found", 0, t0 + seconds(1)), 2);
  EXPECT_EQ(echo.earlier_rank("train: error: x.csv: file not found", 3, t0 + seconds(9)), 2);
  // A line that differs (a device index) is its own.
  EXPECT_EQ(echo.earlier_rank("error: device cuda:1 is not available", 1, t0), -1);
  EXPECT_EQ(echo.earlier_rank("error: device cuda:3 is not available", 3, t0), -1);
  // The same rank repeating itself is not an echo.
  EXPECT_EQ(echo.earlier_rank("error: device cuda:1 is not available", 1, t0 + seconds(1)), -1);
  // Past the window the line is new again.
  EXPECT_EQ(echo.earlier_rank("train: error: x.csv: file not found", 1, t0 + seconds(30)), -1);
}

// Healthy ranks log alike ("validation error 0.25"), and every Python traceback
// starts with the same header: neither states an error of its own.
TEST(ErrorEcho, OnlyLinesThatStateAnErrorAreEchoed) {
  EXPECT_TRUE(states_an_error("train: error: x.csv: file not found"));
  EXPECT_TRUE(states_an_error("RuntimeError: boom on purpose"));
  EXPECT_TRUE(states_an_error("torch.distributed.DistBackendError"));
  EXPECT_TRUE(states_an_error("terminate called after ... what():  boom"));
  EXPECT_TRUE(states_an_error("Error: rank 1 dies"));
  EXPECT_FALSE(states_an_error("INFO epoch 1: validation error 0.25"));
  EXPECT_FALSE(states_an_error("Traceback (most recent call last):"));
  EXPECT_FALSE(states_an_error("  File \"x.py\", line 3, in <module>"));
  EXPECT_FALSE(states_an_error("epoch 1 done: train error 0.125, Errors 0"));
  EXPECT_FALSE(states_an_error("step 10: eval error: 0.25"));
  EXPECT_FALSE(states_an_error("Top-1 Error: 12.5%, top-5 error: -"));
  EXPECT_TRUE(states_an_error("eval error: 0.25; error: x.csv: file not found"));
  EXPECT_TRUE(states_an_error("ddprun: error: 2 ranks failed"));
  EXPECT_TRUE(states_an_error("error:"));
  EXPECT_TRUE(states_an_error("error: 3 files missing"));
}

}  // namespace
}  // namespace ddp::launcher
