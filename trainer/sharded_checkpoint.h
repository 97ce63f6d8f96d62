// `train --save-sharded` (docs/train.md, "Checkpoints"): with --zero 1|2 every
// rank writes its shard of the optimizer state to shard_path(path, rank, W) and
// rank 0 writes `path`, the manifest: the model's tensors and a train
// checkpoint's metadata plus "optimizer_shards" = W, without optimizer tensors.
// Nothing is gathered, so no rank ever holds the whole state. Loading assembles
// the full state from the W files (load_checkpoint does it when the metadata
// names shards), so a sharded checkpoint resumes at any world size, ZeRO or not.
#pragma once

#include "collectives/ddp/zero.h"
#include "runtime/nn/module.h"

#include <string>
#include <vector>

namespace ddp::train {

inline constexpr const char* kShardFormat = "ddp-train-shard-v1";

// "<path>.shard<rank>of<world>", e.g. ck.safetensors.shard1of4.
std::string shard_path(const std::string& path, int rank, int world);

// Writes this rank's shard file atomically, with its range of the flat space
// (Note [zero layout] in collectives/ddp/zero.h) and the training step; throws
// ValueError rather than replace a shard of a later step (Note [never older]).
void save_optimizer_shard(const std::string& path, const ZeroOptimizer& zero, int64_t step);

// The full optimizer state ("<i>.exp_avg", "<i>.exp_avg_sq", "<i>.step" or
// "<i>.momentum_buffer", as optim::AdamW/SGD::state()) of the checkpoint `path`
// of training step `step` from its `world` shard files, for `params`.
// ValueError naming a missing shard, one of another step or world size, or
// ranges that do not tile the parameters.
nn::NamedTensors load_sharded_state(const std::string& path, int64_t world, int64_t step,
                                    const std::vector<Tensor>& params);

}  // namespace ddp::train
