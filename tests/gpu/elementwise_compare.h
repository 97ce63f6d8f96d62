// Comparisons of a GPU tensor with the CPU's, element by element, for the gpu tests
// of elementwise kernels (mixed_precision_gpu_test.cpp, vec_map_gpu_test.cpp).
#pragma once

#include "runtime/ops/ops.h"
#include "runtime/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

namespace ddp::gpu_test {

// |a - e| <= rtol * |e| + atol elementwise (both 0: the same value), a on the GPU, e
// on the CPU, same dtype; a NaN expected must be a NaN.
inline void expect_close(const Tensor& actual, const Tensor& expected, double rtol, double atol,
                         const std::string& what) {
  ASSERT_TRUE(actual.device().is_cuda()) << what;
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const auto a = cast(actual.cpu(), DType::f32).to_vector<float>();
  const auto e = cast(expected, DType::f32).to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(e[i])) {
      ASSERT_TRUE(std::isnan(a[i])) << what << ": element " << i << " should be NaN";
      continue;
    }
    ASSERT_NEAR(a[i], e[i], rtol * std::fabs(e[i]) + atol)
        << what << ": element " << i << " of " << a.size();
  }
}

// The same bytes, element by element (any devices, same dtype and shape).
inline void expect_same_bytes(const Tensor& actual, const Tensor& expected,
                              const std::string& what) {
  const Tensor a = actual.cpu(), e = expected.cpu();
  ASSERT_EQ(a.dtype(), e.dtype()) << what;
  ASSERT_EQ(a.shape(), e.shape()) << what;
  const auto* pa = static_cast<const unsigned char*>(a.data_ptr());
  const auto* pe = static_cast<const unsigned char*>(e.data_ptr());
  const size_t width = element_size(a.dtype());
  for (size_t i = 0; i < a.nbytes(); i += width) {
    ASSERT_EQ(std::memcmp(pa + i, pe + i, width), 0) << what << ": element " << i / width;
  }
}

}  // namespace ddp::gpu_test
