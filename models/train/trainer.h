// The training loop behind `train`: data, model, optimizer, schedule, progress,
// evaluation, metrics and checkpoints on one device.
#pragma once

#include "models/train/train_options.h"
#include "runtime/device.h"

#include <ostream>
#include <vector>

namespace ddp::train {

struct EpochMetrics {
  int64_t epoch = 0;  // 1-based
  double train_loss = 0;
  double test_acc = 0;
  double samples_per_s = 0;  // training samples / training time (evaluation excluded)
  double step_ms = 0;
  double time_s = 0;  // the epoch's wall time, evaluation included
  float lr = 0;
  int64_t steps = 0;
};

struct TrainResult {
  std::vector<EpochMetrics> epochs;  // the epochs run by this call (not those resumed from)
  Device device;
  int64_t num_parameters = 0;
  double total_s = 0;
  int rank = 0;  // under a launcher with WORLD_SIZE > 1; only rank 0 reports
};

// Resolves --device: "auto" is default_device(); others are parsed and checked.
Device resolve_device(const std::string& text);
// Runs the whole training; progress and the summary go to `out`.
TrainResult run_training(const TrainOptions& options, std::ostream& out);

}  // namespace ddp::train
