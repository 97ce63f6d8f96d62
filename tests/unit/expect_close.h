// An op's float output against a double-precision reference, shared by the op tests
// (ops_test.cpp, nn_ops_test.cpp).
#pragma once

#include "runtime/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace ddp::test_util {

inline std::vector<double> as_double(const Tensor& t) {
  const auto v = t.to_vector<float>();
  return std::vector<double>(v.begin(), v.end());
}

// Each element within atol + rtol * |expected|.
inline void expect_close(const std::vector<double>& expected, const Tensor& actual, double rtol,
                         double atol = 1e-6) {
  const auto got = actual.to_vector<float>();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], expected[i], atol + rtol * std::fabs(expected[i])) << "element " << i;
  }
}

}  // namespace ddp::test_util
