// DataParallel on CUDA: cuda:0 listed twice (two replicas sharing one GPU, each on
// its own stream and thread, as a one-GPU machine can test the mode) must train like
// one device on the same batch, and a module left on the CPU gives PyTorch's error.
// Without a GPU every test skips and says why.
#include "collectives/data_parallel/data_parallel.h"
#include "runtime/nn/layers.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "tests/gpu/require_gpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace ddp {
namespace {

using gpu_test::kGpu;

std::shared_ptr<nn::Sequential> mlp(uint64_t seed) {
  Generator gen(seed);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Flatten>());
  model->add(std::make_shared<nn::Linear>(48, 64, gen));
  model->add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::Linear>(64, 10, gen));
  return model;
}

// |a - b| <= rtol * (|b| + max |b|) per element.
void expect_close(const Tensor& a, const Tensor& b, double rtol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const auto va = a.cpu().to_vector<float>(), vb = b.cpu().to_vector<float>();
  double scale = 0.0;
  for (float v : vb) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < va.size(); ++i) {
    ASSERT_NEAR(va[i], vb[i], rtol * (std::fabs(vb[i]) + scale))
        << what << ", element " << i << " of " << va.size();
  }
}

void expect_equivalent_on_gpu(size_t replicas) {
  constexpr int kSteps = 5;
  constexpr int64_t kBatch = 37;  // uneven over 2 and 3 replicas
  auto single = mlp(5), wrapped = mlp(5);
  single->to(kGpu);
  wrapped->to(kGpu);
  optim::SGD opt_single(single->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  optim::SGD opt_dp(wrapped->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  DataParallel dp(wrapped, std::vector<Device>(replicas, kGpu));
  for (int step = 0; step < kSteps; ++step) {
    // The input on the CPU: scatter copies each chunk to the GPU.
    const Tensor x = randn({kBatch, 48}, 10 + static_cast<uint64_t>(step));
    std::vector<int64_t> label_values;
    for (int64_t i = 0; i < kBatch; ++i) label_values.push_back((i * 7 + step) % 10);
    const Tensor labels =
        from_vector<int64_t>(label_values, {kBatch}, {.dtype = DType::i64, .device = kGpu});

    opt_single.zero_grad(true);
    backward(functional::cross_entropy((*single)(x.to(kGpu)), labels));
    opt_single.step();

    opt_dp.zero_grad(true);
    const Tensor out = dp(x);
    ASSERT_EQ(out.device(), kGpu);
    backward(functional::cross_entropy(out, labels));
    opt_dp.step();
  }
  synchronize(kGpu);
  const auto a = wrapped->named_parameters(), b = single->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    expect_close(a[i].second, b[i].second, 1e-5,
                 a[i].first + " after " + std::to_string(kSteps) + " steps over " +
                     std::to_string(replicas) + " replicas of cuda:0");
  }
}

TEST(DataParallelGpu, DuplicatedDeviceTwoReplicasEqualsOneDevice) {
  DDP_REQUIRE_CUDA();
  expect_equivalent_on_gpu(2);
}

TEST(DataParallelGpu, DuplicatedDeviceThreeReplicasEqualsOneDevice) {
  DDP_REQUIRE_CUDA();
  expect_equivalent_on_gpu(3);
}

TEST(DataParallelGpu, ModuleOnTheWrongDeviceGivesPyTorchsMessage) {
  DDP_REQUIRE_CUDA();
  DataParallel dp(mlp(1), {kGpu, kGpu});  // the model stays on the CPU
  try {
    dp(randn({4, 48}, 1));
    ADD_FAILURE() << "forward accepted a module on the CPU";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(),
                 "module must have its parameters and buffers on device cuda:0 (device_ids[0]) "
                 "but found one of them on device: cpu");
  }
}

TEST(DataParallelGpu, OutputOnTheCpu) {
  DDP_REQUIRE_CUDA();
  auto model = mlp(2);
  model->to(kGpu);
  DataParallel dp(model, {kGpu, kGpu}, Device::cpu());
  const Tensor x = randn({6, 48}, 3);
  const Tensor y = dp(x);
  EXPECT_EQ(y.device(), Device::cpu());
  expect_close(y, (*model)(x.to(kGpu)).cpu(), 1e-5, "gathered on the cpu");
}

}  // namespace
}  // namespace ddp
