// Training checkpoints: one safetensors file with the model's state_dict under
// PyTorch's names ("1.weight", ...), the optimizer's state under "optimizer.<i>.<buffer>",
// and metadata: format, model, optimizer, epoch (completed), step, seed, lr, and where
// the run stands inside an epoch (Note [resume mid-epoch] in checkpoint.cpp).
// Written atomically (runtime/checkpoint/safetensors.h), never over a newer one.
#pragma once

#include "runtime/nn/module.h"
#include "runtime/optim/optimizer.h"

#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>

namespace ddp::train {

inline constexpr const char* kCheckpointFormat = "ddp-train-v1";
inline constexpr const char* kOptimizerPrefix = "optimizer.";

struct CheckpointInfo {
  std::string model;      // the task's model_spec()
  std::string optimizer;  // "sgd" | "adamw"
  int64_t epoch = 0;      // completed epochs
  int64_t step = 0;       // training steps taken, skipped ones (--on-nonfinite skip) included
  uint64_t seed = 0;
  // Inside epoch `epoch` (0-based): the steps already taken in it (0 at an epoch
  // boundary), the sum of their losses (for the epoch's train_loss) and the global
  // batch they were cut with (--batch-size x --grad-accum x world size).
  int64_t epoch_step = 0;
  float epoch_loss_sum = 0;
  int64_t epoch_loss_count = 0;  // micro-batches in epoch_loss_sum (skipped steps left out)
  int64_t global_batch = 0;
  int64_t skipped_steps = 0;  // steps whose update --on-nonfinite skip left out
  // --save-sharded: the optimizer state is in this many shard files next to the
  // checkpoint, not in it (trainer/sharded_checkpoint.h); 0: in it.
  int64_t optimizer_shards = 0;
  // --save-sharded at --zero 3: the parameters are in the shard files too, and the
  // checkpoint holds none of them (Note [zero-3 shard files]); metadata zero3_shards.
  bool zero3_shards = false;
  // --save-best / --early-stop (Note [best so far] in epoch.cpp): the best value of
  // the monitored metric so far (NaN: no evaluation yet) and the evaluations since.
  double best_metric = std::numeric_limits<double>::quiet_NaN();
  int64_t evals_since_best = 0;
  // Language models: what a token of the training data was, "byte" (text as
  // bytes) or "token" (token shards: GPT-2's BPE when `tokenize` wrote them), so
  // that `sample` decodes what it generates the same way; empty otherwise.
  std::string text_unit{};
  // The training set's size (Task::train_size; 0: unknown, older files): a
  // mid-epoch position holds only for data of this size. Last: position() in
  // epoch.cpp fills the fields above in order.
  int64_t train_size = 0;
  // What the targets make the run: "classification", "regression" or "language
  // model" (task_kind; empty: older files). The monitored best (best_metric) is
  // test_acc, test_loss or val_loss accordingly, so a resume must keep it.
  std::string task{};
  // Mid-epoch: the sampler positions of the epoch its steps took (Note [elastic
  // resharding]), which differ from epoch_step x global batch once a regroup
  // changed the world size inside the epoch; -1: not recorded (older files).
  int64_t epoch_cursor = -1;
  // --save-sharded: the id every shard file of this save carries (metadata
  // shard_save_id; empty: not sharded, or an older file), so a loader refuses a
  // shard of another save.
  std::string shard_save_id{};
  // The optimizer steps the run's --lr-schedule spanned (LrSchedule::total_steps;
  // metadata schedule_steps; 0: older files), so that a resume that plans another
  // span (other --epochs or --max-steps) says where its lr moves.
  int64_t schedule_steps = 0;
};

// "classification", "regression" or "language model".
std::string task_kind(bool language_model, bool regression);

// What the metadata of an existing checkpoint says, read from its header alone.
struct CheckpointHeader {
  int64_t step = 0;
  int64_t epoch = 0;
};
// nullopt when `path` does not exist; ValueError naming the path when it exists but
// is not a readable train checkpoint.
std::optional<CheckpointHeader> read_checkpoint_header(const std::string& path);

// Throws ValueError, before writing anything, when `path` holds a checkpoint of a
// later step (Note [never older]). Removes stale `<path>.tmp.<pid>` files of dead
// processes first (Note [stale temporary files]); `removed` gets their names.
// never_older false (--save-best: the best is not the latest) replaces any file.
void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer& optimizer, const CheckpointInfo& info,
                     std::vector<std::string>* removed = nullptr, bool never_older = true);
// The "model" of a train checkpoint's metadata (the task's model_spec: "784-256-10", a gpt spec),
// read from its header; ValueError naming the path when it is not one.
std::string read_checkpoint_model(const std::string& path);
// The checkpoint's text_unit ("byte" for checkpoints written before it was recorded).
std::string read_checkpoint_text_unit(const std::string& path);
// Loads the model's tensors alone (the optimizer's are left out), strictly: every
// tensor of the model present with its shape (a --zero 3 sharded checkpoint's
// parameters from its shard files). ValueError naming the path otherwise.
void load_model_weights(const std::string& path, nn::Module& model);

// Loads model and optimizer state in place; throws ValueError naming the file when it
// was written for another model or optimizer, or tensors are missing or mis-shaped.
// Files without the mid-epoch fields (older ones) load as epoch boundaries. A
// sharded checkpoint (optimizer_shards) is read with its shard files, whatever
// the world size, ZeRO stage or mode of this run (trainer/sharded_checkpoint.h).
// `same_model(saved)` says whether the checkpoint's model spec is this run's model
// (Task::resumes_from); empty: the spec must equal expected_model.
CheckpointInfo load_checkpoint(const std::string& path, nn::Module& model,
                               optim::Optimizer& optimizer, const std::string& expected_model,
                               const std::function<bool(const std::string&)>& same_model = {});

}  // namespace ddp::train
