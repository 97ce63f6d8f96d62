#include "trainer/uneven.h"

#include "runtime/error.h"

#include "runtime/fmt.h"

#include <algorithm>

namespace ddp::train {

EpochSteps epoch_steps(const std::vector<int64_t>& batches, int64_t batch_size, int64_t grad_accum,
                       int64_t max_steps, int rank) {
  EpochSteps out;
  for (const int64_t b : batches) {
    const int64_t available = b / grad_accum;
    out.of_rank.push_back(max_steps > 0 ? std::min(max_steps, available) : available);
  }
  DDP_ASSERT(rank >= 0 && static_cast<size_t>(rank) < batches.size(), "rank {} of {}", rank,
             batches.size());
  out.steps = *std::max_element(out.of_rank.begin(), out.of_rank.end());
  out.mine = out.of_rank[static_cast<size_t>(rank)];
  out.uneven = *std::min_element(out.of_rank.begin(), out.of_rank.end()) < out.steps;
  DDP_CHECK(out.steps > 0,
            "an epoch has {} batches of --batch-size {} per rank, fewer than --grad-accum {}: "
            "no optimizer step would run; lower --grad-accum or --batch-size",
            *std::max_element(batches.begin(), batches.end()), batch_size, grad_accum);
  return out;
}

EpochSteps epoch_steps(const Task& task, const TrainOptions& o, int rank, int world_size) {
  std::vector<int64_t> batches;
  for (int q = 0; q < world_size; ++q) batches.push_back(task.num_batches_of(q));
  return epoch_steps(batches, o.batch_size, o.grad_accum, o.max_steps, rank);
}

int64_t step_samples(const EpochSteps& plan, int64_t step, int64_t grad_accum,
                     const std::function<int64_t(int rank, int64_t batch)>& batch_rows) {
  int64_t n = 0;
  for (size_t q = 0; q < plan.of_rank.size(); ++q) {
    if (plan.of_rank[q] <= step) continue;  // it shadows this step
    for (int64_t b = step * grad_accum; b < (step + 1) * grad_accum; ++b) {
      n += batch_rows(static_cast<int>(q), b);
    }
  }
  return n;
}

std::string describe_uneven(const Task& task, const TrainOptions& o, int world_size) {
  if (o.drop_last != DropLast::uneven || world_size <= 1) return "";
  const EpochSteps plan = epoch_steps(task, o, 0, world_size);
  if (!plan.uneven) {
    return fmt::format("--drop-last false: every rank takes {} steps per epoch (no Join)\n",
                       plan.steps);
  }
  return fmt::format(
      "--drop-last false: ranks take {} to {} steps per epoch; a rank out of data joins (Join: "
      "it shadows the others' steps; a step's gradient is their sum / {})\n",
      *std::min_element(plan.of_rank.begin(), plan.of_rank.end()), plan.steps,
      o.join_divide == JoinDivide::world ? fmt::format("the world size {}", world_size)
                                         : std::string("their count"));
}

}  // namespace ddp::train
