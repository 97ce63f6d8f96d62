#include "models/train/uneven.h"

#include "runtime/error.h"

#include <fmt/format.h>

#include <algorithm>

namespace ddp::train {

EpochSteps epoch_steps(const Task& task, const TrainOptions& o, int rank, int world_size) {
  EpochSteps out;
  int64_t fewest = -1, most_batches = 0;
  for (int q = 0; q < world_size; ++q) {
    const int64_t batches = task.num_batches_of(q);
    const int64_t available = batches / o.grad_accum;
    const int64_t steps = o.max_steps > 0 ? std::min(o.max_steps, available) : available;
    most_batches = std::max(most_batches, batches);
    out.steps = std::max(out.steps, steps);
    fewest = fewest < 0 ? steps : std::min(fewest, steps);
    if (q == rank) out.mine = steps;
  }
  DDP_CHECK(out.steps > 0,
            "an epoch has {} batches of --batch-size {} per rank, fewer than --grad-accum {}: "
            "no optimizer step would run; lower --grad-accum or --batch-size",
            most_batches, o.batch_size, o.grad_accum);
  out.uneven = fewest < out.steps;
  return out;
}

std::string describe_uneven(const Task& task, const TrainOptions& o, int world_size) {
  if (o.drop_last != "false" || world_size <= 1) return "";
  const EpochSteps most = epoch_steps(task, o, 0, world_size);
  const EpochSteps fewest = epoch_steps(task, o, world_size - 1, world_size);
  if (!most.uneven) {
    return fmt::format("--drop-last false: every rank takes {} steps per epoch (no Join)\n",
                       most.steps);
  }
  return fmt::format(
      "--drop-last false: ranks take {} to {} steps per epoch; a rank out of data joins (Join: "
      "it shadows the others' steps; a step's gradient is their sum / {})\n",
      fewest.mine, most.steps,
      o.join_divide == "world" ? fmt::format("the world size {}", world_size)
                               : std::string("their count"));
}

}  // namespace ddp::train
