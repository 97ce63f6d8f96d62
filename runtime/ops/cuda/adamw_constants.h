// The per-tensor constants of one AdamW step on CUDA (nn.cu), shared by the
// per-tensor and the multi-tensor kernels (multi_tensor.cu). Internal to ops/cuda.
#pragma once

#include "runtime/ops/kernels.h"
#include "runtime/ops/mixed_math.h"

namespace ddp::kernels::cuda::detail {

// decay = 1 - lr wd, step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t), computed
// in double and rounded once (as the CPU kernel).
math::AdamWConstants adamw_constants(const AdamWStep& s);

}  // namespace ddp::kernels::cuda::detail
