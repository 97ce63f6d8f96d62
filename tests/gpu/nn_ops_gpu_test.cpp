// The layer and optimizer ops on cuda:0 against the same ops on the CPU, with
// random inputs. Copies and comparisons (im2col, permute4, max_pool2d, dropout_mask)
// must match bit for bit; sums and optimizer steps within a stated tolerance (nvcc
// contracts multiply-adds into FMAs). Without a GPU every test skips and says why.
#include "runtime/device.h"
#include "runtime/ops/nn_ops.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor.h"
#include "tests/gpu/require_gpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

// A namespace of its own: helpers named as in other files of the unity build (Note
// [unity test builds] in tests/CMakeLists.txt).
namespace ddp::nn_ops_gpu_test {
namespace {

using kernels::Conv2dGeometry;

using gpu_test::kGpu;

// |actual - expected| <= rtol * (|expected| + max |expected|) for every element.
void expect_close(const Tensor& actual, const Tensor& expected, double rtol) {
  ASSERT_EQ(actual.shape(), expected.shape());
  ASSERT_TRUE(actual.device().is_cuda()) << actual.device();
  const std::vector<float> a = actual.cpu().to_vector<float>(), e = expected.to_vector<float>();
  double scale = 0.0;
  for (float v : e) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], e[i], rtol * (std::fabs(e[i]) + scale))
        << "element " << i << " of " << a.size();
  }
}

void expect_same_bytes(const Tensor& actual, const Tensor& expected) {
  ASSERT_TRUE(actual.device().is_cuda()) << actual.device();
  const Tensor a = actual.cpu();
  ASSERT_EQ(a.dtype(), expected.dtype());
  ASSERT_EQ(a.shape(), expected.shape());
  const auto* pa = static_cast<const unsigned char*>(a.data_ptr());
  const auto* pe = static_cast<const unsigned char*>(expected.data_ptr());
  const size_t width = element_size(a.dtype());
  for (size_t i = 0; i < a.nbytes(); i += width) {
    ASSERT_EQ(std::memcmp(pa + i, pe + i, width), 0) << "element " << i / width << " differs";
  }
}

// {n, c, h, w, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w}
const std::vector<Conv2dGeometry> kConvCases = {
    {4, 3, 17, 15, 3, 3, 1, 1, 1, 1},
    {2, 5, 12, 13, 3, 2, 2, 3, 0, 1},
    {3, 2, 9, 9, 5, 5, 2, 2, 2, 2},
    {2, 8, 8, 8, 1, 1, 1, 1, 0, 0},
};

const std::vector<Conv2dGeometry> kPoolCases = {
    {4, 3, 16, 16, 2, 2, 2, 2, 0, 0},
    {2, 5, 11, 13, 3, 3, 2, 2, 0, 0},
    {3, 2, 9, 10, 3, 3, 1, 1, 1, 1},
    {2, 2, 7, 8, 2, 3, 1, 2, 1, 1},
};

Conv2dGeometry geometry_for(const Tensor& x, const Conv2dGeometry& g) {
  return conv_geometry(x, {g.kernel_h, g.kernel_w}, {g.stride_h, g.stride_w}, {g.pad_h, g.pad_w});
}

std::string describe(const Conv2dGeometry& g) {
  return fmt::format("input [{}, {}, {}, {}] kernel {}x{} stride {}x{} padding {}x{}", g.n, g.c,
                     g.h, g.w, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w, g.pad_h, g.pad_w);
}

TEST(NnOpsGpu, Im2colAndCol2imMatchCpu) {
  DDP_REQUIRE_CUDA();
  uint64_t seed = 1;
  for (const Conv2dGeometry& c : kConvCases) {
    SCOPED_TRACE(describe(c));
    const Tensor x = randn({c.n, c.c, c.h, c.w}, ++seed);
    const Conv2dGeometry g = geometry_for(x, c);
    const Tensor cols = im2col(x, g);
    expect_same_bytes(im2col(x.to(kGpu), g), cols);
    const Tensor y = randn(cols.shape(), ++seed);
    // Both devices sum each pixel's entries in the same order.
    expect_close(col2im(y.to(kGpu), g), col2im(y, g), 1e-6);
  }
}

TEST(NnOpsGpu, Permute4MatchesCpu) {
  DDP_REQUIRE_CUDA();
  const Tensor x = randn({3, 5, 7, 9}, 10);
  for (const std::array<int, 4>& perm : std::vector<std::array<int, 4>>{
           {0, 1, 2, 3}, {0, 3, 1, 2}, {0, 2, 3, 1}, {3, 2, 1, 0}, {2, 0, 3, 1}}) {
    SCOPED_TRACE(fmt::format("perm [{}, {}, {}, {}]", perm[0], perm[1], perm[2], perm[3]));
    expect_same_bytes(permute4(x.to(kGpu), perm), permute4(x, perm));
  }
  for (DType d : {DType::bf16, DType::i64, DType::u8}) {
    const Tensor xd = cast(x, d);
    expect_same_bytes(permute4(xd.to(kGpu), {1, 3, 0, 2}), permute4(xd, {1, 3, 0, 2}));
  }
}

TEST(NnOpsGpu, MaxPool2dAndBackwardMatchCpu) {
  DDP_REQUIRE_CUDA();
  uint64_t seed = 20;
  for (const Conv2dGeometry& c : kPoolCases) {
    SCOPED_TRACE(describe(c));
    // Values in {0, ..., 3}: ties everywhere, so the first-maximum rule is exercised.
    std::vector<float> v = rand({c.n, c.c, c.h, c.w}, ++seed).to_vector<float>();
    for (float& e : v) e = std::floor(4.0f * e);
    const Tensor x = from_vector(v, {c.n, c.c, c.h, c.w});
    const Conv2dGeometry g = geometry_for(x, c);
    const MaxPoolResult cpu = max_pool2d(x, g);
    const MaxPoolResult gpu = max_pool2d(x.to(kGpu), g);
    expect_same_bytes(gpu.out, cpu.out);
    expect_same_bytes(gpu.indices, cpu.indices);
    const Tensor grad = randn(cpu.out.shape(), ++seed);
    expect_close(max_pool2d_backward(grad.to(kGpu), gpu.indices, g),
                 max_pool2d_backward(grad, cpu.indices, g), 1e-6);
  }
}

TEST(NnOpsGpu, DropoutMaskMatchesCpuAndRand) {
  DDP_REQUIRE_CUDA();
  for (const Shape& shape : {Shape{1}, Shape{7, 11, 13}, Shape{4099}}) {
    for (float p : {0.0f, 0.25f, 0.9f}) {
      SCOPED_TRACE(fmt::format("shape {} p {}", shape_str(shape), p));
      const Tensor gpu = dropout_mask(shape, 99, 3, p, kGpu);
      expect_same_bytes(gpu, dropout_mask(shape, 99, 3, p, Device::cpu()));
      const auto u = rand(shape, 99, {.device = kGpu}, 3).cpu().to_vector<float>();
      const auto m = gpu.cpu().to_vector<float>();
      for (size_t i = 0; i < m.size(); ++i) ASSERT_EQ(m[i] != 0.0f, u[i] >= p) << "element " << i;
    }
  }
}

TEST(NnOpsGpu, SgdUpdateMatchesCpu) {
  DDP_REQUIRE_CUDA();
  const std::vector<std::pair<float, bool>> cases = {{0.0f, false}, {0.9f, false}, {0.9f, true}};
  for (const auto& [momentum, nesterov] : cases) {
    SCOPED_TRACE(fmt::format("momentum {} nesterov {}", momentum, nesterov));
    Tensor p_cpu = randn({1000}, 30), b_cpu = zeros({1000});
    Tensor p_gpu = p_cpu.to(kGpu), b_gpu = b_cpu.to(kGpu);
    for (int step = 0; step < 3; ++step) {
      const Tensor grad = randn({1000}, 31 + static_cast<uint64_t>(step));
      const kernels::SgdStep s{.lr = 0.05f,
                               .momentum = momentum,
                               .weight_decay = 0.01f,
                               .nesterov = nesterov,
                               .first_step = step == 0};
      sgd_update_(p_cpu, grad, b_cpu, s);
      sgd_update_(p_gpu, grad.to(kGpu), b_gpu, s);
    }
    expect_close(p_gpu, p_cpu, 1e-6);
    expect_close(b_gpu, b_cpu, 1e-6);
  }
}

TEST(NnOpsGpu, AdamWUpdateMatchesCpu) {
  DDP_REQUIRE_CUDA();
  Tensor p_cpu = randn({1000}, 40), m_cpu = zeros({1000}), v_cpu = zeros({1000});
  Tensor p_gpu = p_cpu.to(kGpu), m_gpu = m_cpu.to(kGpu), v_gpu = v_cpu.to(kGpu);
  for (int64_t t = 1; t <= 3; ++t) {
    const Tensor grad = randn({1000}, 41 + static_cast<uint64_t>(t));
    const kernels::AdamWStep s{.lr = 0.01f, .weight_decay = 0.1f, .step = t};
    adamw_update_(p_cpu, grad, m_cpu, v_cpu, s);
    adamw_update_(p_gpu, grad.to(kGpu), m_gpu, v_gpu, s);
  }
  expect_close(p_gpu, p_cpu, 1e-5);
  expect_close(m_gpu, m_cpu, 1e-5);
  expect_close(v_gpu, v_cpu, 1e-5);
}

}  // namespace
}  // namespace ddp::nn_ops_gpu_test
