// Host reductions shared by the CPU backends.
#pragma once

#include "collectives/communicator.h"

#include <cstdint>

namespace ddp::comm {

// dst[i] = op over k of srcs[k][i], for i < count, then times `scale` (avg passes
// 1 / world size; other ops 1). 16-bit floats are accumulated in f32, integers in
// their own type. dst may alias one of srcs.
void reduce_buffers(void* dst, const void* const* srcs, int num_srcs, int64_t count, DType dtype,
                    ReduceOp op, double scale);

// Throws ValueError unless `dtype` can be reduced with `op` (avg needs a float dtype).
void check_reducible(DType dtype, ReduceOp op);

}  // namespace ddp::comm
