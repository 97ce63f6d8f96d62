#include "runtime/logging.h"

#include "runtime/env.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <mutex>

namespace ddp {
namespace {

std::string pattern(int rank, int world_size) {
  return fmt::format("[%Y-%m-%d %H:%M:%S.%e] [rank {}/{}] [%l] %v", rank, world_size);
}

std::shared_ptr<spdlog::logger> make_logger() {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto log = std::make_shared<spdlog::logger>("ddp", sink);
  log->set_pattern(pattern(0, 1));
  log->set_level(spdlog::level::info);
  const auto text = env::get(env::kLogLevel);
  if (text) {
    const auto level = spdlog::level::from_str(*text);
    // from_str maps unknown names to off; accept only the real names.
    if (level == spdlog::level::off && *text != "off") {
      log->warn(
          "{}='{}' is not a log level (valid: trace, debug, info, warn, error, off); using info",
          env::kLogLevel, *text);
    } else {
      log->set_level(level);
    }
  }
  return log;
}

}  // namespace

// Note [logger lifetime]
// The logger is made on first use and never destroyed. Threads may still log
// while the process exits: the flight recorder's detached SIGUSR1 dump thread
// (collectives/flight/flight_recorder.cpp), whose dump may end as exit() runs
// the static destructors. A function-static shared_ptr was destroyed there and
// the thread's next line called through a freed logger: a SIGSEGV at exit, seen
// once in six runs under a stream of SIGUSR1. Test: unit.LoggingDeathTest.
spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger>* log = new std::shared_ptr<spdlog::logger>(make_logger());
  return **log;
}

void set_log_rank(int rank, int world_size) {
  logger().set_pattern(pattern(rank, world_size));
}

}  // namespace ddp
