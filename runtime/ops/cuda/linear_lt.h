// The 16-bit linear layer through cuBLASLt with its bias epilogue (Note [cublasLt
// linear] in lt_plan.h), and its weight and bias gradients in one matmul. Internal to
// ops: ops.cpp's linear and linear_param_grads call them for 16-bit CUDA tensors and
// fall back to cublasGemmEx and a bias (or column-sum) kernel when they return false.
// CMake compiles linear_lt.cpp, or linear_lt_stub.cpp in a build without CUDA.
#pragma once

#include "runtime/tensor.h"

namespace ddp::kernels::cuda {

// out [rows, out_features] = x [rows, in] weight [out_features, in]^T (+ bias), all
// on one CUDA device; x and weight 16-bit, out their dtype, bias undefined or out's
// dtype. Accumulates in f32 and rounds once. Returns false, doing nothing, when
// cuBLASLt is not loaded or has no algorithm for the shape, dtypes and alignments
// (logged once per shape with what falls back); throws CudaError when a chosen
// algorithm fails to run.
bool linear_lt(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out);

// The same layer's backward matmul over the output's gradient grad [rows, out] and the
// input x [rows, in] (16-bit, one dtype): grad_weight [out, in] (f32) = grad^T x, and
// when grad_bias is defined, grad_bias [out] (f32) = the sum of grad's rows from the
// same matmul's BGRADB epilogue (Note [weight gradient epilogue] in lt_plan.h). Both
// overwritten. Returns false, doing nothing, as linear_lt does, when
// lt_bias_grad_enabled() is false, and unless in and out are multiples of 8.
bool linear_weight_grad_lt(const Tensor& grad, const Tensor& x, Tensor& grad_weight,
                           Tensor& grad_bias);
// Whether linear_weight_grad_lt runs (DDP_LT_BIAS_GRAD, default on); the setter is for
// benchmarks that time both forms in one process (bench gpt --ops). Process-wide.
bool lt_bias_grad_enabled();
void set_lt_bias_grad_enabled(bool enabled);

// Note [gelu epilogues] in lt_plan.h. out [rows, out_features] = gelu(x weight^T + bias)
// (the tanh form) and pre = x weight^T + bias, both of x's 16-bit dtype, from one
// matmul; bias of that dtype. Returns false as linear_lt does, and when out_features
// is not a multiple of 8 (cuBLASLt's rule for pre's leading dimension).
bool linear_gelu_lt(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
                    Tensor& pre);
// grad_pre [rows, in] = (grad [rows, out] weight [out, in]) * gelu'(pre [rows, in]), 16-bit,
// from one matmul: the input gradient of a linear layer whose input was gelu(pre).
// Returns false as linear_lt does, and when in is not a multiple of 8.
bool linear_input_grad_dgelu_lt(const Tensor& grad, const Tensor& weight, const Tensor& pre,
                                Tensor& grad_pre);
// Whether the GPT MLP uses them (DDP_LT_GELU, default off until measured: Note [gelu
// epilogues]); the setter is for tests and benchmarks. Process-wide.
bool lt_gelu_enabled();
void set_lt_gelu_enabled(bool enabled);

}  // namespace ddp::kernels::cuda
