// The subcommands of the `bench` program and the options they share.
//
// A subcommand is a (name, summary, help, run) entry in the registry in
// main.cpp; adding one (`bench allreduce`, `bench train`) is one function and
// one line there. main.cpp parses and checks the flags, so a run function gets
// an available device and valid counts.
#pragma once

#include "bench/table.h"
#include "bench/timing.h"
#include "runtime/device.h"

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ddp::bench {

// A subcommand's bad flag value: exit 2, as the driver's own usage errors.
struct SubcommandUsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct BenchOptions {
  Device device = Device::cpu();
  bool json = false;
  std::optional<int> repeats;  // --repeats: overrides every measurement's default
  std::optional<int> warmup;   // --warmup
  // Flags of one subcommand (Subcommand::flags), by name ("--min-bytes" -> "4").
  std::map<std::string, std::string, std::less<>> extra;

  std::string flag(std::string_view name, std::string_view fallback) const {
    auto it = extra.find(name);
    return it == extra.end() ? std::string(fallback) : it->second;
  }

  // A measurement's defaults with the user's --repeats/--warmup applied.
  TimingOptions timing(int default_warmup, int default_repeats, double min_sample_ms = 0.0) const {
    return {.warmup = warmup.value_or(default_warmup),
            .repeats = repeats.value_or(default_repeats),
            .min_sample_ms = min_sample_ms};
  }
};

// Returns the process exit code: 0 on success, 1 when a check fails. Throws
// ddp::Error on failures of the runtime (main reports them and exits 1).
using SubcommandFn = int (*)(const BenchOptions& options, const Reporter& reporter);

struct Subcommand {
  std::string_view name;
  std::string_view summary;  // one line, for `bench --help`
  std::string_view help;     // what it measures and its defaults, for `bench <name> --help`
  SubcommandFn run;
  std::string_view flags = "";  // its own value flags, space separated ("--min-bytes --iters")
};

int run_device_bench(const BenchOptions& options, const Reporter& reporter);
int run_gemm_bench(const BenchOptions& options, const Reporter& reporter);
int run_allreduce_bench(const BenchOptions& options, const Reporter& reporter);
int run_train_bench(const BenchOptions& options, const Reporter& reporter);
int run_gpt_bench(const BenchOptions& options, const Reporter& reporter);
int run_join_bench(const BenchOptions& options, const Reporter& reporter);
int run_elastic_bench(const BenchOptions& options, const Reporter& reporter);
int run_flight_bench(const BenchOptions& options, const Reporter& reporter);
int run_trace_bench(const BenchOptions& options, const Reporter& reporter);
int run_trace_step_bench(const BenchOptions& options, const Reporter& reporter);

}  // namespace ddp::bench
