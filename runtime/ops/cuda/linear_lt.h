// The 16-bit linear layer through cuBLASLt with its bias epilogue (Note [cublasLt
// linear] in lt_plan.h). Internal to ops: ops.cpp's linear calls it for 16-bit CUDA
// tensors and falls back to cublasGemmEx and a bias kernel when it returns false.
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

}  // namespace ddp::kernels::cuda
