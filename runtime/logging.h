// Logging through spdlog, every line prefixed with the rank:
//   [2026-11-22 10:00:00.123] [rank 0/4] [info] message
// The level comes from DDP_LOG_LEVEL (trace, debug, info, warn, error, off;
// default info). Until a communicator exists the prefix is "rank 0/1".
#pragma once

#include "runtime/fmt.h"  // before spdlog: Note [fmt's engine in every object]

#include <spdlog/spdlog.h>

#include <functional>
#include <string_view>

namespace ddp {

// The process-wide logger (created on first use, writes to stderr).
spdlog::logger& logger();
// Changes the prefix of every later line to "[rank R/W]".
void set_log_rank(int rank, int world_size);
// Sends every later line (formatted, newline included) to `write` instead of
// stderr: ddprun's console queue (Note [a console that does not read] in
// launcher/process.h). Call before other threads log.
void set_log_writer(std::function<void(std::string_view)> write);

}  // namespace ddp

#define DDP_LOG_TRACE(...) ::ddp::logger().trace(__VA_ARGS__)
#define DDP_LOG_DEBUG(...) ::ddp::logger().debug(__VA_ARGS__)
#define DDP_LOG_INFO(...) ::ddp::logger().info(__VA_ARGS__)
#define DDP_LOG_WARN(...) ::ddp::logger().warn(__VA_ARGS__)
#define DDP_LOG_ERROR(...) ::ddp::logger().error(__VA_ARGS__)
