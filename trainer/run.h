// Internal to `train`: the state of a run on one rank, shared by its setup
// (trainer.cpp: data, model, DDP, resume, logs) and its epochs (epoch.cpp: the
// steps, the metrics, the checkpoints).
#pragma once

#include "collectives/bootstrap.h"
#include "collectives/data_parallel/data_parallel.h"
#include "collectives/ddp/distributed_data_parallel.h"
#include "collectives/ddp/join.h"
#include "collectives/ddp/zero.h"
#include "runtime/autograd/autocast.h"
#include "runtime/cuda_graph.h"
#include "trainer/checkpoint.h"
#include "trainer/faults.h"
#include "trainer/nonfinite.h"
#include "trainer/run_log.h"
#include "trainer/task.h"
#include "trainer/trainer.h"

#include <chrono>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

namespace ddp::train {

// Seconds from `start` to now on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Where an epoch stands after its last completed step (Note [elastic training]
// in elastic.h): what a regrouped rank copies from the most advanced one.
struct EpochPosition {
  int64_t epoch = 0;         // 0-based
  int64_t step = 0;          // steps completed in it
  int64_t cursor = 0;        // sampler positions taken by them (Note [elastic resharding])
  Tensor loss_sum{};         // the epoch's running loss sum (a device scalar), and its counts
  float loss_sum_value = 0;  // loss_sum's value, after a regroup
  int64_t micro_batches = 0, samples = 0, tokens = 0;
  // The reports due after the step that are done: 0 none, 1 the --eval-every
  // evaluation, 2 all (the --save-every checkpoint too). A regroup finishes them.
  int64_t reports = 2;
};

// --cuda-graph: the captured training step (Note [graphed steps] in epoch.cpp).
struct GraphedStep {
  CudaGraph graph;
  Batch batch{};            // the graph's inputs: each step's batch is copied in
  Tensor loss{};            // the graph's loss, rewritten by each replay
  Tensor grad_norm{};       // its gradient norm before clipping (--clip-grad-norm)
  int64_t eager_steps = 0;  // steps taken before the capture
  bool off = false;         // the capture failed: every step is eager
};

struct Run {
  const TrainOptions& o;
  std::ostream& out;
  Device device;
  // --precision bf16 on CUDA: each forward (training and evaluation) runs under an
  // AutocastGuard of this state (Note [autocast]); disabled otherwise.
  AutocastState autocast{};
  std::unique_ptr<Task> task{};
  std::shared_ptr<nn::Module> model{};
  std::unique_ptr<optim::Optimizer> optimizer{};
  std::unique_ptr<GraphedStep> graphed{};  // --cuda-graph
  // --profile-steps: the op profile is on from step profile_first (docs/profile.md);
  // profile_taken: it was (or could not be) started, once a run; profile_from: the
  // first step it may start at (first_profiled_step; -1 until the first step).
  bool profiling = false;
  bool profile_taken = false;
  int64_t profile_first = 0;
  int64_t profile_from = -1;
  optim::LrSchedule schedule{};
  int64_t first_epoch = 0;
  // World size > 1 only (launched by ddprun, mpirun, srun): the process group and
  // the model wrapped in DistributedDataParallel.
  ProcessGroup* pg = nullptr;
  std::unique_ptr<DistributedDataParallel> ddp{};
  ZeroOptimizer* zero = nullptr;  // --zero 1|2|3: `optimizer`, sharded
  // --zero 3: the task's evaluation in lockstep (Note [lockstep evaluation]).
  EvalLockstep eval_lockstep{};
  int world_size = 1;
  std::string mode = "single";  // single | ddp | dp
  // --mode dp: the model wrapped in DataParallel over --devices (device = devices[0]).
  std::unique_ptr<DataParallel> dp{};
  // Where the run stands (Note [resume mid-epoch] in checkpoint.cpp).
  int64_t step = 0;          // training steps of the whole run, skipped ones included
  CheckpointInfo resumed{};  // epoch, epoch_step and epoch_loss_sum to start from
  bool did_resume = false;
  std::unique_ptr<MetricsLog> metrics{};
  std::unique_ptr<LossLog> loss_log{};
  std::unique_ptr<NonfiniteCheck> nonfinite{};
  TestFaults faults{};
  // --clip-grad-norm: the last update's gradient norm before clipping (NaN: none yet).
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  // CUDA without ZeRO: the same norm as a device scalar, read into grad_norm when a
  // report needs it (Note [clipping on the device] in runtime/ops/multi_tensor.h).
  Tensor grad_norm_on_device{};
  // --drop-last false with uneven step counts: the epoch's Join (Note [uneven epochs]).
  std::unique_ptr<Join> join{};
  // Note [best so far] in epoch.cpp: the monitored metric's best value (NaN: none
  // yet), the evaluations since it, and whether --early-stop ends the run now.
  double best_metric = std::numeric_limits<double>::quiet_NaN();
  int64_t evals_since_best = 0;
  bool stop_early = false;
  // Note [elastic training] in elastic.h: under ddprun --on-failure continue.
  bool elastic = false;
  TrainOptions* writable = nullptr;              // the options `o` refers to
  const TrainOptions* launch_options = nullptr;  // as given (rank 0's: the writer's)
  EpochPosition position{};                      // after the last completed step
  std::optional<EpochPosition> rejoin_at{};      // where the epoch goes on after a regroup
  std::string group_stop{};  // Note [group stop]: why the group's last membership formed
  int64_t regroup_full_epoch_steps = -1;
  bool saved_best = false;  // this process wrote --save-best (the summary names it then)  // rank
                            // 0, after a regroup: note_schedule_span()'s
  Tensor last_loss{};       // the last completed step's last micro-batch loss (its loss row)
  std::chrono::steady_clock::time_point next_membership_poll{};  // check_membership()
  int64_t join_at_step = -1;  // DDP_TEST_JOIN_AT (docs/train.md): members regroup there only
  // Note [reports committed] in epoch.cpp: what report() found before it tracked
  // the best (set from its start until every rank completed it), and the step of a
  // report the group takes again after a regroup (-1: none).
  struct BestSoFar {
    double best_metric;
    int64_t evals_since_best;
    bool stop_early;
  };
  std::optional<BestSoFar> report_in_flight{};
  int64_t report_again_at = -1;
  int64_t report_rows_kept = 0;  // of that step: rows of reports completed before it
  // --zero-replicas 2: the all-gather after a counted update failed (Note [zero
  // replicas]); thrown once the step is counted.
  std::exception_ptr failed_after_update{};
  // Note [zero generations] in elastic.cpp: the regroups that made r.zero, and the
  // ZeroOptimizer before it (null for a replacement), kept until r.zero updates.
  int64_t zero_generation = 0;
  bool has_previous_optimizer = false;
  std::unique_ptr<optim::Optimizer> previous_optimizer{};
};

// DistributedDataParallel (with ZeRO's attach) over r.pg->comm, as the options ask.
void make_ddp(Run& r);
// --zero 1|2|3: r's optimizer `inner` sharded over `comm` as the options ask.
std::unique_ptr<ZeroOptimizer> make_zero(Run& r, std::unique_ptr<optim::Optimizer> inner,
                                         std::shared_ptr<Communicator> comm);

// One epoch of the run (epoch.cpp): its steps, under a Join when the ranks' step
// counts differ (Note [uneven epochs] in uneven.h), with progress lines and the
// --eval-every and --save-every reports inside it; returns its metrics.
EpochMetrics train_epoch(Run& r, int64_t epoch);
// Note [profiled steps]: train --profile-steps N profiles N steps from
// --profile-start, never one of the first 2 steps of this process (3 with
// --cuda-graph: the 2 eager steps and the capture), which make plans, caches and the
// graph: after a resume, a restart or a join the window moves past them. It covers
// steps only: an evaluation, a checkpoint, the epoch's end or a regroup inside the
// window ends it there ("cut short after step S: why"), and what ran is printed.
// The first step the window may start at, for a process whose first step is
// process_start + 1.
int64_t first_profiled_step(const TrainOptions& o, int64_t process_start, bool graphed);
// Stops the op profile if train started it and prints it (unless quiet, or `print`
// is false); `cut`: why the window ended before its N steps.
void finish_profile(Run& r, std::string_view cut = "the run ended", bool print = true);
// Metrics, checkpoint (epoch_end) and the report line (each only where the options
// ask for it). The metrics row goes first, so the checkpoint never covers a row not
// on disk (Note [rows cut back] in run_log.cpp).
// Inside an epoch (--eval-every), the position for --save-best: the steps taken in
// the epoch and their loss sum and count.
void report(Run& r, const EpochMetrics& m, bool epoch_end, int64_t epoch_step = 0,
            const Tensor& loss_sum = Tensor(), int64_t loss_count = 0);
// A resumed run with nothing left to train (its checkpoint is at --epochs or
// past them): writes --save from the checkpoint as loaded, every rank taking part,
// when that changes something (another file, or a sharded checkpoint written
// whole); true when it did. So `train --resume sharded.st --save whole.st` turns
// a --save-sharded checkpoint into a whole one without a step.
bool save_as_resumed(Run& r, const std::string& resumed_from);

}  // namespace ddp::train
