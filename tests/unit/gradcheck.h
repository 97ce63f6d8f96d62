// Central finite differences of a forward against its autograd gradient, shared
// by the op tests (autograd_test.cpp, transformer_ops_test.cpp).
#pragma once

#include "runtime/autograd/functions.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace ddp::test_util {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Loss = sum(f(inputs) * projection), a scalar whose gradient checks every output element.
inline double project(const Tensor& out, const Tensor& projection) {
  const auto o = out.to_vector<float>(), p = projection.to_vector<float>();
  double acc = 0;
  for (size_t i = 0; i < o.size(); ++i) acc += static_cast<double>(o[i]) * p[i];
  return acc;
}

inline void gradcheck(const Fn& f, std::vector<Tensor> inputs, double h = 1e-2, double tol = 2e-3) {
  for (Tensor& t : inputs) set_requires_grad(t, true);
  Tensor out = f(inputs);
  const Tensor projection = randn(out.shape(), 1234);
  backward(functional::sum(functional::mul(out, projection)));
  NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const auto analytic = grad(inputs[k]).to_vector<float>();
    const int64_t n = inputs[k].numel();
    const int64_t stride = std::max<int64_t>(1, n / 25);  // about 25 elements per input
    for (int64_t i = 0; i < n; i += stride) {
      auto values = inputs[k].to_vector<float>();
      const float x0 = values[static_cast<size_t>(i)];
      std::vector<Tensor> plus = inputs, minus = inputs;
      values[static_cast<size_t>(i)] = x0 + static_cast<float>(h);
      plus[k] = from_vector(values, inputs[k].shape());
      values[static_cast<size_t>(i)] = x0 - static_cast<float>(h);
      minus[k] = from_vector(values, inputs[k].shape());
      const double numeric =
          (project(f(plus), projection) - project(f(minus), projection)) / (2 * h);
      const double a = analytic[static_cast<size_t>(i)];
      ASSERT_NEAR(a, numeric, tol * (1.0 + std::fabs(numeric)))
          << "input " << k << " element " << i;
    }
  }
}

}  // namespace ddp::test_util
