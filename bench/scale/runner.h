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

namespace ddp::scaling {

// Note [program contract]: `scale --program PATH -- ARGS` sweeps a program of one's
// own as it sweeps train: `ddprun --standalone -n W [--backend B] PATH ARGS
// --batch-size N --epochs 2 --max-steps S --metrics FILE`. The program must take
// those four flags (N samples per step and rank; stop each epoch after S steps;
// append one JSON object per epoch to FILE) and write, in each row, "samples_per_s"
// (all ranks' training samples per second of the epoch, evaluation left out) and,
// optionally, "step_ms", "comm_exposed_ms" and "tokens_per_s". A program built on
// train_main (trainer/train_main.h) keeps it without a line of its own.
struct Programs {
  std::string ddprun, train;                   // ours
  std::string program = {};                    // --program: run in place of train
  std::vector<std::string> program_args = {};  // its arguments (after scale's --)
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

}  // namespace ddp::scaling
