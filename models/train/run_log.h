// What `train` appends to files as it goes: --metrics (a JSON object per epoch) and
// --loss-log (a line per step). After a resume, rows the crashed run already wrote
// are not written again (Note [no replayed rows] in run_log.cpp).
#pragma once

#include "models/train/trainer.h"
#include "runtime/tensor.h"

#include <fstream>
#include <string>

namespace ddp::train {

// Opens `path` for appending now, so an unwritable path fails before the first
// step. ValueError names the flag, the path and the system's reason.
std::ofstream open_for_append(const std::string& flag, const std::string& path);
// Creates and removes `<path>.tmp.<pid>` (the name a save writes first), so a
// directory that is missing or not writable fails before the first step.
void check_can_create(const std::string& flag, const std::string& path);

class MetricsLog {
 public:
  // resumed: skip rows whose "step" is not beyond the file's last row.
  MetricsLog(const std::string& path, bool resumed);
  // `step`: training steps at the end of the epoch (all epochs counted).
  void write(const EpochMetrics& m, int64_t step, int world_size, const std::string& mode);

 private:
  std::ofstream file_;
  int64_t last_step_ = -1;  // the last step already in the file (resumed runs)
};

// --loss-log: "epoch step loss" per optimizer step, the loss of the step's last
// micro-batch at full float precision (bench/gpu/run.sh compares CPU and CUDA runs
// step by step). Reading the loss synchronizes a GPU every step, so only on request.
class LossLog {
 public:
  LossLog(const std::string& path, bool resumed);
  void step(int64_t epoch, int64_t step, const Tensor& loss, int64_t grad_accum);

 private:
  std::ofstream file_;
  int64_t last_epoch_ = -1, last_step_ = -1;  // the last row already in the file
};

}  // namespace ddp::train
