// bench train: the training step of trainer/, split into phases, under any
// launcher (Note [bench train] in the help text of main.cpp).
#include "bench/subcommands.h"
#include "collectives/bootstrap.h"
#include "models/gpt_config.h"
#include "models/train/zoo_catalog.h"
#include "runtime/error.h"
#include "trainer/trainer.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <sstream>

namespace ddp::bench {
namespace {

// The train command line for these flags: the trainer's own parser checks them.
std::vector<std::string> train_args(const BenchOptions& o, int epochs, int world_size) {
  const std::string fashion = "/usr/share/datasets/fashion-mnist";
  const std::string model = o.flag("--model", "mlp");
  // gpt: the corpus train picks (its own default), one validation batch per epoch's
  // evaluation (outside the timed steps, but it still takes time).
  const bool gpt = models::is_gpt_model(model);
  const std::string data = o.flag(
      "--data", gpt || std::filesystem::exists(fashion) ? fashion : std::string("synthetic"));
  std::vector<std::string> args = {"train",           "--quiet",
                                   "--model",         model,
                                   "--batch-size",    o.flag("--batch-size", "64"),
                                   "--max-steps",     o.flag("--steps", "300"),
                                   "--epochs",        std::to_string(epochs),
                                   "--lr-schedule",   "constant",
                                   "--mode",          o.flag("--mode", "auto"),
                                   "--bucket-cap-mb", o.flag("--bucket-cap-mb", "25"),
                                   "--comm-hook",     o.flag("--comm-hook", "none"),
                                   "--grad-accum",    o.flag("--grad-accum", "1")};
  if (!gpt || o.extra.contains("--data")) {
    args.emplace_back("--data");
    args.push_back(data);
  }
  if (gpt) {
    args.emplace_back("--eval-batches");
    args.emplace_back("1");
  }
  for (const char* flag : {"--hidden", "--devices"}) {
    if (o.extra.contains(flag)) {
      args.emplace_back(flag);
      args.push_back(o.extra.at(flag));
    }
  }
  // Under a launcher every rank binds its own device (cuda:LOCAL_RANK or cpu).
  if (world_size <= 1) {
    args.emplace_back("--device");
    args.push_back(o.device.str());
  }
  return args;
}

}  // namespace

int run_train_bench(const BenchOptions& o, const Reporter& reporter) {
  const int world_size = read_launch_env().world_size;
  const int repeats = o.repeats.value_or(3);
  const int warmup = o.warmup.value_or(1);
  const std::vector<std::string> args = train_args(o, warmup + repeats, world_size);
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::optional<train::TrainOptions> options;
  try {
    options =
        train::parse_train_args(static_cast<int>(argv.size()), argv.data(), models::zoo_catalog());
  } catch (const ValueError& e) {
    // A usage error, as main's own flag errors (exit code 2).
    std::cerr << "bench: " << e.what() << "\n(run `bench train --help` for usage)\n";
    return 2;
  }
  DDP_CHECK(options.has_value(), "bench train: --help is handled by bench");
  options->sync_timing = true;
  std::ostringstream quiet;
  const train::TrainResult result = train::run_training(*options, quiet);
  if (result.rank != 0) return 0;
  // Warmup epochs first; then the median epoch by throughput.
  std::vector<train::EpochMetrics> measured(result.epochs.begin() + warmup, result.epochs.end());
  DDP_CHECK(!measured.empty(), "bench train: no measured epoch");
  std::sort(measured.begin(), measured.end(),
            [](const auto& a, const auto& b) { return a.samples_per_s < b.samples_per_s; });
  const train::EpochMetrics& m = measured[measured.size() / 2];
  const double step = m.step_ms;
  Row row;
  row.add("model", o.flag("--model", "mlp"))
      .add("mode", result.mode)
      .add("world", result.world_size)
      .add("batch", options->batch_size)
      .add("bucket_mb", options->bucket_cap_mb, 1)
      .add("hook", options->comm_hook)
      .add("samples_per_s", m.samples_per_s, 0)
      .add("tokens_per_s", m.tokens_per_s, 0)
      .add("step_ms", step, 3)
      .add("data_ms", m.data_ms, 3)
      .add("forward_ms", m.forward_ms, 3)
      .add("backward_ms", m.backward_ms, 3)
      .add("exposed_ms", m.comm_exposed_ms, 3)
      .add("optimizer_ms", m.optimizer_ms, 3)
      .add("comm_ms", m.comm_ms, 3)
      .add("overlap", m.overlap(), 2)
      .add("exposed_pct", step > 0 ? 100.0 * m.comm_exposed_ms / step : 0.0, 1)
      .add("steps", m.steps)
      .add("device", result.device.str());
  reporter.section(fmt::format("train step: median of {} epochs of {} steps after {} warmup",
                               repeats, m.steps, warmup),
                   {row});
  return 0;
}

}  // namespace ddp::bench
