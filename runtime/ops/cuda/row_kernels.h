// Raw-pointer launchers of transformer.cu's row kernels for the other ops/cuda files
// (attention.cu runs them on parts of its tensors). Internal to ops/cuda.
#pragma once

#include "runtime/tensor.h"

#include <cstdint>

namespace ddp::kernels::cuda::detail {

// On `on`'s device and current stream; rows of [.., t, t] matrices (row r sees columns
// 0 .. r % t). out may be x (in place).
void launch_causal_softmax(const Tensor& on, const float* x, int64_t rows, int64_t t, float* out);
// grad_x = y (grad - sum(grad y)) per row of d (softmax), or grad - exp(y) sum(grad)
// (log-softmax). grad_x may be grad (in place).
void launch_softmax_backward(const Tensor& on, const float* grad, const float* y, int64_t rows,
                             int64_t d, bool log, float* grad_x);

}  // namespace ddp::kernels::cuda::detail
