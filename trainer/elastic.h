// `train` under `ddprun --on-failure continue`: a rank dies, the others regroup
// in memory and train on (docs/elastic.md).
//
// Note [elastic training]
// With DDPRUN_ON_FAILURE=continue (LaunchEnv::elastic()) a collective that fails
// anywhere in an epoch -- a bucket's all-reduce, the non-finite check, an
// evaluation, the epoch's report -- unwinds to the epoch loop (train_epochs in
// trainer.cpp), and rejoin():
//   1. drops the Join, DDP and the communicator: its connections close, so peers
//      blocked on it fail and regroup too;
//   2. regroups (Note [elastic membership] in collectives/elastic.h): a new
//      communicator among the ranks ddprun says are left, every rank's progress
//      announced -- 4 x steps, + the step's reports done (--eval-every 1,
//      --save-every 2), 3 once the epoch's report is done -- so all know
//      the most advanced rank without a collective. A rank can be a step ahead:
//      its all-reduce completed, which means every rank had sent its gradient,
//      so that step counts (it is in the reference run too) and the others catch
//      up to it rather than it going back;
//   3. copies that rank's state to every rank (broadcasts): parameters, buffers,
//      optimizer state and steps, the step counters and the epoch's position
//      (EpochPosition: step, sampler cursor, loss sum and count). A step is thus
//      all or nothing: no rank keeps an update the others lack;
//   4. shares the epoch's remaining samples out over the new world (Note
//      [elastic resharding] in runtime/data/sampler.h) -- none skipped, none
//      twice -- rebuilds DDP and the non-finite check, finishes the step's
//      reports the failure interrupted (the position's `reports`: the
//      --eval-every evaluation, the --save-every checkpoint), and the epoch goes on.
// The new rank 0 writes the logs and checkpoints from then on (when launch
// rank 0 died, it opens them cut back to the position, Note [rows cut back],
// and writes the loss row of a step its predecessor finished but never wrote).
// The loss log is flushed every row under elastic training, so a dying writer
// loses none. The learning-rate schedule goes on by step count; steps per epoch
// grow as the world shrinks (the global batch shrinks with it), as they would
// for a run started at that size. What a regroup cannot carry on is refused
// before the first step (check_elastic): ZeRO-3 and ZeRO-1/2 without
// --zero-replicas 2 (a shard dies with its rank; with 2 replicas a regroup puts
// the state together from the shards and copies left, Note [zero replicas] in
// collectives/ddp/zero.h), --drop-last false (a Join), tasks that cannot
// reshard (Task::reshardable; the zoo's supervised and language tasks both
// can), backends other than shm and gloo.
// A replacement (ddprun --max-restarts K under continue) loads its data and
// model as any rank, then join_group() asks ddprun to join and waits; the
// members see the newer membership at a step boundary (check_membership),
// leave their communicator and regroup with it, and it takes the most
// advanced member's state like any regrouped rank: the group is whole again
// without a restart and without a file.
#pragma once

#include "collectives/communicator.h"
#include "trainer/run.h"
#include "trainer/uneven.h"

#include <chrono>

namespace ddp::train {

// Note [group stop] in collectives/elastic.h: thrown on every rank at the step
// boundary after the group's last membership formed, once --save is written;
// train exits elastic::kGroupStopExit. Its message says where the run stopped.
class GroupStopped : public Error {
  using Error::Error;
};

// ValueError naming what --on-failure continue cannot carry through a regroup.
void check_elastic(const Run& r);
// The steps left in an epoch whose first `done` steps were taken (the task's
// sampler starts past them): the batches of every rank now, at most what
// --max-steps leaves.
EpochSteps rest_of_epoch(const Task& task, const TrainOptions& o, int rank, int world_size,
                         int64_t done);
// Note [schedule span after a regroup]: on rank 0, once the epoch the group goes
// on in knows its `rest_of_this_epoch` steps, says when the schedule's span no
// longer fits the steps left (once per regroup: r.regroup_full_epoch_steps).
void note_schedule_span(Run& r, int64_t epoch, int64_t rest_of_this_epoch);
// Regroups after `failure` (Note [elastic training]); sets r.rejoin_at. Throws
// the regroup's CommError when the failure was not a rank's departure.
void rejoin(Run& r, const CommError& failure);
// A replacement (LaunchEnv::joining, DDPRUN_JOIN=1): asks ddprun to join, waits
// for the membership with it and takes the most advanced member's state; sets
// r.rejoin_at. False when the group finished before taking it in (nothing to do).
bool join_group(Run& r);
// At the end of the run: a replacement still waiting exits 0, ddprun admits no one.
void mark_done(Run& r);
// How often a member looks for a newer membership (a replacement joining), at
// step boundaries: one read of ddprun's store (`bench elastic` times it).
inline constexpr std::chrono::milliseconds kMembershipPoll{100};
// At a step boundary, at most every kMembershipPoll (DDP_TEST_JOIN_AT=STEP: at
// that step only, waiting for it): a newer membership than the rank's (a
// replacement joins) is a CommError for the epoch loop, which regroups (Note
// [elastic membership]).
void check_membership(Run& r);

}  // namespace ddp::train
