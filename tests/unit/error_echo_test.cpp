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

}  // namespace
}  // namespace ddp::launcher
