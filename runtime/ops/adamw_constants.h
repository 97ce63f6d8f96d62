// The constants of one AdamW step of one tensor, computed on the host in double and
// rounded once (defined in cpu/nn.cpp): the CPU kernel, the CUDA kernels (nn.cu,
// multi_tensor.cu) and a capturable AdamW's device table (Note [captured optimizer
// steps] in optim/optimizer.h) all use these floats.
#pragma once

#include "runtime/ops/kernels.h"
#include "runtime/ops/mixed_math.h"

namespace ddp::kernels {

// decay = 1 - lr wd, step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t), c1 = 1 - b1,
// c2 = 1 - b2.
math::AdamWConstants adamw_constants(const AdamWStep& s);

}  // namespace ddp::kernels
