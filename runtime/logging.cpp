#include "runtime/logging.h"

#include "runtime/env.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <mutex>

namespace ddp {
namespace {

std::string pattern(int rank, int world_size) {
  return fmt::format("[%Y-%m-%d %H:%M:%S.%e] [rank {}/{}] [%l] %v", rank, world_size);
}

// The pattern set last, for a sink added later.
std::string& current_pattern() {
  static std::string* p = new std::string(pattern(0, 1));
  return *p;
}

// Lines to a function (set_log_writer).
class WriterSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit WriterSink(std::function<void(std::string_view)> write) : write_(std::move(write)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    write_(std::string_view(line.data(), line.size()));
  }
  void flush_() override {}

 private:
  std::function<void(std::string_view)> write_;
};

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
  current_pattern() = pattern(rank, world_size);
  logger().set_pattern(current_pattern());
}

void set_log_writer(std::function<void(std::string_view)> write) {
  auto& sinks = logger().sinks();
  sinks.clear();
  sinks.push_back(std::make_shared<WriterSink>(std::move(write)));
  logger().set_pattern(current_pattern());
}

}  // namespace ddp
