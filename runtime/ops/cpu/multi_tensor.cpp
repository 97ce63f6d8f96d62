// CPU kernels of the multi-tensor ops (ops/multi_tensor.h): plain loops, tensor by
// tensor in list order, sums in double.
#include "runtime/ops/kernels.h"

#include <algorithm>
#include <cmath>

namespace ddp::kernels::cpu {

void sum_squares_multi(const std::vector<Tensor>& xs, Tensor& out) {
  double acc = 0.0;
  for (const Tensor& x : xs) {
    const float* p = x.data<float>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) acc += static_cast<double>(p[i]) * p[i];
  }
  *out.data<float>() = static_cast<float>(acc);
}

void clip_factor(const Tensor& sum_squares, double max_norm, Tensor& out) {
  const double norm = std::sqrt(static_cast<double>(*sum_squares.data<float>()));
  const double factor = std::isfinite(norm) ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
  out.data<float>()[0] = static_cast<float>(norm);
  out.data<float>()[1] = static_cast<float>(factor);
}

void scale_by_multi(const std::vector<Tensor>& xs, const Tensor& scalar) {
  const float factor = *scalar.data<float>();
  for (const Tensor& x : xs) {
    float* p = x.data<float>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) p[i] *= factor;
  }
}

}  // namespace ddp::kernels::cpu
