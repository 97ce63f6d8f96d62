// Command-line options of `train`. Every flag is documented in kTrainUsage
// (printed by --help) and docs/train.md.
#pragma once

#include "models/zoo.h"

#include <cstdint>
#include <optional>
#include <string>

namespace ddp::train {

struct TrainOptions {
  models::ModelConfig model;
  std::string data = "/usr/share/datasets/fashion-mnist";  // or "synthetic"
  int64_t synthetic_size = 10000;  // training samples of --data synthetic (test: a fifth)
  int64_t epochs = 10;
  int64_t batch_size = 64;
  float lr = 0.02f;
  std::string optimizer = "sgd";  // sgd | adamw
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 0.0f;
  std::string lr_schedule = "cosine";  // constant | step | cosine
  int64_t warmup_steps = 0;
  uint64_t seed = 0;
  std::string device = "auto";        // auto | cpu | cpu:N | cuda | cuda:N | mps
  std::string save;                   // checkpoint written after every epoch (and --save-every)
  std::string resume;                 // checkpoint to continue from, or "auto": --save's, if any
  int64_t save_every = 0;             // also save every N steps (0: at epoch ends only)
  std::string on_nonfinite = "stop";  // stop | skip (nonfinite.h)
  std::string metrics;                // JSON lines, one per epoch
  std::string loss_log;   // one line per optimizer step: epoch, step, loss (parity checks)
  int64_t log_every = 0;  // steps between progress lines (0: a progress bar on a
                          // terminal, else one line per epoch)
  int64_t max_steps = 0;  // stop each epoch after this many steps (0: no limit)
  bool quiet = false;
  // Parallelism (docs/train.md): auto = ddp when WORLD_SIZE > 1, else single.
  std::string mode = "auto";  // auto | single | ddp | dp
  std::string devices;        // dp: comma-separated devices, e.g. "cpu,cpu" or "cuda:0,cuda:1"
  std::string backend;        // ddp: auto|local|shm|gloo|mpi|nccl ("" = DDP_BACKEND, else auto)
  double bucket_cap_mb = 25;  // ddp: gradient bucket cap (the first bucket is min(1, cap))
  std::string comm_hook = "none";  // ddp: none | bf16 | fp16 (compress buckets for the all_reduce)
  int64_t grad_accum = 1;          // micro-batches per optimizer step (ddp: all but the last
                                   // under no_sync()); --batch-size is the micro-batch
  bool sync_timing = false;        // not a flag: bench train sets it to time CUDA phases
};

// Throws ValueError (the caller prints it with the usage and exits 2).
// Returns nullopt when --help was asked for (the caller prints the usage, exit 0).
std::optional<TrainOptions> parse_train_args(int argc, const char* const* argv);
extern const char* const kTrainUsage;

}  // namespace ddp::train
