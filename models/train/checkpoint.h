// Training checkpoints: one safetensors file with the model's state_dict under
// PyTorch's names ("1.weight", ...), the optimizer's state under "optimizer.<i>.<buffer>",
// and metadata: format, model, optimizer, epoch (completed), step, seed, lr.
// Written atomically (runtime/checkpoint/safetensors.h).
#pragma once

#include "runtime/nn/module.h"
#include "runtime/optim/optimizer.h"

#include <map>
#include <string>

namespace ddp::train {

inline constexpr const char* kCheckpointFormat = "ddp-train-v1";
inline constexpr const char* kOptimizerPrefix = "optimizer.";

struct CheckpointInfo {
  std::string model;      // models::describe()
  std::string optimizer;  // "sgd" | "adamw"
  int64_t epoch = 0;      // completed epochs
  int64_t step = 0;       // optimizer steps
  uint64_t seed = 0;
};

void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer& optimizer, const CheckpointInfo& info);
// Loads model and optimizer state in place; throws ValueError naming the file when it
// was written for another model or optimizer, or tensors are missing or mis-shaped.
CheckpointInfo load_checkpoint(const std::string& path, nn::Module& model,
                               optim::Optimizer& optimizer, const std::string& expected_model);

}  // namespace ddp::train
