// DistributedDataParallel's backward on CUDA never blocks the host: gradients are
// copied into buckets, all_reduced and written back on streams, and waiting for a
// collective makes the current stream wait, not the host (PyTorch's Work.wait on
// NCCL). Counted with cuda_api::host_sync_count() around a steady-state step of a
// world-size-1 DDP (the local backend and, where built, nccl) next to the same
// step without DDP: the difference must be 0. Reading the loss or the parameters
// afterwards (outside the counted region) may synchronize.
// Without a GPU every test skips and says why.
#include "collectives/backends.h"
#include "collectives/ddp/distributed_data_parallel.h"
#include "ddp/config.h"
#include "runtime/autograd/autograd.h"
#include "runtime/autograd/functions.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/nn/layers.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "runtime/stream.h"
#include "tests/gpu/require_gpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

namespace ddp {
namespace {

using namespace std::chrono_literals;

using gpu_test::kGpu;
constexpr int64_t kBatch = 64;
constexpr int kWarmupSteps = 2;  // the first synchronized backward rebuilds the buckets
constexpr int kCountedSteps = 3;

std::shared_ptr<nn::Sequential> mlp() {
  Generator gen(21);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(784, 256, gen));
  model->add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::Linear>(256, 256, gen));
  model->add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::Linear>(256, 10, gen));
  model->to(kGpu);
  return model;
}

struct StepInput {
  Tensor x, labels;
};

// Made before the counted region: from_vector's host-to-device copy may wait.
StepInput input_for(int step) {
  std::vector<int64_t> labels(kBatch);
  for (int64_t i = 0; i < kBatch; ++i) labels[static_cast<size_t>(i)] = (i * 3 + step) % 10;
  return {randn({kBatch, 784}, 100 + static_cast<uint64_t>(step), {.device = kGpu}),
          from_vector<int64_t>(labels, {kBatch}, {.dtype = DType::i64, .device = kGpu})};
}

std::shared_ptr<Communicator> make_comm(const std::string& backend) {
  if (backend == "nccl") {
    return make_nccl_communicator(nullptr,
                                  {.rank = 0, .size = 1, .device = 0, .comm = {.timeout = 60s}});
  }
  return make_local_communicator({.timeout = 60s});
}

class DdpHostSyncs : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(DdpHostSyncs, BackwardBlocksTheHostNoMoreThanWithoutDdp) {
  DDP_REQUIRE_CUDA();
  const auto& [backend, bucket_view] = GetParam();
  if (backend == "nccl" && !DDP_HAVE_NCCL) {
    GTEST_SKIP() << "this build has no NCCL (needs a CUDA build and NCCL found by CMake)";
  }
  auto plain = mlp(), wrapped = mlp();
  optim::SGD opt_plain(plain->parameters(), {.lr = 0.05f, .momentum = 0.9f});
  optim::SGD opt_ddp(wrapped->parameters(), {.lr = 0.05f, .momentum = 0.9f});
  // Small buckets: several all_reduces per backward, launched while it runs.
  DistributedDataParallel ddp(
      wrapped, make_comm(backend),
      {.bucket_cap_mb = 0.25, .first_bucket_mb = 0.25, .gradient_as_bucket_view = bucket_view});
  ASSERT_GT(ddp.buckets().size(), 2u);
  // A non-default current stream, as a training loop with a side stream has.
  const Stream side = Stream::create(kGpu);
  StreamGuard guard(side);

  uint64_t plain_syncs = 0, ddp_syncs = 0;
  for (int step = 0; step < kWarmupSteps + kCountedSteps; ++step) {
    const bool counted = step >= kWarmupSteps;
    const StepInput in = input_for(step);

    opt_plain.zero_grad(true);
    uint64_t before = cuda_api::host_sync_count();
    backward(functional::cross_entropy((*plain)(in.x), in.labels));
    if (counted) plain_syncs += cuda_api::host_sync_count() - before;
    opt_plain.step();

    opt_ddp.zero_grad(true);
    before = cuda_api::host_sync_count();
    ddp.backward(functional::cross_entropy(ddp.forward(in.x), in.labels));  // + finish_backward
    if (counted) ddp_syncs += cuda_api::host_sync_count() - before;
    opt_ddp.step();
  }
  EXPECT_EQ(ddp_syncs, plain_syncs)
      << "over " << kCountedSteps << " steps, forward + backward + finish_backward of DDP ("
      << backend << ", world size 1, " << ddp.buckets().size() << " buckets, "
      << "gradient_as_bucket_view " << bucket_view << ") blocked the host " << ddp_syncs
      << " times, the same step without DDP " << plain_syncs << " times";

  // World size 1: DDP's average is the gradient itself, so both models agree (and
  // DDP really wrote the gradients).
  synchronize(kGpu);
  const auto a = wrapped->named_parameters(), b = plain->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const auto va = a[i].second.cpu().to_vector<float>(), vb = b[i].second.cpu().to_vector<float>();
    double scale = 0.0;
    for (float v : vb) scale = std::max(scale, static_cast<double>(std::fabs(v)));
    for (size_t j = 0; j < va.size(); ++j) {
      ASSERT_NEAR(va[j], vb[j], 1e-5 * (std::fabs(vb[j]) + scale))
          << a[i].first << " element " << j << " after DDP over " << backend
          << " differs from the same steps without DDP";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DdpHostSyncs,
                         ::testing::Combine(::testing::Values(std::string("local"),
                                                              std::string("nccl")),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) ? "_bucket_view" : "_copy_back");
                         });

}  // namespace
}  // namespace ddp
