// Ops over a list of tensors at once (PyTorch's foreach / multi_tensor_apply): the
// optimizer's step and gradient clipping without a kernel launch per parameter and
// without reading the device from the host.
//
// Note [clipping on the device]: clip_grad_norm_'s norm used to be read on the host
// before the scale (one device synchronization per step, 10% of gpt-mini's step on an
// H200). Here the sum of squares, the norm, the factor min(1, max / (norm + 1e-6))
// (1 for a non-finite norm: the gradients are left as they are) and the scale all
// stay on the device, ordered by the stream; the caller reads the norm when it
// reports it. On CUDA a list is one launch per kMultiTensorList tensors, each block
// a fixed chunk of one tensor; sums go through per-chunk partials in double and
// one block over them in order, so the result is the same bits on every run and
// every GPU (the partition depends only on the sizes).
#pragma once

#include "runtime/ops/kernels.h"
#include "runtime/tensor.h"

#include <vector>

namespace ddp {

// The sum of x^2 over every element of every tensor (f32, one device, any shapes;
// empty tensors allowed): one f32 scalar on that device. xs must not be empty.
Tensor sum_squares_all(const std::vector<Tensor>& xs);

struct ClipResult {
  Tensor norm;    // scalar f32: sqrt(sum of squares)
  Tensor factor;  // scalar f32: min(1, max_norm / (norm + 1e-6)), 1 when norm is not finite
};
// From sum_squares_all's result, on its device.
ClipResult clip_factor(const Tensor& sum_squares, double max_norm);

// Every x *= scalar[0] in place (f32; scalar a one-element f32 tensor on their
// device, read there).
void scale_by_(const std::vector<Tensor>& xs, const Tensor& scalar);

// adamw_update_ on each (params[i], grads[i], m[i], v[i]) with steps[i]: the same
// bits as one adamw_update_ per tensor, in one launch per list chunk on CUDA.
// With `constants` (Note [captured optimizer steps] in optim/optimizer.h), the
// kernels read tensor i's constants from it when they run: f32, on the
// tensors' device, adamw_constants_table's 8 floats per tensor; steps are then only
// checked. With `grad_scale` (one f32 on the tensors' device, read when the kernels
// run), every gradient element is multiplied by it as it is read, rounded to f32: the
// same bits as scale_by_(grads, grad_scale) then the update, without the pass over the
// gradients, which keep their values (Note [clipping in the step] in
// optim/optimizer.h).
void adamw_update_all_(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                       std::vector<Tensor>& m, std::vector<Tensor>& v,
                       const std::vector<kernels::AdamWStep>& steps,
                       const Tensor& constants = Tensor(), const Tensor& grad_scale = Tensor());
// The constants of each step (kernels::adamw_constants), 8 floats each, in order.
std::vector<float> adamw_constants_table(const std::vector<kernels::AdamWStep>& steps);

}  // namespace ddp
