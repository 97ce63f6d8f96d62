// Testing aids of `train`: faults injected from the environment.
#pragma once

#include "collectives/ddp/comm_hook.h"

#include <cstdint>

namespace ddp::train {

// Testing aids (docs/train.md, "Fault injection"): DDP_TEST_KILL_AT=RANK:STEP
// makes that rank SIGKILL itself after training step STEP (and its checkpoint, if
// one is due, and a join DDP_TEST_JOIN_AT pins to that step); DDP_TEST_NAN_AT=RANK:STEP makes its
// loss NaN at step STEP; DDP_TEST_NAN_WEIGHT_AT=RANK:STEP makes a weight NaN after step STEP's
// update (as a non-finite gradient with a finite loss would); DDP_TEST_KILL_IN_UPDATE=RANK:STEP
// (--zero-replicas 2) makes that rank SIGKILL itself inside step STEP's optimizer
// step, its update counted, before the parameters' all-gather (Note [zero replicas]);
// DDP_TEST_KILL_IN_EVAL=RANK:STEP makes it SIGKILL itself as step STEP's
// --eval-every evaluation begins (the others fail inside it);
// DDP_TEST_KILL_IN_REPORT=RANK:STEP makes it SIGKILL itself inside the report of
// step STEP (an --eval-every one, or the epoch's when STEP ends an epoch) right
// after writing its --metrics row, before the report's checkpoint;
// DDP_TEST_KILL_IN_SAVE=RANK:STEP makes it SIGKILL itself inside step STEP's save,
// once --save-sharded's shard files are written and before the manifest is (Note
// [shard generations]). RANK * is
// every rank; several RANK:STEP separated by commas name several ranks (2:5,3:9). All act only in a
// group's first attempt (DDPRUN_RESTART_COUNT unset or 0) and not in a replacement rank
// (DDPRUN_JOIN), so the restarted group runs clean. For the flight recorder
// (docs/flight_recorder.md): DDP_TEST_SLOW_RANK=RANK:MS sleeps MS milliseconds in each forward of
// that rank (a straggler); DDP_TEST_SKIP_ALLREDUCE=RANK:STEP makes that rank skip bucket 0's
// all_reduce at optimizer step STEP of this process (a collective mismatch; the ranks then hang or
// fail).
struct TestFaults {
  int64_t kill_step = -1, nan_step = -1, nan_weight_step = -1, kill_in_update_step = -1,
          kill_in_eval_step = -1, kill_in_report_step = -1, kill_in_save_step = -1;
  int64_t slow_ms = -1, skip_allreduce_step = -1;

  // The step of `name` (RANK:STEP or *:STEP) for `rank`; -1 when unset or another rank's.
  static int64_t step_for(const char* name, int rank, const char* unit = "STEP");
  static TestFaults from_env(int rank);
};

// A comm hook that runs `builtin` for every bucket except bucket 0 of the
// `step`-th synchronized backward, which it leaves unreduced (this rank's own
// gradient): DDP_TEST_SKIP_ALLREDUCE, through the public register_comm_hook.
CommHookFn skip_allreduce_hook(int64_t step, CommHook builtin);

}  // namespace ddp::train
