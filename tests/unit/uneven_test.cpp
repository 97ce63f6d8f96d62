// train's uneven epochs (Note [uneven epochs] in trainer/uneven.h): every
// rank's step count from every rank's batches, and the samples a step trains on
// over all ranks -- those of the ranks that train it, not of those that shadow
// it with micro-batches left over.
#include "trainer/uneven.h"
#include "runtime/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace ddp::train {
namespace {

// The rows of rank q's batch b when N samples are shared without padding over W
// ranks (rank q: ceil((N - q) / W)) in batches of `batch`, the short last kept.
struct UnevenShares {
  int64_t n, world, batch;
  int64_t samples_of(int q) const { return n > q ? (n - q + world - 1) / world : 0; }
  int64_t batches_of(int q) const { return (samples_of(q) + batch - 1) / batch; }
  int64_t rows(int q, int64_t b) const {
    return b < batches_of(q) ? std::min(batch, samples_of(q) - b * batch) : 0;
  }
  std::vector<int64_t> batches() const {
    std::vector<int64_t> out;
    for (int q = 0; q < world; ++q) out.push_back(batches_of(q));
    return out;
  }
};

int64_t epoch_samples(const UnevenShares& d, const EpochSteps& plan, int64_t grad_accum) {
  int64_t total = 0;
  for (int64_t s = 0; s < plan.steps; ++s) {
    total += step_samples(plan, s, grad_accum, [&](int q, int64_t b) { return d.rows(q, b); });
  }
  return total;
}

TEST(UnevenEpochs, StepCountsOfEveryRank) {
  // 97 samples over 3 ranks: 33, 32, 32; batches of 16: 3, 2, 2.
  const UnevenShares d{97, 3, 16};
  const EpochSteps plan = epoch_steps(d.batches(), 16, 1, 0, 2);
  EXPECT_EQ(plan.of_rank, (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(plan.steps, 3);
  EXPECT_EQ(plan.mine, 2);
  EXPECT_TRUE(plan.uneven);
  // --max-steps 2 evens them: no Join.
  const EpochSteps capped = epoch_steps(d.batches(), 16, 1, 2, 0);
  EXPECT_EQ(capped.of_rank, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_FALSE(capped.uneven);
  // A rank without samples (world size above the data set) has no step.
  const UnevenShares tiny{3, 4, 2};
  const EpochSteps empty_rank = epoch_steps(tiny.batches(), 2, 1, 0, 3);
  EXPECT_EQ(empty_rank.of_rank, (std::vector<int64_t>{1, 1, 1, 0}));
  EXPECT_EQ(empty_rank.mine, 0);
  EXPECT_TRUE(empty_rank.uneven);
}

TEST(UnevenEpochs, NoStepIsAValueErrorNamingTheValues) {
  try {
    epoch_steps({1, 1}, 8, 2, 0, 0);
    ADD_FAILURE() << "no ValueError";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(),
                 "an epoch has 1 batches of --batch-size 8 per rank, fewer than --grad-accum 2: "
                 "no optimizer step would run; lower --grad-accum or --batch-size");
  }
}

TEST(UnevenEpochs, SamplesCountEveryRankThatTrains) {
  const UnevenShares d{97, 3, 16};
  const EpochSteps plan = epoch_steps(d.batches(), 16, 1, 0, 0);
  const auto rows = [&](int q, int64_t b) { return d.rows(q, b); };
  EXPECT_EQ(step_samples(plan, 0, 1, rows), 48);
  EXPECT_EQ(step_samples(plan, 2, 1, rows), 1);  // rank 0's last batch holds one sample
  EXPECT_EQ(epoch_samples(d, plan, 1), 97);      // every sample, none twice
}

// The review's case: 81 samples over 2 ranks, batches of 8, --grad-accum 2: rank 0
// has 6 batches (3 steps, the last batch 1 sample), rank 1 5 (2 steps). Rank 1
// shadows step 2 and its fifth batch is never trained on: 73 samples, not 81.
TEST(UnevenEpochs, SamplesLeaveOutTheMicroBatchesOfAShadowingRank) {
  const UnevenShares d{81, 2, 8};
  const EpochSteps plan = epoch_steps(d.batches(), 8, 2, 0, 0);
  EXPECT_EQ(plan.of_rank, (std::vector<int64_t>{3, 2}));
  const auto rows = [&](int q, int64_t b) { return d.rows(q, b); };
  EXPECT_EQ(step_samples(plan, 2, 2, rows), 9);  // rank 0's batches 4 and 5: 8 + 1
  EXPECT_EQ(epoch_samples(d, plan, 2), 73);
  // --max-steps 1: one step of 2 x 8 on each rank.
  EXPECT_EQ(epoch_samples(d, epoch_steps(d.batches(), 8, 2, 1, 0), 2), 32);
}

}  // namespace
}  // namespace ddp::train
