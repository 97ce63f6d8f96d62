// The op profile (runtime/profile.h, Note [op profile]) on a GPU: an op's time is the
// device's (events on the stream), not the host's launch; ops inside a CUDA graph
// capture are not recorded and a replay is one entry. Without a GPU every test skips
// and says why; the bookkeeping is unit-tested on the CPU (unit.OpProfile.*).
#include "runtime/cuda_graph.h"
#include "runtime/ops/ops.h"
#include "runtime/profile.h"
#include "runtime/stream.h"
#include "tests/gpu/require_gpu.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace ddp {
namespace {

using gpu_test::kGpu;

const profile::OpTime* find(const std::vector<profile::OpTime>& ops, const std::string& op) {
  for (const profile::OpTime& t : ops) {
    if (t.op == op) return &t;
  }
  return nullptr;
}

// Stops the profile if a test left it on (a failed assertion between start and stop).
struct StopAtEnd {
  ~StopAtEnd() {
    if (profile::enabled()) profile::stop();
  }
};

TEST(OpProfileGpu, AnOpsTimeIsTheDevicesNotTheLaunch) {
  DDP_REQUIRE_REAL_CUDA("launches that return before the kernel ends");
  StopAtEnd guard;
  const Tensor a = randn({4096, 4096}, 1, {.device = kGpu});
  matmul(a, a);  // warm-up: the cuBLAS handle and workspace
  synchronize(kGpu);
  constexpr int kCalls = 5;
  profile::start();
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) matmul(a, a);
  const double launch_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  synchronize(kGpu);
  const double device_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  const profile::Report r = profile::stop();
  const profile::OpTime* gemm = find(r.ops, "gemm");
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(gemm->calls, kCalls);
  EXPECT_EQ(gemm->device, "cuda:0");
  EXPECT_EQ(gemm->shapes, "f32[4096, 4096] f32[4096, 4096] f32[4096, 4096]");
  // 5 x 137 GFLOP keep the GPU busy for milliseconds while the launches return at once:
  // the profile saw the work (most of the host's wait), not the launches.
  EXPECT_GT(device_ms, 4 * launch_ms) << "the launches were not asynchronous";
  EXPECT_GT(gemm->total_ms, 0.8 * (device_ms - launch_ms));
  EXPECT_LE(gemm->total_ms, device_ms * 1.01);
}

TEST(OpProfileGpu, ACapturedGraphIsOneEntry) {
  DDP_REQUIRE_REAL_CUDA("CUDA graphs");
  StopAtEnd guard;
  const Tensor x = randn({256, 256}, 2, {.device = kGpu});
  Tensor y;
  relu(matmul(x, x));  // warm-up: the cuBLAS handle, the kernels' modules
  CudaGraph graph;
  profile::start();
  graph.capture(kGpu, [&] { y = relu(matmul(x, x)); });
  graph.replay();
  graph.replay();
  relu(x);  // eager, after the replays
  const profile::Report r = profile::stop();
  EXPECT_EQ(find(r.ops, "gemm"), nullptr) << "an op inside the capture was recorded";
  const profile::OpTime* replay = find(r.ops, "cuda_graph_replay");
  ASSERT_NE(replay, nullptr);
  EXPECT_EQ(replay->calls, 2);
  const profile::OpTime* eager = find(r.ops, "relu");
  ASSERT_NE(eager, nullptr);
  EXPECT_EQ(eager->calls, 1);
  EXPECT_EQ(r.dropped, 0) << r.first_error;
}

}  // namespace
}  // namespace ddp
