// The nccl backend with world size 1 on cuda:0: every collective is the identity
// (or a copy), on every dtype, issued from a non-default current stream so the
// stream ordering of Note [nccl streams] is exercised. Without NCCL in the build
// or without a GPU every test skips and says why. Multi-rank NCCL runs belong to
// a multi-GPU machine (ddprun -n N on it).
#include "collectives/backends.h"
#include "ddp/config.h"
#include "runtime/device.h"
#include "runtime/ops/ops.h"
#include "runtime/stream.h"

#include <gtest/gtest.h>

#include <vector>

#define DDP_REQUIRE_NCCL()                                                                 \
  if (!DDP_HAVE_NCCL)                                                                      \
    GTEST_SKIP() << "this build has no NCCL (needs a CUDA build and NCCL found by CMake)"; \
  if (::ddp::device_count(::ddp::DeviceType::cuda) == 0)                                   \
  GTEST_SKIP() << "no CUDA device: " << ::ddp::unavailable_reason(::ddp::DeviceType::cuda)

namespace ddp {
namespace {

using namespace std::chrono_literals;

const Device kGpu = Device::cuda(0);
constexpr DType kReducible[] = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

std::shared_ptr<Communicator> make_single_rank() {
  return make_nccl_communicator(nullptr,
                                {.rank = 0, .size = 1, .device = 0, .comm = {.timeout = 30s}});
}

// 1, -2, 3, -4, ... (exact in every dtype) on the GPU.
Tensor gpu_values(DType dtype, int64_t count) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    v[static_cast<size_t>(i)] = (i % 2 ? -1.f : 1.f) * (i % 100 + 1);
  return cast(from_vector<float>(v, {count}), dtype).to(kGpu);
}

std::vector<float> host_values(const Tensor& t) {
  return cast(t.cpu(), DType::f32).to_vector<float>();
}

TEST(NcclCommunicator, AllReduceIsTheIdentityForEveryOpAndDtype) {
  DDP_REQUIRE_NCCL();
  auto comm = make_single_rank();
  EXPECT_EQ(comm->backend(), "nccl");
  const Stream side = Stream::create(kGpu);
  StreamGuard guard(side);  // collectives follow the caller's current stream
  for (DType dtype : kReducible) {
    for (ReduceOp op : kOps) {
      if (op == ReduceOp::avg && !is_floating(dtype)) continue;
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1'000'003}}) {
        Tensor t = gpu_values(dtype, count);
        comm->all_reduce(t, op)->wait();
        EXPECT_EQ(host_values(t), host_values(gpu_values(dtype, count)))
            << dtype_name(dtype) << " " << reduce_op_name(op) << " of " << count;
      }
    }
  }
}

TEST(NcclCommunicator, BroadcastGatherScatterReduceAndBarrier) {
  DDP_REQUIRE_NCCL();
  auto comm = make_single_rank();
  const Tensor expected = gpu_values(DType::f32, 1025);
  Tensor t = gpu_values(DType::f32, 1025);
  comm->broadcast(t, 0)->wait();
  EXPECT_EQ(host_values(t), host_values(expected));
  Tensor out = zeros({1025}, {.device = kGpu});
  comm->all_gather(t, out)->wait();
  EXPECT_EQ(host_values(out), host_values(expected));
  Tensor scattered = zeros({1025}, {.device = kGpu});
  comm->reduce_scatter(t, scattered, ReduceOp::sum)->wait();
  EXPECT_EQ(host_values(scattered), host_values(expected));
  comm->reduce(t, 0, ReduceOp::max)->wait();
  EXPECT_EQ(host_values(t), host_values(expected));
  Tensor bytes = cast(gpu_values(DType::f32, 9), DType::u8);
  comm->broadcast(bytes, 0)->wait();
  auto barrier = comm->barrier();
  barrier->wait();
  EXPECT_TRUE(barrier->done());
}

TEST(NcclCommunicator, AsyncWorksCompleteInAnyOrder) {
  DDP_REQUIRE_NCCL();
  auto comm = make_single_rank();
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < 8; ++k) {
    tensors.push_back(gpu_values(DType::bf16, 100'000 + k));
    works.push_back(comm->all_reduce(tensors.back(), ReduceOp::sum));
    EXPECT_EQ(works.back()->sequence(), k);
  }
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(host_values(tensors[static_cast<size_t>(k)]),
              host_values(gpu_values(DType::bf16, 100'000 + k)));
  }
}

TEST(NcclCommunicator, RejectsCpuTensors) {
  DDP_REQUIRE_NCCL();
  auto comm = make_single_rank();
  Tensor cpu = zeros({4});
  EXPECT_THROW(comm->all_reduce(cpu), DeviceError);
}

TEST(NcclCommunicator, StubSaysHowToEnableIt) {
  if (DDP_HAVE_NCCL) GTEST_SKIP() << "this build has NCCL; the stub is not compiled";
  try {
    make_single_rank();
    FAIL() << "the stub returned a communicator";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("nccl backend is not built"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddp
