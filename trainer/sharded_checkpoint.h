// `train --save-sharded` (docs/train.md, "Checkpoints"): with --zero 1|2|3 every
// rank writes its shard of the optimizer state to shard_path(path, rank, W, step)
// and rank 0 writes `path`, the manifest: the model's tensors and a train
// checkpoint's metadata plus "optimizer_shards" = W, without optimizer tensors.
// Nothing is gathered, so no rank ever holds the whole state. Loading assembles
// the full state from the W files (load_checkpoint does it when the metadata
// names shards), so a sharded checkpoint resumes at any world size, ZeRO or not.
//
// Note [shard generations]: the manifest's rename is the save's one commit point,
// so the shard files it names must outlive a save that does not finish. Each save
// writes files of its own step (PATH.shard<r>of<W>.step<N>), never over the ones
// the current manifest names; only once every rank knows the new manifest is in
// place (a barrier after rank 0 renamed it) are the other generations removed
// (remove_other_shard_generations). A kill at any moment leaves the old manifest
// with its shards, or the new one with its own; files of a save that did not
// finish are removed by the next. (Until 2026-12-01 the files were PATH.shard<r>of<W>,
// overwritten in place: a kill between the shards and the manifest left neither
// checkpoint whole. Such files still load.)
//
// Note [zero-3 shard files]: at --zero 3 the parameters are sharded too, so they
// go to the shard files and the manifest (metadata "zero3_shards" = "1") holds
// none (only the model's buffers, which are not sharded). A rank's file (metadata
// "layout" = "zero3", "rank", "world_size", "step") holds, for every unit u with
// parameters (Note [zero-3 units] in collectives/ddp/fully_shard.h), this rank's
// block of the unit's flat space (Note [zero-3 layout]: B_u elements, rank r's
// [r B_u, (r + 1) B_u)): "unit<u>.param" and the state "unit<u>.exp_avg",
// "unit<u>.exp_avg_sq" or "unit<u>.momentum_buffer" (none before the first step),
// and AdamW's "step", one count per optimizer parameter. Metadata "unit<u>" lists
// the unit's parameter names in its order and "optimizer_params" the optimizer's
// (the order of "step"), so a loader needs neither the unit policy nor the saving
// optimizer: it concatenates the W blocks of a unit, whose first N_u elements
// (the sum of its parameters' sizes) it cuts by name.
#pragma once

#include "collectives/ddp/zero.h"
#include "runtime/nn/module.h"

#include <string>
#include <vector>

namespace ddp::train {

inline constexpr const char* kShardFormat = "ddp-train-shard-v1";
inline constexpr const char* kZero3Layout = "zero3";  // Note [zero-3 shard files]

// "<path>.shard<rank>of<world>.step<step>", e.g. ck.safetensors.shard1of4.step300.
std::string shard_path(const std::string& path, int rank, int world, int64_t step);

// Writes this rank's shard file of `step` atomically, with its range of the flat
// space (Note [zero layout] in collectives/ddp/zero.h) and the training step; at
// stage 3 (after attach()) its blocks of every unit's parameters and state (Note
// [zero-3 shard files]). Files of other steps are left alone (Note [shard
// generations]); a later checkpoint is protected by the manifest's own check (Note
// [never older]).
// `save_id`: the same on every rank's file of one save and in its manifest
// (CheckpointInfo::shard_save_id), so a loader refuses a shard of another save
// that has the right step, rank and world size (another run's, copied in).
void save_optimizer_shard(const std::string& path, const ZeroOptimizer& zero, int64_t step,
                          const std::string& save_id);

// Once the manifest `path` names step `keep_step`: removes the shard files of
// `path` of every other step (and of the naming before generations), of rank
// `rank` only, or of every rank for -1, and temporary shard files whose writer is
// gone. Returns the files removed (Note [shard generations]).
std::vector<std::string> remove_other_shard_generations(const std::string& path, int rank,
                                                        int64_t keep_step);

// The full optimizer state ("<i>.exp_avg", "<i>.exp_avg_sq", "<i>.step" or
// "<i>.momentum_buffer", as optim::AdamW/SGD::state()) of the checkpoint `path`
// of training step `step` from its `world` shard files, for `params`.
// ValueError naming a missing shard, one of another step or world size, or
// ranges that do not tile the parameters, or (save_id not empty) a shard of
// another save.
nn::NamedTensors load_sharded_state(const std::string& path, int64_t world, int64_t step,
                                    const std::vector<Tensor>& params,
                                    const std::string& save_id = "");

// A --zero 3 sharded checkpoint (Note [zero-3 shard files]) from its `world` shard
// files next to `path`, for `model`: its parameters by name, and the full state
// ("<i>.exp_avg", ... as load_sharded_state) for `optimizer_params`, i their
// index there (each must be a parameter of `model`; empty: no state is built).
// ValueError naming a missing shard file, one of another step, rank or world
// size, a unit whose blocks do not cover its parameters, or a parameter name
// missing from the model or the files.
struct Zero3Checkpoint {
  nn::NamedTensors parameters;
  nn::NamedTensors optimizer;
};
Zero3Checkpoint load_zero3_shards(const std::string& path, int64_t world, int64_t step,
                                  const nn::Module& model,
                                  const std::vector<Tensor>& optimizer_params,
                                  const std::string& save_id = "");

}  // namespace ddp::train
