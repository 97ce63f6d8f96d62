// The multi-tensor CUDA kernels (runtime/ops/multi_tensor.h) against the CPU and the
// per-tensor kernels, on lists longer than one launch takes (kListMax) with sizes
// around a chunk (8192 elements) and empty tensors: the sum of squares (the same bits
// twice), clipping without a host synchronization, and AdamW bit for bit with one
// update per tensor; both also on views that start off a 16-byte vector (the kernels'
// one-element path, Note [vectorized rows]); AdamW taking the clip factor into its
// step (Note [clipping in the step]). Without a GPU every test skips and says why.
#include "runtime/autograd/autograd.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/ops/multi_tensor.h"
#include "runtime/ops/nn_ops.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "tests/gpu/require_gpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace ddp {
namespace {

using gpu_test::kGpu;

std::vector<int64_t> sizes() {
  std::vector<int64_t> n;
  for (int i = 0; i < 100; ++i) {
    const int64_t pick[] = {0, 1, 7, 8191, 8192, 8193, 30000, 100001};
    n.push_back(pick[(i * 5) % 8]);
  }
  return n;
}

std::vector<Tensor> tensors_on(const Device& device, uint64_t seed) {
  std::vector<Tensor> xs;
  for (int64_t n : sizes()) xs.push_back(randn({n}, seed++, {.device = device}));
  return xs;
}

TEST(MultiTensorGpu, SumOfSquaresMatchesTheCpuAndRepeatsItsBits) {
  DDP_REQUIRE_CUDA();
  const std::vector<Tensor> cpu = tensors_on(Device::cpu(), 1), gpu = tensors_on(kGpu, 1);
  const float want = sum_squares_all(cpu).item<float>();
  const float a = sum_squares_all(gpu).cpu().item<float>();
  const float b = sum_squares_all(gpu).cpu().item<float>();
  EXPECT_NEAR(a, want, 1e-6 * want);
  EXPECT_EQ(a, b);
}

TEST(MultiTensorGpu, ClipOnTheDeviceMatchesTheCpuWithoutAHostSync) {
  DDP_REQUIRE_CUDA();
  const auto params_with_grads = [](const Device& device) {
    std::vector<Tensor> ps;
    for (const Tensor& g : tensors_on(device, 40)) {
      Tensor p = zeros(g.shape(), {.device = device});
      set_requires_grad(p, true);
      set_grad(p, g);
      ps.push_back(p);
    }
    return ps;
  };
  const std::vector<Tensor> cpu = params_with_grads(Device::cpu());
  const std::vector<Tensor> gpu = params_with_grads(kGpu);
  const float want = optim::clip_grad_norm_on_device(cpu, 3.0).item<float>();
  cuda_api::device_synchronize(0);
  const uint64_t syncs = cuda_api::host_sync_count();
  const Tensor norm = optim::clip_grad_norm_on_device(gpu, 3.0);
  EXPECT_EQ(cuda_api::host_sync_count() - syncs, 0u) << "clipping waited for the device";
  EXPECT_NEAR(norm.cpu().item<float>(), want, 1e-6 * want);
  for (size_t i = 0; i < cpu.size(); ++i) {
    const auto a = grad(cpu[i]).to_vector<float>(), b = grad(gpu[i]).cpu().to_vector<float>();
    for (size_t j = 0; j < a.size(); ++j) {
      ASSERT_NEAR(b[j], a[j], 1e-6 * std::fabs(a[j]) + 1e-12) << "tensor " << i << " element " << j;
    }
  }
}

TEST(MultiTensorGpu, AdamWOverAListEqualsOneUpdatePerTensorBitForBit) {
  DDP_REQUIRE_CUDA();
  std::vector<Tensor> p1 = tensors_on(kGpu, 100), p2, g = tensors_on(kGpu, 300);
  std::vector<Tensor> m1 = tensors_on(kGpu, 500), m2, v1, v2;
  std::vector<kernels::AdamWStep> steps;
  uint64_t seed = 700;
  for (size_t i = 0; i < p1.size(); ++i) {
    p2.push_back(p1[i].clone());
    m2.push_back(m1[i].clone());
    v1.push_back(rand(p1[i].shape(), seed++, {.device = kGpu}));
    v2.push_back(v1[i].clone());
    steps.push_back({.lr = 3e-4f,
                     .beta1 = 0.9f,
                     .beta2 = 0.95f,
                     .eps = 1e-8f,
                     .weight_decay = i % 2 == 0 ? 0.1f : 0.0f,
                     .step = static_cast<int64_t>(i % 3) + 1});
  }
  adamw_update_all_(p2, g, m2, v2, steps);
  for (size_t i = 0; i < p1.size(); ++i) {
    adamw_update_(p1[i], g[i], m1[i], v1[i], steps[i]);
    ASSERT_EQ(p1[i].cpu().to_vector<float>(), p2[i].cpu().to_vector<float>()) << "param " << i;
    ASSERT_EQ(m1[i].cpu().to_vector<float>(), m2[i].cpu().to_vector<float>()) << "m " << i;
    ASSERT_EQ(v1[i].cpu().to_vector<float>(), v2[i].cpu().to_vector<float>()) << "v " << i;
  }
}

// The same tensors as tensors_on, each a view one element into a buffer of its own:
// no tensor starts on a 16-byte vector.
std::vector<Tensor> off_vector(const std::vector<Tensor>& xs) {
  std::vector<Tensor> views;
  for (const Tensor& x : xs) {
    Tensor buffer = zeros({x.numel() + 1}, {.device = x.device()});
    Tensor view = buffer.slice(1, x.numel() + 1);
    copy_(view, x);
    views.push_back(view);
  }
  return views;
}

TEST(MultiTensorGpu, ViewsOffAVectorGiveTheSameSumOfSquaresAdamWAndScale) {
  DDP_REQUIRE_CUDA();
  const std::vector<Tensor> cpu = tensors_on(Device::cpu(), 1), gpu = tensors_on(kGpu, 1);
  const float want = sum_squares_all(cpu).item<float>();
  const float off = sum_squares_all(off_vector(gpu)).cpu().item<float>();
  EXPECT_NEAR(off, want, 1e-6 * want);
  // Each chunk is cut by index (Note [vectorized rows]): the aligned tensors' bits.
  EXPECT_EQ(off, sum_squares_all(gpu).cpu().item<float>());
  std::vector<Tensor> p1 = tensors_on(kGpu, 100), g1 = tensors_on(kGpu, 300);
  std::vector<Tensor> m1 = tensors_on(kGpu, 500), v1 = tensors_on(kGpu, 900);
  for (Tensor& v : v1) v = mul(v, v);  // a second moment is never negative
  std::vector<Tensor> p2 = off_vector(p1), g2 = off_vector(g1), m2 = off_vector(m1);
  std::vector<Tensor> v2 = off_vector(v1);
  std::vector<kernels::AdamWStep> steps(
      p1.size(),
      {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 2});
  adamw_update_all_(p1, g1, m1, v1, steps);
  adamw_update_all_(p2, g2, m2, v2, steps);
  const Tensor factor = full({}, 0.375f, {.device = kGpu});
  scale_by_(g1, factor);
  scale_by_(g2, factor);
  for (size_t i = 0; i < g1.size(); ++i) {
    ASSERT_EQ(g1[i].cpu().to_vector<float>(), g2[i].cpu().to_vector<float>()) << "scaled " << i;
  }
  for (size_t i = 0; i < p1.size(); ++i) {
    ASSERT_EQ(p1[i].cpu().to_vector<float>(), p2[i].cpu().to_vector<float>()) << "param " << i;
    ASSERT_EQ(m1[i].cpu().to_vector<float>(), m2[i].cpu().to_vector<float>()) << "m " << i;
    ASSERT_EQ(v1[i].cpu().to_vector<float>(), v2[i].cpu().to_vector<float>()) << "v " << i;
  }
}

// Note [clipping in the step] on the device: clip then step with the factor applied by
// the scale pass (a) or by AdamW's kernel as it reads the gradients (b), plain and
// capturable (the factor read from the device), b's gradients aligned or each one
// element off a 16-byte vector: the same parameters bit for bit over two clipped steps,
// b's gradients unscaled, and no host synchronization in b's clip and step.
TEST(MultiTensorGpu, AdamWTakesTheClipFactorIntoItsKernelWithTheSameBits) {
  DDP_REQUIRE_CUDA();
  const auto with_grads = [](std::vector<Tensor> ps, const std::vector<Tensor>& gs) {
    for (size_t i = 0; i < ps.size(); ++i) {
      set_requires_grad(ps[i], true);
      set_grad(ps[i], gs[i]);
    }
    return ps;
  };
  for (const bool capturable : {false, true}) {
    for (const bool views : {false, true}) {
      const std::vector<Tensor> a = with_grads(tensors_on(kGpu, 100), tensors_on(kGpu, 300));
      const std::vector<Tensor> gb = tensors_on(kGpu, 300);
      const std::vector<Tensor> b = with_grads(tensors_on(kGpu, 100), views ? off_vector(gb) : gb);
      const optim::AdamWOptions options{.lr = 1e-3f, .beta2 = 0.95f, .weight_decay = 0.1f};
      optim::AdamW opt_a(a, options), opt_b(b, options);
      opt_a.set_capturable(capturable);
      opt_b.set_capturable(capturable);
      for (int step = 0; step < 2; ++step) {
        if (step > 0) {  // this step's gradients, the same for both
          const std::vector<Tensor> fresh = tensors_on(kGpu, 2000);
          for (size_t i = 0; i < a.size(); ++i) {
            Tensor ga = grad(a[i]), gb = grad(b[i]);  // b's may be views: copied into
            copy_(ga, fresh[i]);
            copy_(gb, fresh[i]);
          }
        }
        std::vector<std::vector<float>> grads_before;
        for (const Tensor& p : b) grads_before.push_back(grad(p).cpu().to_vector<float>());
        const Tensor norm_a = optim::clip_grad_norm_on_device(a, 3.0);
        opt_a.step();
        cuda_api::device_synchronize(0);
        const uint64_t syncs = cuda_api::host_sync_count();
        const Tensor norm_b = optim::clip_grad_norm_on_device(b, 3.0, &opt_b);
        opt_b.step();
        EXPECT_EQ(cuda_api::host_sync_count() - syncs, 0u) << "clip and step waited";
        ASSERT_EQ(norm_a.cpu().item<float>(), norm_b.cpu().item<float>());
        ASSERT_LT(3.0f, norm_b.cpu().item<float>()) << "not clipped: the test checks nothing";
        for (size_t i = 0; i < a.size(); ++i) {
          ASSERT_EQ(a[i].cpu().to_vector<float>(), b[i].cpu().to_vector<float>())
              << "param " << i << ", step " << step << ", capturable " << capturable << ", views "
              << views;
          ASSERT_EQ(grad(b[i]).cpu().to_vector<float>(), grads_before[i])
              << "b's gradient " << i << " was scaled in memory";
        }
      }
    }
  }
}

}  // namespace
}  // namespace ddp
