// Note [copy semantics] (runtime/ops/copy.cpp) as a table: which copies block the
// host, which stage through pinned memory, which record their pinned block on the
// stream. The CUDA calls that execute a plan are checked by the gpu tests.
#include "runtime/ops/copy_plan.h"

#include "runtime/error.h"

#include <gtest/gtest.h>

namespace ddp::ops_detail {
namespace {

const Device kCpu = Device::cpu();
const Device kGpu0 = Device::cuda(0);
const Device kGpu1 = Device::cuda(1);

TEST(CopyPlan, GpuToGpuNeverBlocksTheHost) {
  for (bool non_blocking : {false, true}) {
    const CopyPlan same = plan_copy(kGpu0, false, kGpu0, false, non_blocking);
    EXPECT_EQ(same.route, CopyRoute::same_gpu);
    EXPECT_FALSE(same.host_waits) << "non_blocking=" << non_blocking;
    EXPECT_FALSE(same.record_host_block);
    EXPECT_FALSE(same.stage_in_pinned);
    const CopyPlan peer = plan_copy(kGpu1, false, kGpu0, false, non_blocking);
    EXPECT_EQ(peer.route, CopyRoute::between_gpus);
    EXPECT_FALSE(peer.host_waits) << "non_blocking=" << non_blocking;
  }
}

TEST(CopyPlan, HostToGpu) {
  // Pageable, blocking: a plain copy, then the host waits (PyTorch does the same).
  CopyPlan p = plan_copy(kGpu0, false, kCpu, /*src_pinned=*/false, /*non_blocking=*/false);
  EXPECT_EQ(p.route, CopyRoute::host_to_gpu);
  EXPECT_TRUE(p.host_waits);
  EXPECT_FALSE(p.stage_in_pinned);
  EXPECT_FALSE(p.record_host_block);
  // Pageable, non_blocking: through pinned staging, recorded, no wait.
  p = plan_copy(kGpu0, false, kCpu, false, true);
  EXPECT_FALSE(p.host_waits);
  EXPECT_TRUE(p.stage_in_pinned);
  EXPECT_TRUE(p.record_host_block);
  // Pinned, non_blocking: directly, the source block recorded, no wait.
  p = plan_copy(kGpu0, false, kCpu, true, true);
  EXPECT_FALSE(p.host_waits);
  EXPECT_FALSE(p.stage_in_pinned);
  EXPECT_TRUE(p.record_host_block);
  // Pinned, blocking: the host waits, so nothing needs recording.
  p = plan_copy(kGpu0, false, kCpu, true, false);
  EXPECT_TRUE(p.host_waits);
  EXPECT_FALSE(p.record_host_block);
}

TEST(CopyPlan, GpuToHostBlocksUnlessNonBlockingIntoPinned) {
  CopyPlan p = plan_copy(kCpu, /*dst_pinned=*/true, kGpu0, false, /*non_blocking=*/true);
  EXPECT_EQ(p.route, CopyRoute::gpu_to_host);
  EXPECT_FALSE(p.host_waits);
  EXPECT_TRUE(p.record_host_block) << "the pinned destination must not be reused before the copy";
  EXPECT_FALSE(p.stage_in_pinned);
  p = plan_copy(kCpu, false, kGpu0, false, true);  // pageable: cannot be asynchronous
  EXPECT_TRUE(p.host_waits);
  EXPECT_FALSE(p.record_host_block);
  for (bool pinned : {false, true}) {
    p = plan_copy(kCpu, pinned, kGpu1, false, false);
    EXPECT_TRUE(p.host_waits);
    EXPECT_FALSE(p.record_host_block);
  }
}

TEST(CopyPlan, HostToHostIsAMemcpyAndMpsIsAnError) {
  const CopyPlan p = plan_copy(kCpu, true, kCpu, false, true);
  EXPECT_EQ(p.route, CopyRoute::host);
  EXPECT_FALSE(p.host_waits);
  EXPECT_THROW(plan_copy(Device::mps(), false, kCpu, false, false), DeviceError);
  EXPECT_THROW(plan_copy(kGpu0, false, Device::mps(), false, false), DeviceError);
}

}  // namespace
}  // namespace ddp::ops_detail
