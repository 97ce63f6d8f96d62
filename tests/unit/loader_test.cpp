#include "runtime/data/loader.h"

#include "runtime/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

namespace ddp {
namespace {

// Sample i: every input element equals i; label i % 7.
Dataset numbered(int64_t n, Shape sample_shape = {2, 3}) {
  const int64_t d = shape_numel(sample_shape);
  std::vector<float> x(static_cast<size_t>(n * d));
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    std::fill_n(x.begin() + i * d, d, static_cast<float>(i));
    y[static_cast<size_t>(i)] = i % 7;
  }
  Shape shape = {n};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  return {from_vector(x, shape), from_vector(y, {n}), 7, "numbered"};
}

// The sample ids of every batch of one epoch, checking each batch's rows and labels.
std::vector<std::vector<int64_t>> epoch_ids(DataLoader& loader, int64_t epoch) {
  loader.start_epoch(epoch);
  std::vector<std::vector<int64_t>> batches;
  for (Batch b; loader.next(b);) {
    EXPECT_EQ(b.inputs.device(), loader.options().device);
    const Tensor inputs = b.inputs.cpu();
    const auto x = inputs.to_vector<float>();
    const auto y = b.labels.cpu().to_vector<int64_t>();
    EXPECT_EQ(inputs.size(0), static_cast<int64_t>(y.size()));
    const int64_t d = inputs.numel() / std::max<int64_t>(inputs.size(0), 1);
    std::vector<int64_t> ids;
    for (size_t r = 0; r < y.size(); ++r) {
      const auto id = static_cast<int64_t>(x[r * static_cast<size_t>(d)]);
      for (int64_t j = 0; j < d; ++j)
        EXPECT_EQ(x[r * static_cast<size_t>(d) + static_cast<size_t>(j)], static_cast<float>(id));
      EXPECT_EQ(y[r], id % 7) << "label of sample " << id;
      ids.push_back(id);
    }
    batches.push_back(ids);
  }
  return batches;
}

TEST(Loader, BatchesCoverTheEpochWithAShortLastBatch) {
  const Dataset ds = numbered(10);
  DataLoader loader(ds, {.batch_size = 4}, DistributedSampler(10, 0, 1, {.seed = 1}));
  EXPECT_EQ(loader.num_batches(), 3);
  const auto batches = epoch_ids(loader, 0);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].size(), 4u);
  EXPECT_EQ(batches[1].size(), 4u);
  EXPECT_EQ(batches[2].size(), 2u);
  std::vector<int64_t> all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  EXPECT_EQ(all, DistributedSampler(10, 0, 1, {.seed = 1}).indices()) << "in the sampler's order";
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

// Regression targets: labels of any shape and dtype travel with their samples' rows.
TEST(Loader, MultiOutputTargetsTravelWithTheirRows) {
  const int64_t n = 9;
  std::vector<float> x(static_cast<size_t>(n * 2)), y(static_cast<size_t>(n * 3));
  for (int64_t i = 0; i < n; ++i) {
    x[static_cast<size_t>(2 * i)] = x[static_cast<size_t>(2 * i + 1)] = static_cast<float>(i);
    for (int64_t j = 0; j < 3; ++j)
      y[static_cast<size_t>(3 * i + j)] = static_cast<float>(10 * i + j);
  }
  const Dataset ds{from_vector(x, {n, 2}), from_vector(y, {n, 3}), 0, "regression"};
  DataLoader loader(ds, {.batch_size = 4}, DistributedSampler(n, 0, 1, {.seed = 3}));
  loader.start_epoch(0);
  int64_t seen = 0;
  for (Batch b; loader.next(b);) {
    ASSERT_EQ(b.labels.dim(), 2);
    ASSERT_EQ(b.labels.size(1), 3);
    const auto in = b.inputs.to_vector<float>(), out = b.labels.to_vector<float>();
    for (int64_t r = 0; r < b.inputs.size(0); ++r, ++seen) {
      const float id = in[static_cast<size_t>(2 * r)];
      for (int64_t j = 0; j < 3; ++j) {
        EXPECT_EQ(out[static_cast<size_t>(3 * r + j)], 10 * id + static_cast<float>(j));
      }
    }
  }
  EXPECT_EQ(seen, n);
  const Dataset bad{from_vector(x, {n, 2}), zeros({n - 1, 3}), 0, "short"};
  try {
    DataLoader l(bad, {.batch_size = 4}, DistributedSampler(n, 0, 1, {}));
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("labels [8, 3]; expected [N, ...] and [N, ...] with the "
                                         "same N"),
              std::string::npos)
        << e.what();
  }
}

TEST(Loader, DropLastDropsTheShortBatch) {
  const Dataset ds = numbered(10);
  DataLoader loader(ds, {.batch_size = 4, .drop_last = true}, DistributedSampler(10, 0, 1));
  EXPECT_EQ(loader.num_batches(), 2);
  const auto batches = epoch_ids(loader, 0);
  ASSERT_EQ(batches.size(), 2u);
  std::set<int64_t> seen;
  for (const auto& b : batches) {
    EXPECT_EQ(b.size(), 4u);
    seen.insert(b.begin(), b.end());
  }
  EXPECT_EQ(seen.size(), 8u);
  DataLoader exact(ds, {.batch_size = 5, .drop_last = true}, DistributedSampler(10, 0, 1));
  EXPECT_EQ(exact.num_batches(), 2);
}

// Uneven shares (pad = false): 11 samples over 3 ranks are 4, 4, 3; batches of 2
// give 2, 2, 2 batches, of 3 give 2, 2, 1; every rank knows every rank's.
TEST(Loader, UnevenSharesBatchCountsPerRank) {
  const Dataset ds = numbered(11);
  for (int64_t batch : {2, 3}) {
    for (int r = 0; r < 3; ++r) {
      DataLoader loader(ds, {.batch_size = batch},
                        DistributedSampler(11, r, 3, {.seed = 2, .pad = false}));
      const auto batches = epoch_ids(loader, 0);
      EXPECT_EQ(static_cast<int64_t>(batches.size()), loader.num_batches());
      EXPECT_EQ(loader.num_batches(), loader.num_batches_of(r));
      for (size_t b = 0; b < batches.size(); ++b) {
        EXPECT_EQ(static_cast<int64_t>(batches[b].size()),
                  loader.batch_rows_of(r, static_cast<int64_t>(b)));
      }
      EXPECT_EQ(loader.batch_rows_of(r, loader.num_batches()), 0);
      const std::vector<int64_t> want =
          batch == 2 ? std::vector<int64_t>{2, 2, 2} : std::vector<int64_t>{2, 2, 1};
      for (int q = 0; q < 3; ++q) EXPECT_EQ(loader.num_batches_of(q), want[static_cast<size_t>(q)]);
      int64_t total = 0;
      for (int q = 0; q < 3; ++q) {
        for (int64_t b = 0; b < 3; ++b) total += loader.batch_rows_of(q, b);
      }
      EXPECT_EQ(total, 11);
    }
  }
}

TEST(Loader, PrefetchGivesTheSameBatches) {
  const Dataset ds = numbered(37, {4});
  DataLoader eager(ds, {.batch_size = 5, .prefetch = false},
                   DistributedSampler(37, 1, 2, {.seed = 3}));
  DataLoader prefetching(ds, {.batch_size = 5, .prefetch = true},
                         DistributedSampler(37, 1, 2, {.seed = 3}));
  for (int64_t epoch : {0, 1, 2}) EXPECT_EQ(epoch_ids(eager, epoch), epoch_ids(prefetching, epoch));
}

TEST(Loader, RanksTogetherCoverTheDataset) {
  const int world = 3;
  const Dataset ds = numbered(20);
  std::multiset<int64_t> seen;
  std::vector<int64_t> batch_counts;
  for (int rank = 0; rank < world; ++rank) {
    DataLoader loader(ds, {.batch_size = 3}, DistributedSampler(20, rank, world, {.seed = 4}));
    const auto batches = epoch_ids(loader, 2);
    batch_counts.push_back(static_cast<int64_t>(batches.size()));
    for (const auto& b : batches) seen.insert(b.begin(), b.end());
  }
  // 20 samples, 3 ranks: 7 each (one padded), 3 batches each (3, 3, 1).
  EXPECT_EQ(batch_counts, (std::vector<int64_t>{3, 3, 3}));
  EXPECT_EQ(seen.size(), 21u);
  for (int64_t i = 0; i < 20; ++i) EXPECT_GE(seen.count(i), 1u) << i;
}

TEST(Loader, EpochsReshuffleAndEndCleanly) {
  const Dataset ds = numbered(50);
  DataLoader loader(ds, {.batch_size = 8}, DistributedSampler(50, 0, 1));
  Batch b;
  EXPECT_THROW(loader.next(b), ValueError);  // start_epoch first
  const auto e0 = epoch_ids(loader, 0);
  EXPECT_FALSE(loader.next(b));
  EXPECT_FALSE(loader.next(b));
  EXPECT_NE(epoch_ids(loader, 1), e0);
  EXPECT_EQ(epoch_ids(loader, 0), e0);
  // Restarting in the middle of an epoch (a prefetch in flight) is fine too.
  loader.start_epoch(5);
  ASSERT_TRUE(loader.next(b));
  EXPECT_EQ(epoch_ids(loader, 0), e0);
  loader.start_epoch(6);
  ASSERT_TRUE(loader.next(b));
  // Destroyed here with a prefetch in flight: the destructor waits for it.
}

TEST(Loader, EmptyShardAndTinyDataset) {
  const Dataset ds = numbered(2);
  DataLoader loader(ds, {.batch_size = 4, .drop_last = true}, DistributedSampler(2, 0, 1));
  EXPECT_EQ(loader.num_batches(), 0);
  EXPECT_TRUE(epoch_ids(loader, 0).empty());
  DataLoader keep(ds, {.batch_size = 4}, DistributedSampler(2, 2, 3));  // rank 2 gets padding
  EXPECT_EQ(epoch_ids(keep, 0).size(), 1u);
}

TEST(Loader, RejectsBadArguments) {
  const Dataset ds = numbered(10);
  EXPECT_THROW(DataLoader(ds, {.batch_size = 0}, DistributedSampler(10, 0, 1)), ValueError);
  try {
    DataLoader(ds, {.batch_size = 2}, DistributedSampler(11, 0, 1));
    ADD_FAILURE() << "expected a ValueError";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(),
                 "DataLoader: the sampler was built for 11 samples, dataset 'numbered' has 10");
  }
  Dataset broken = ds;
  broken.labels = broken.labels.slice(0, 9);
  EXPECT_THROW(DataLoader(broken, {}, DistributedSampler(10, 0, 1)), ValueError);
}

TEST(Loader, CudaBatchesMatchCpuBatches) {
  if (device_count(DeviceType::cuda) == 0) {
    GTEST_SKIP() << "no CUDA device: " << unavailable_reason(DeviceType::cuda);
  }
  const Dataset ds = numbered(33, {1, 4, 4});
  DataLoader cpu(ds, {.batch_size = 8}, DistributedSampler(33, 0, 1, {.seed = 2}));
  DataLoader gpu(ds, {.batch_size = 8, .device = Device::cuda()},
                 DistributedSampler(33, 0, 1, {.seed = 2}));
  EXPECT_EQ(epoch_ids(cpu, 1), epoch_ids(gpu, 1));
}

}  // namespace
}  // namespace ddp
