// Running one point of the sweep: ours as `ddprun --standalone -n W train ...`,
// PyTorch DDP as W processes of bench/peer/torch_train.py that this driver
// starts itself (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; no torchrun).
//
// What is timed (Note [scale timing]): ours runs 2 epochs of --max-steps N and
// keeps the second epoch's samples_per_s from train's --metrics (the first
// epoch holds the start-up: thread pools, first-touch allocation, the shm
// segment); torch runs N untimed warmup steps, then times N steps. Both count
// all ranks' samples over the timed steps only.
#pragma once

#include "bench/scale/sweep.h"

#include <chrono>
#include <string>
#include <vector>

namespace ddp::scale {

struct Programs {
  std::string ddprun, train;  // ours
  std::string python = "/usr/bin/python3";
  std::string torch_script;        // bench/peer/torch_train.py
  std::string data = "synthetic";  // train's --data: synthetic or a Fashion-MNIST folder
  std::string device = "cpu";      // train's --device (ours only; torch runs on the CPU)
};

struct RunOptions {
  Programs programs;
  std::chrono::seconds timeout{900};  // per run; the run's processes are then stopped
  std::string work_dir;               // for the run's log and metrics files
};

// Synthetic samples for N steps per epoch on every rank: max(10000, N * global batch).
int64_t synthetic_size(const PointSpec& p);

// The command lines (argv) of one run; `metrics_path` is where train writes its JSON lines.
std::vector<std::string> ours_command(const PointSpec& p, const Programs& programs,
                                      const std::string& metrics_path);
std::vector<std::string> torch_command(const PointSpec& p, const Programs& programs);

// Runs the point and returns what it measured (timestamp and load1 set).
// Throws ddp::Error with the command and the last lines of its output when a
// process fails, times out, or prints no result.
Measurement run_point(const PointSpec& p, const RunOptions& options);

}  // namespace ddp::scale
