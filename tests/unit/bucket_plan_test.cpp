// The DDP bucket plan alone (collectives/ddp/bucket_plan.h): a pure function.
#include "collectives/ddp/bucket_plan.h"
#include "runtime/error.h"

#include <gtest/gtest.h>

namespace ddp {
namespace {

ParamInfo f32(int64_t numel) {
  return {.numel = numel, .dtype = DType::f32};
}

std::vector<std::vector<size_t>> groups(const std::vector<Bucket>& buckets) {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& b : buckets) out.push_back(b.params);
  return out;
}

TEST(BucketPlan, EmptyGivesNoBuckets) {
  EXPECT_TRUE(plan_buckets({}).empty());
}

TEST(BucketPlan, CapsAndSmallFirstBucket) {
  // 100 f32 = 400 bytes each; first cap 800 bytes (2 params), then 1200 (3 params).
  const std::vector<ParamInfo> params(8, f32(100));
  const auto buckets = plan_buckets(params, {.first_bucket_bytes = 800, .bucket_bytes = 1200});
  const std::vector<std::vector<size_t>> want = {{0, 1}, {2, 3, 4}, {5, 6, 7}};
  EXPECT_EQ(groups(buckets), want);
  EXPECT_EQ(buckets[1].offsets, (std::vector<int64_t>{0, 100, 200}));
  EXPECT_EQ(buckets[1].numel, 300);
}

TEST(BucketPlan, FillsExactlyToTheCap) {
  const auto buckets =
      plan_buckets({f32(100), f32(100), f32(1)}, {.first_bucket_bytes = 800, .bucket_bytes = 800});
  EXPECT_EQ(groups(buckets), (std::vector<std::vector<size_t>>{{0, 1}, {2}}));
}

TEST(BucketPlan, DefaultCapsKeepSmallModelsInOneBucket) {
  const auto buckets = plan_buckets({f32(1000), f32(10), f32(1000)});
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_EQ(buckets[0].offsets, (std::vector<int64_t>{0, 1000, 1010}));
  EXPECT_EQ(buckets[0].numel, 2010);
}

TEST(BucketPlan, LargeParamIsAloneInItsBucket) {
  const auto buckets = plan_buckets({f32(10), f32(1000), f32(10), f32(10)},
                                    {.first_bucket_bytes = 100, .bucket_bytes = 200});
  EXPECT_EQ(groups(buckets), (std::vector<std::vector<size_t>>{{0}, {1}, {2, 3}}));
  EXPECT_EQ(buckets[1].numel, 1000);
}

TEST(BucketPlan, SeparatesDTypes) {
  const std::vector<ParamInfo> params = {f32(4),
                                         f32(4),
                                         {.numel = 4, .dtype = DType::bf16},
                                         {.numel = 4, .dtype = DType::bf16},
                                         f32(4)};
  const auto buckets = plan_buckets(params);
  EXPECT_EQ(groups(buckets), (std::vector<std::vector<size_t>>{{0, 1}, {2, 3}, {4}}));
  EXPECT_EQ(buckets[1].dtype, DType::bf16);
  EXPECT_EQ(buckets[1].offsets, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(buckets[2].dtype, DType::f32);
}

TEST(BucketPlan, SeparatesDevices) {
  const ParamInfo gpu{.numel = 4, .dtype = DType::f32, .device = Device::cuda(0)};
  const auto buckets = plan_buckets({f32(4), gpu, gpu});
  EXPECT_EQ(groups(buckets), (std::vector<std::vector<size_t>>{{0}, {1, 2}}));
  EXPECT_EQ(buckets[1].device, Device::cuda(0));
}

// Note [bucket rebuild]: the plan over an observed order keeps indices into the
// original list, packed in the order given.
TEST(BucketPlan, RebuildPacksInTheObservedOrder) {
  const std::vector<ParamInfo> params = {f32(100), f32(100), f32(100), f32(100)};
  const auto buckets =
      plan_buckets_in_order(params, {2, 0, 3, 1}, {.first_bucket_bytes = 400, .bucket_bytes = 800});
  EXPECT_EQ(groups(buckets), (std::vector<std::vector<size_t>>{{2}, {0, 3}, {1}}));
  EXPECT_EQ(buckets[1].offsets, (std::vector<int64_t>{0, 100}));
}

TEST(BucketPlan, IdentityOrderEqualsThePlainPlan) {
  const std::vector<ParamInfo> params = {f32(10), f32(300), f32(10), f32(10)};
  const BucketCaps caps{.first_bucket_bytes = 100, .bucket_bytes = 1300};
  EXPECT_EQ(groups(plan_buckets_in_order(params, {0, 1, 2, 3}, caps)),
            groups(plan_buckets(params, caps)));
}

TEST(BucketPlan, RebuildRejectsAnOrderThatIsNotAPermutation) {
  const std::vector<ParamInfo> params = {f32(1), f32(1), f32(1)};
  EXPECT_THROW(plan_buckets_in_order(params, std::vector<size_t>{0, 0, 1}), ValueError);
  EXPECT_THROW(plan_buckets_in_order(params, std::vector<size_t>{0, 1}), ValueError);
  EXPECT_THROW(plan_buckets_in_order(params, std::vector<size_t>{0, 1, 3}), ValueError);
}

}  // namespace
}  // namespace ddp
