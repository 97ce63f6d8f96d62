#include "launcher/trace_merge_cli.h"

#include "launcher/process.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/trace/file.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <iostream>

namespace ddp::launcher {

const char* const kTraceMergeUsage =
    R"(usage: ddprun trace-merge DIR [--output FILE] [--run-id ID] [--restart K]

Merges the rank files DIR/rank_<R>.json that DDP_TRACE=DIR (or ddprun --trace
DIR) left into one Chrome trace, DIR/trace.json, with every rank's clock
aligned; open it in Perfetto (ui.perfetto.dev) or chrome://tracing. Files of
other runs in DIR are skipped: the run of the newest file is merged, at its
latest restart, unless --run-id names another.

  --output FILE         write FILE instead of DIR/trace.json
  --run-id ID           merge run ID (the "run_id" of the rank files)
  --restart K           merge restart K of the run (0: the first attempt, whose
                        files a restarted group keeps: rank_<R>.json; restart K's
                        are rank_<R>_restart<K>.json)
  -h, --help            this text
Exit status: 0 merged; 1 no rank file of the run in DIR; 2 bad usage.
Docs: docs/observability.md.
)";

std::string prepare_output_dir(const std::string& flag, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    throw UsageError(fmt::format("{} {}: cannot create the directory: {}; pass a writable one",
                                 flag, dir, ec ? ec.message() : "not a directory"));
  }
  DDP_CHECK_T(UsageError, ::access(dir.c_str(), W_OK | X_OK) == 0,
              "{} {}: the directory is not writable ({}); pass a writable one", flag, dir,
              std::strerror(errno));
  return std::filesystem::absolute(dir).lexically_normal().string();
}

std::string prepare_trace_dir(const LaunchOptions& o) {
  if (!o.trace_dir.empty()) return prepare_output_dir("--trace", o.trace_dir);
  const std::string inherited = env::get(env::kTrace).value_or("");
  return inherited.empty() ? "" : prepare_output_dir(env::kTrace, inherited);
}

void merge_run_trace(const std::string& dir, const std::string& run_id, int restart,
                     int world_size) {
  try {
    const trace::MergeReport report = trace::merge_trace_dir(
        dir, {.run_id = run_id, .restart = restart, .expected_ranks = world_size, .output = ""});
    say("trace: " + trace::describe(report) +
        "; open it in Perfetto (ui.perfetto.dev) or chrome://tracing");
  } catch (const std::exception& e) {  // never the run's exit status
    say(fmt::format("trace: nothing merged: {}", e.what()));
  }
}

namespace {

int parse_restart(const std::string& text) {
  int value = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  DDP_CHECK(ec == std::errc() && end == text.data() + text.size() && value >= 0,
            "--restart '{}': expected a restart number, 0 or more (0: the first attempt)", text);
  return value;
}

}  // namespace

int trace_merge_main(int argc, const char* const* argv) {
  std::string dir;
  trace::MergeOptions options;
  try {
    for (int i = 2; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "-h" || arg == "--help") {
        std::cout << kTraceMergeUsage;
        return 0;
      }
      if (arg == "--output" || arg == "--run-id" || arg == "--restart") {
        DDP_CHECK(i + 1 < argc, "{} needs a value", arg);
        const std::string value = argv[++i];
        if (arg == "--restart") {
          options.restart = parse_restart(value);
        } else {
          (arg == "--output" ? options.output : options.run_id) = value;
        }
        continue;
      }
      DDP_CHECK(!arg.starts_with("-"), "unknown option '{}'", arg);
      DDP_CHECK(dir.empty(), "one DIR only, got '{}' and '{}'", dir, arg);
      dir = arg;
    }
    DDP_CHECK(!dir.empty(), "missing DIR: the directory given to DDP_TRACE or --trace");
  } catch (const Error& e) {
    std::cerr << "ddprun trace-merge: " << e.what() << "\n\n" << kTraceMergeUsage;
    return 2;
  }
  try {
    const trace::MergeReport report = trace::merge_trace_dir(dir, options);
    for (const std::string& s : report.skipped) std::cout << "skipped " << s << "\n";
    std::cout << trace::describe(report) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ddprun trace-merge: error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace ddp::launcher
