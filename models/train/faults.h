// Testing aids of `train`: faults injected from the environment.
#pragma once

#include <cstdint>

namespace ddp::train {

// Testing aids (docs/train.md, "Fault injection"): DDP_TEST_KILL_AT=RANK:STEP
// makes that rank SIGKILL itself after training step STEP (and its checkpoint, if
// one is due); DDP_TEST_NAN_AT=RANK:STEP makes its loss NaN at step STEP;
// DDP_TEST_NAN_WEIGHT_AT=RANK:STEP makes a weight NaN after step STEP's update (as
// a non-finite gradient with a finite loss would). RANK * is every rank. All act
// only in a group's first attempt (DDPRUN_RESTART_COUNT unset or 0), so the
// restarted group runs clean.
struct TestFaults {
  int64_t kill_step = -1, nan_step = -1, nan_weight_step = -1;

  // The step of `name` (RANK:STEP or *:STEP) for `rank`; -1 when unset or another rank's.
  static int64_t step_for(const char* name, int rank);
  static TestFaults from_env(int rank);
};

}  // namespace ddp::train
