// Scatter and gather for DataParallel: split a batch along dim 0 over devices, and
// concatenate the replicas' outputs on one device. Both are differentiable: the
// gradient of a scattered chunk flows back into its rows of the input (on the
// input's device), and the gradient of a gathered output is split back to the
// replicas' devices.
#pragma once

#include "runtime/tensor.h"

#include <cstdint>
#include <vector>

namespace ddp::data_parallel {

// Note [chunk sizes]: the rows each replica gets, a pure function of the batch size
// and the replica count. Balanced: sizes differ by at most one, the larger chunks
// first (10 over 4 -> 3, 3, 2, 2), unlike torch.chunk (3, 3, 3, 1). A batch smaller
// than the replica count gives one row to each of the first `batch` replicas, so
// fewer replicas run; an empty batch is one empty chunk. `replicas` must be >= 1.
std::vector<int64_t> chunk_sizes(int64_t batch, size_t replicas);

// Splits x (at least 1-D, any dtype) along dim 0 by chunk_sizes(x.size(0),
// devices.size()) and moves chunk i to devices[i]; returns one chunk per replica that
// runs (possibly fewer than devices). A chunk already on its device is a view of x
// (no copy). When x requires grad, chunk i's gradient is added into rows of x's
// gradient (ScatterBackward).
std::vector<Tensor> scatter(const Tensor& x, const std::vector<Device>& devices);

// Concatenates `outputs` (each at least 1-D, of one dtype and one shape but for
// dim 0) along dim 0 into a new tensor on `device`. The gradient of the result is
// split by rows and moved back to each output's device (GatherBackward). Throws
// ValueError naming the first output that does not fit.
Tensor gather(const std::vector<Tensor>& outputs, const Device& device);

}  // namespace ddp::data_parallel
