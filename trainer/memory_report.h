// Memory per rank for --metrics (docs/train.md): the allocator's peak, the
// optimizer state and the gradients each rank holds, so DDP and ZeRO-1/2
// (collectives/ddp/zero.h) can be compared rank by rank.
#pragma once

#include "trainer/run.h"

namespace ddp::train {

// Fills m.rank_peak_allocated, m.rank_optimizer_state, m.rank_gradient_bytes and
// m.rank_parameter_bytes
// (one entry per rank; under ddp an all_gather, so every rank calls it at the
// same points). Measured between steps: after the step's update.
void measure_memory(Run& r, EpochMetrics& m);

}  // namespace ddp::train
