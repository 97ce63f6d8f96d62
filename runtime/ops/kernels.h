// Per-device kernels behind the ops. CMake compiles ops/cuda/*.cu, or
// ops/cuda/cuda_kernels_stub.cpp in a build without CUDA.
#pragma once

#include "runtime/tensor.h"

namespace ddp::kernels {

enum class BinaryOp { add, sub, mul };

namespace cpu {
#include "runtime/ops/kernel_decls.inc"
}  // namespace cpu

namespace cuda {
#include "runtime/ops/kernel_decls.inc"
}  // namespace cuda

}  // namespace ddp::kernels
