// Every op on cuda:0 against the same op on the CPU, with fresh random inputs.
// Without a GPU every test skips and says why.
#include "runtime/device.h"
#include "runtime/memory/allocator.h"
#include "runtime/ops/ops.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"
#include "tests/gpu/require_gpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace ddp {
namespace {

using gpu_test::kGpu;

std::vector<float> host_f32(const Tensor& t) {
  const Tensor h = t.cpu();
  return (h.dtype() == DType::f32 ? h : cast(h, DType::f32)).to_vector<float>();
}

// |actual - expected| <= rtol * (|expected| + max |expected|) for every element:
// relative per element, and relative to the tensor's scale where terms cancel.
void expect_close(const Tensor& actual, const Tensor& expected, double rtol) {
  ASSERT_EQ(actual.shape(), expected.shape());
  const std::vector<float> a = host_f32(actual), e = host_f32(expected);
  double scale = 0.0;
  for (float v : e) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(e[i])) {
      ASSERT_TRUE(std::isnan(a[i])) << "element " << i << ": expected NaN, got " << a[i];
      continue;
    }
    const double tol = rtol * (std::fabs(e[i]) + scale);
    ASSERT_NEAR(a[i], e[i], tol) << "element " << i << " of " << a.size();
  }
}

// Same dtype, shape and bytes (for results that must be bit-identical).
void expect_same_bytes(const Tensor& actual, const Tensor& expected) {
  const Tensor a = actual.cpu(), e = expected.cpu();
  ASSERT_EQ(a.dtype(), e.dtype());
  ASSERT_EQ(a.shape(), e.shape());
  const auto* pa = static_cast<const unsigned char*>(a.data_ptr());
  const auto* pe = static_cast<const unsigned char*>(e.data_ptr());
  const size_t bytes = a.nbytes(), width = element_size(a.dtype());
  for (size_t i = 0; i < bytes; i += width) {
    ASSERT_EQ(std::memcmp(pa + i, pe + i, width), 0)
        << "element " << i / width << " of dtype " << dtype_name(a.dtype()) << " differs";
  }
}

Tensor gpu_randn(const Shape& shape, uint64_t seed) {
  return randn(shape, seed, {.device = kGpu});
}

Tensor labels_for(int64_t rows, int64_t classes, const Device& device) {
  std::vector<int64_t> v(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) v[static_cast<size_t>(i)] = (i * 7 + 3) % classes;
  return from_vector<int64_t>(v, {rows}, {.dtype = DType::i64, .device = device});
}

// ---- GEMM --------------------------------------------------------------------

class GpuMatmulTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(GpuMatmulTest, MatchesCpuForEveryTransposition) {
  DDP_REQUIRE_CUDA();
  const auto [ta, tb] = GetParam();
  const int64_t m = 67, n = 33, k = 129;
  const Tensor a = gpu_randn(ta ? Shape{k, m} : Shape{m, k}, 11);
  const Tensor b = gpu_randn(tb ? Shape{n, k} : Shape{k, n}, 12);
  const MatmulOptions o{.trans_a = ta, .trans_b = tb};
  const Tensor c = matmul(a, b, o);
  EXPECT_EQ(c.device(), kGpu);
  expect_close(c, matmul(a.cpu(), b.cpu(), o), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Transpose, GpuMatmulTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

TEST(GpuOps, MatmulOutWithAlphaBetaMatchesCpu) {
  DDP_REQUIRE_CUDA();
  const Tensor a = gpu_randn({40, 24}, 13), b = gpu_randn({24, 56}, 14);
  Tensor out = gpu_randn({40, 56}, 15);
  Tensor expected = out.cpu().clone();
  const MatmulOptions o{.alpha = 0.5f, .beta = 2.0f};
  matmul_out(a, b, out, o);
  matmul_out(a.cpu(), b.cpu(), expected, o);
  expect_close(out, expected, 1e-4);
}

TEST(GpuOps, MatmulBf16AndF16MatchCpu) {
  DDP_REQUIRE_CUDA();
  const Tensor a = gpu_randn({64, 96}, 16), b = gpu_randn({96, 48}, 17);
  for (DType d : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(dtype_name(d)));
    const Tensor ad = cast(a, d), bd = cast(b, d);
    const Tensor c = matmul(ad, bd);
    EXPECT_EQ(c.dtype(), d);
    // Reference: f32 product of the same rounded inputs; the output rounding of
    // bf16 (8 bits) dominates the tolerance.
    const Tensor ref = matmul(cast(ad.cpu(), DType::f32), cast(bd.cpu(), DType::f32));
    expect_close(c, ref, 1e-2);
  }
}

// ---- elementwise ---------------------------------------------------------------

TEST(GpuOps, BinaryOpsMatchCpu) {
  DDP_REQUIRE_CUDA();
  // Past the launch cap of 4096 x 256 threads, so the grid-stride loop wraps.
  for (const Shape& shape : {Shape{37, 53}, Shape{(1 << 21) + 3}}) {
    const Tensor a = gpu_randn(shape, 21), b = gpu_randn(shape, 22);
    const Tensor ha = a.cpu(), hb = b.cpu();
    expect_close(add(a, b), add(ha, hb), 1e-5);
    expect_close(sub(a, b), sub(ha, hb), 1e-5);
    expect_close(mul(a, b), mul(ha, hb), 1e-5);
  }
}

TEST(GpuOps, ScaleAxpyBiasReluMatchCpu) {
  DDP_REQUIRE_CUDA();
  const Tensor x = gpu_randn({19, 31}, 23), bias = gpu_randn({31}, 24);
  Tensor y = gpu_randn({19, 31}, 25);
  Tensor hy = y.cpu().clone();
  expect_close(scale(x, -1.75f), scale(x.cpu(), -1.75f), 1e-5);
  axpy_(0.3f, x, y);
  axpy_(0.3f, x.cpu(), hy);
  expect_close(y, hy, 1e-5);
  expect_close(add_bias_rows(x, bias), add_bias_rows(x.cpu(), bias.cpu()), 1e-5);
  expect_close(relu(x), relu(x.cpu()), 1e-5);
  expect_close(relu_backward(y, x), relu_backward(hy, x.cpu()), 1e-5);
}

// ReLU of NaN is NaN on both devices (as torch.relu), and -0.0, infinities and
// the rest agree bit for bit.
TEST(GpuOps, ReluKeepsNanAsTheCpu) {
  DDP_REQUIRE_CUDA();
  const std::vector<float> v = {NAN, -0.0f, 0.0f, -1.5f, 2.5f, INFINITY, -INFINITY, 1e-30f};
  const Tensor x = from_vector(v, {static_cast<int64_t>(v.size())});
  const std::vector<float> gpu = relu(x.to(kGpu)).cpu().to_vector<float>();
  const std::vector<float> cpu = relu(x).to_vector<float>();
  ASSERT_TRUE(std::isnan(gpu[0])) << "relu(NaN) on " << kGpu.str() << " is " << gpu[0];
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t a = 0, b = 0;
    std::memcpy(&a, &gpu[i], sizeof a);
    std::memcpy(&b, &cpu[i], sizeof b);
    EXPECT_EQ(a, b) << "relu(" << v[i] << "): " << gpu[i] << " on the GPU, " << cpu[i]
                    << " on the CPU";
  }
}

TEST(GpuOps, FillEveryDtypeMatchesCpu) {
  DDP_REQUIRE_CUDA();
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(std::string(dtype_name(d)));
    Tensor g = empty({1001}, {.dtype = d, .device = kGpu});
    Tensor h = empty({1001}, {.dtype = d});
    fill_(g, 3.7);
    fill_(h, 3.7);
    expect_same_bytes(g, h);
  }
}

TEST(GpuOps, ArangeEveryDtypeMatchesCpu) {
  DDP_REQUIRE_CUDA();
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(std::string(dtype_name(d)));
    expect_same_bytes(arange(0.5, 200.0, 0.3, {.dtype = d, .device = kGpu}),
                      arange(0.5, 200.0, 0.3, {.dtype = d}));
    expect_same_bytes(arange(777, {.dtype = d, .device = kGpu}), arange(777, {.dtype = d}));
  }
}

TEST(GpuOps, CastEveryPairMatchesCpu) {
  DDP_REQUIRE_CUDA();
  // Non-negative and below 256 so every integer type holds the truncated value
  // (a float out of an integer's range converts differently on each device).
  const Tensor base = scale(rand({513}, 31, {.device = kGpu}), 250.0f);
  for (DType from : kAllDTypes) {
    const Tensor src = cast(base, from);
    for (DType to : kAllDTypes) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)));
      expect_same_bytes(cast(src, to), cast(src.cpu(), to));
    }
  }
}

// ---- reductions ------------------------------------------------------------------

TEST(GpuOps, SumAllMatchesCpuAndIsDeterministic) {
  DDP_REQUIRE_CUDA();
  // One element, one block, and enough for the two-pass path.
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{(1 << 21) + 5}}) {
    SCOPED_TRACE(n);
    const Tensor x = rand({n}, 32, {.device = kGpu});
    const Tensor s = sum(x);
    EXPECT_EQ(s.dim(), 0);
    // Both devices add in double; positive terms keep the relative error meaningful.
    expect_close(s, sum(x.cpu()), 1e-5);
    EXPECT_EQ(sum(x).item<float>(), s.item<float>()) << "two runs gave different bits";
    expect_close(mean(x), mean(x.cpu()), 1e-5);
  }
  EXPECT_EQ(sum(empty({0}, {.device = kGpu})).item<float>(), 0.0f);
}

TEST(GpuOps, SumAndArgmaxAlongEachDimMatchCpu) {
  DDP_REQUIRE_CUDA();
  const Tensor x = gpu_randn({5, 7, 9}, 33);
  const Tensor hx = x.cpu();
  for (int64_t dim : {0, 1, 2, -1}) {
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim << " keepdim " << keepdim);
      expect_close(sum(x, dim, keepdim), sum(hx, dim, keepdim), 1e-5);
      expect_close(mean(x, dim, keepdim), mean(hx, dim, keepdim), 1e-5);
      const Tensor am = argmax(x, dim, keepdim);
      EXPECT_EQ(am.dtype(), DType::i64);
      EXPECT_EQ(am.cpu().to_vector<int64_t>(), argmax(hx, dim, keepdim).to_vector<int64_t>());
    }
  }
}

// Long reduced dims take a block tree and several passes (Note [dim reduce]):
// sums against a float64 reference computed here, argmax against the CPU.
TEST(GpuOps, SumAndArgmaxAlongLongDimsMatchFloat64) {
  DDP_REQUIRE_CUDA();
  const Shape shapes[] = {{4096, 3}, {3, 4096}, {64, 4096, 2}, {2, 100003}, {100003, 2}, {9, 1}};
  uint64_t seed = 40;
  for (const Shape& shape : shapes) {
    const Tensor x = gpu_randn(shape, seed++);
    const Tensor hx = x.cpu();
    const std::vector<float> v = hx.to_vector<float>();
    for (int64_t dim = 0; dim < static_cast<int64_t>(shape.size()); ++dim) {
      SCOPED_TRACE(::testing::Message() << "shape " << shape_str(shape) << " dim " << dim);
      int64_t outer = 1, inner = 1;
      for (int64_t d = 0; d < dim; ++d) outer *= shape[static_cast<size_t>(d)];
      for (size_t d = static_cast<size_t>(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
      const int64_t n = shape[static_cast<size_t>(dim)];
      const std::vector<float> got = sum(x, dim).cpu().to_vector<float>();
      ASSERT_EQ(static_cast<int64_t>(got.size()), outer * inner);
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          double ref = 0.0, magnitude = 0.0;
          for (int64_t j = 0; j < n; ++j) {
            const double e = v[static_cast<size_t>((o * n + j) * inner + i)];
            ref += e;
            magnitude += std::fabs(e);
          }
          // Accumulated in double: the float result is off by its final rounding only.
          const double got_i = got[static_cast<size_t>(o * inner + i)];
          ASSERT_LE(std::fabs(got_i - ref), 1e-6 * magnitude + 1e-30)
              << "output (" << o << ", " << i << "): " << got_i << " vs float64 " << ref;
        }
      }
      EXPECT_EQ(argmax(x, dim).cpu().to_vector<int64_t>(), argmax(hx, dim).to_vector<int64_t>());
    }
  }
}

TEST(GpuOps, SumAlongADimIsTheSameOnEveryRun) {
  DDP_REQUIRE_CUDA();
  const Tensor x = gpu_randn({3, 70001, 5}, 47);
  const Tensor first = sum(x, 1);
  for (int run = 0; run < 3; ++run) expect_same_bytes(sum(x, 1), first);
}

TEST(GpuOps, ArgmaxTakesTheFirstOfEqualMaxima) {
  DDP_REQUIRE_CUDA();
  const Tensor x = from_vector<float>({1, 5, 5, 2, 7, 7, 7, 0}, {2, 4}, {.device = kGpu});
  EXPECT_EQ(argmax(x, 1).cpu().to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
}

TEST(GpuOps, SoftmaxCrossEntropyMatchesCpu) {
  DDP_REQUIRE_CUDA();
  // 10 classes (less than a warp) and 300 (several elements per lane).
  for (int64_t classes : {int64_t{10}, int64_t{300}}) {
    SCOPED_TRACE(classes);
    const int64_t rows = 129;
    const Tensor logits = scale(gpu_randn({rows, classes}, 34), 3.0f);
    const Tensor labels = labels_for(rows, classes, kGpu);
    const CrossEntropyResult g = softmax_cross_entropy(logits, labels);
    const CrossEntropyResult h = softmax_cross_entropy(logits.cpu(), labels.cpu());
    EXPECT_EQ(g.loss.dim(), 0);
    expect_close(g.loss, h.loss, 1e-5);
    expect_close(g.probs, h.probs, 1e-5);

    const Tensor grad_loss = full({}, 1.5, {.device = kGpu});
    expect_close(softmax_cross_entropy_backward(g.probs, labels, grad_loss),
                 softmax_cross_entropy_backward(h.probs, labels.cpu(), grad_loss.cpu()), 1e-5);
  }
}

TEST(GpuOps, SoftmaxCrossEntropyOutOfRangeLabelGivesNan) {
  DDP_REQUIRE_CUDA();
  const Tensor logits = gpu_randn({4, 5}, 35);
  for (int64_t bad : {int64_t{5}, int64_t{-1}}) {
    const Tensor labels =
        from_vector<int64_t>({0, bad, 2, 3}, {4}, {.dtype = DType::i64, .device = kGpu});
    EXPECT_TRUE(std::isnan(softmax_cross_entropy(logits, labels).loss.item<float>())) << bad;
  }
}

// ---- random numbers --------------------------------------------------------------

TEST(GpuOps, RandomStreamsEqualTheCpuStreams) {
  DDP_REQUIRE_CUDA();
  // Sizes that end inside a group of four, and a non-zero offset.
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{5}, int64_t{1027}, int64_t{300001}}) {
    for (uint64_t offset : {uint64_t{0}, uint64_t{12345}}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " offset " << offset);
      // Uniforms are exact integer arithmetic: identical bits.
      expect_same_bytes(rand({n}, 41, {.device = kGpu}, offset), rand({n}, 41, {}, offset));
      // Normals differ only by the last bits of logf, sinf and cosf.
      const std::vector<float> g = host_f32(randn({n}, 42, {.device = kGpu}, offset));
      const std::vector<float> h = host_f32(randn({n}, 42, {}, offset));
      ASSERT_EQ(g.size(), h.size());
      for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], h[i], 1e-5) << "element " << i;
    }
  }
}

// ---- moves between devices ---------------------------------------------------------

TEST(GpuOps, ToAndCopyRoundTripExactly) {
  DDP_REQUIRE_CUDA();
  const Tensor h = randn({123, 45}, 51);
  const Tensor g = h.to(kGpu);
  EXPECT_EQ(g.device(), kGpu);
  expect_same_bytes(g.cpu(), h);

  Tensor g2 = empty(h.shape(), {.device = kGpu});
  copy_(g2, g);  // device to device
  Tensor h2 = empty(h.shape());
  copy_(h2, g2);  // device to host
  expect_same_bytes(h2, h);
  for (DType d : {DType::bf16, DType::i64, DType::u8}) {
    const Tensor hd = cast(h, d);
    expect_same_bytes(hd.to(kGpu).cpu(), hd);
  }
}

TEST(GpuOps, NonBlockingCopiesThroughPinnedMemory) {
  DDP_REQUIRE_CUDA();
  const Tensor h = randn({1 << 16}, 52);
  const Tensor pinned = h.pin_memory();
  EXPECT_TRUE(pinned.is_pinned());
  const Tensor g = pinned.to(kGpu, /*non_blocking=*/true);
  const Tensor from_pageable = h.to(kGpu, /*non_blocking=*/true);  // staged
  const Tensor back = g.to(Device::cpu(), /*non_blocking=*/true);
  EXPECT_TRUE(back.is_pinned());
  current_stream(kGpu).synchronize();  // `back` is valid once the stream is done
  expect_same_bytes(back, h);
  expect_same_bytes(from_pageable.cpu(), h);
}

// ---- allocator -------------------------------------------------------------------

TEST(GpuOps, AllocatorStatsFollowTensorsAndReuseFreedBlocks) {
  DDP_REQUIRE_CUDA();
  // Note [no caching]: ctest's gpu.no_caching runs this test with the cache off.
  const char* no_caching = std::getenv("DDP_NO_CUDA_MEMORY_CACHING");
  const bool caching = no_caching == nullptr || std::string(no_caching) == "0";
  // Blocks cached by earlier tests could be a better fit than the one freed here.
  empty_cache(kGpu);
  const uint64_t before = memory_allocated(kGpu);
  const uint64_t reserved_before = memory_reserved(kGpu);
  const MemoryStats stats_before = memory_stats(kGpu);
  const int64_t n = (1 << 20) + 3;  // 4 MiB and 12 bytes
  void* first = nullptr;
  {
    const Tensor t = empty({n}, {.device = kGpu});
    first = t.data_ptr();
    EXPECT_GE(memory_allocated(kGpu), before + static_cast<uint64_t>(n) * 4);
    EXPECT_GE(max_memory_allocated(kGpu), memory_allocated(kGpu));
    if (!caching) {  // its own block of exactly the bytes asked
      EXPECT_EQ(memory_allocated(kGpu), before + static_cast<uint64_t>(n) * 4);
      EXPECT_EQ(memory_stats(kGpu).num_raw_allocs, stats_before.num_raw_allocs + 1);
    }
  }
  EXPECT_EQ(memory_allocated(kGpu), before);
  const uint64_t hits = memory_stats(kGpu).num_cache_hits;
  const Tensor again = empty({n}, {.device = kGpu});
  if (caching) {
    EXPECT_EQ(again.data_ptr(), first) << "the freed block was not reused";
    EXPECT_EQ(memory_stats(kGpu).num_cache_hits, hits + 1);
  } else {
    EXPECT_EQ(memory_stats(kGpu).num_cache_hits, hits) << "a block was reused without caching";
    EXPECT_EQ(memory_stats(kGpu).num_raw_frees, stats_before.num_raw_frees + 1)
        << "the freed tensor's block was not returned at once";
    EXPECT_EQ(memory_reserved(kGpu), reserved_before + static_cast<uint64_t>(n) * 4);
  }
  EXPECT_GE(memory_reserved(kGpu), memory_allocated(kGpu));
}

// ---- errors ----------------------------------------------------------------------

TEST(GpuOps, MixingDevicesNamesBoth) {
  DDP_REQUIRE_CUDA();
  const Tensor g = gpu_randn({3}, 61);
  const Tensor h = randn({3}, 62);
  try {
    (void)add(g, h);
    FAIL() << "add of a cuda and a cpu tensor did not throw";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("Expected all tensors to be on the same device, but found "
                                         "at least two devices, cuda:0 and cpu!"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddp
