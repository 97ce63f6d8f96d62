// train --drop-last false: epochs whose ranks take different numbers of steps.
//
// Note [uneven epochs]: --drop-last chooses what happens when the ranks cannot
// share the training set evenly. pad (mlp, cnn default) repeats samples up to a
// multiple of the world size, as PyTorch's DistributedSampler(drop_last=False);
// true drops the set's tail (DistributedSampler(drop_last=True)) and each rank's
// short last batch (DataLoader(drop_last=True)) -- the gpt default, whose windows
// are never padded; false does neither: every sample is shared out exactly once,
// rank r taking ceil((N - r) / W) of them and its short last batch, so the ranks'
// step counts (batches / --grad-accum, at most --max-steps) can differ by one.
// (A rank's micro-batches beyond its last full step of --grad-accum are not
// trained on, as under any --drop-last; nor are those beyond --max-steps.) Every
// rank computes every rank's count from N, W and the batch size, so they agree
// without communication on the epoch's length (the most any rank takes, rank
// 0's) and on whether the counts differ. When they do, the epoch runs under a
// Join (collectives/ddp/join.h): a rank out of data shadows each remaining step
// -- the join count, the zero buckets -- and then runs the rest of the step as
// the others do (the non-finite check, clipping and the optimizer's update on the
// averaged gradient it received, progress, evaluation, checkpoints), so its model
// and optimizer state never differ from the ranks that train and every per-step
// collective of the loop is matched; after the last step Join::finish() syncs the
// model from the highest-ranked rank with the most steps (the last to join; for
// 98 samples, 3 ranks and batches of 16, rank 1). A shadowed step is not a step
// for the flight recorder's step marks (Note [straggler report]): nearly all of
// it is waiting, which says nothing about the rank's speed. --join-divide picks
// the average: world (the sum over the ranks that train / W, PyTorch's default)
// or active (/ their count). When the counts do not differ (N divides, or only
// the last batch is short) there is no Join and no count all-reduce. Rank 0
// always has the most data, so its train_loss covers every step; samples_per_s
// counts the samples the ranks trained on (step_samples), not rank 0's times W.
#pragma once

#include "trainer/task.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ddp::train {

struct EpochSteps {
  int64_t steps = 0;             // the epoch's length: the most steps any rank takes
  int64_t mine = 0;              // this rank's
  bool uneven = false;           // some rank takes fewer than `steps`: the epoch needs a Join
  std::vector<int64_t> of_rank;  // every rank's steps
};

// From every rank's batches per epoch: a rank takes batches / grad_accum steps,
// at most max_steps (0: no limit). Throws ValueError when no rank has
// grad_accum batches (no step would run).
EpochSteps epoch_steps(const std::vector<int64_t>& batches, int64_t batch_size, int64_t grad_accum,
                       int64_t max_steps, int rank);
// The same for the task's ranks (Task::num_batches_of) and the options.
EpochSteps epoch_steps(const Task& task, const TrainOptions& o, int rank, int world_size);
// The samples every rank trains on in step `step` (0-based) of the epoch: rank
// q's rows of its batches step * k .. step * k + k - 1 (batch_rows(q, b)), for the
// ranks that train that step only: a rank that shadows it adds none, even with
// micro-batches left over.
int64_t step_samples(const EpochSteps& plan, int64_t step, int64_t grad_accum,
                     const std::function<int64_t(int rank, int64_t batch)>& batch_rows);
// The header's line on --drop-last false under DDP ("" otherwise): the ranks' step
// counts and whether, and how, they join.
std::string describe_uneven(const Task& task, const TrainOptions& o, int world_size);

}  // namespace ddp::train
