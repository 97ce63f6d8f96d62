// The checked entry points of the multi-tensor ops (multi_tensor.h); kernels in
// ops/cpu/multi_tensor.cpp and ops/cuda/multi_tensor.cu.
#include "runtime/ops/multi_tensor.h"

#include "runtime/ops/adamw_constants.h"
#include "runtime/ops/dispatch.h"
#include "runtime/ops/nn_ops.h"
#include "runtime/ops/ops.h"

#include <cmath>
#include <cstring>

namespace ddp {
namespace {

using ops_detail::check_dtype;

// Every tensor f32 and on the first one's device; returns that device.
Device check_list(std::string_view op, const std::vector<Tensor>& xs, const char* what) {
  DDP_CHECK(!xs.empty(), "{}: needs at least one tensor", op);
  for (const Tensor& x : xs) {
    check_same_device(op, {&xs.front(), &x});
    check_dtype(op, x, DType::f32, what);
  }
  return xs.front().device();
}

}  // namespace

Tensor sum_squares_all(const std::vector<Tensor>& xs) {
  const Device device = check_list("sum_squares_all", xs, "tensor");
  Tensor out = empty({}, {.device = device});
  DDP_DISPATCH(device, sum_squares_multi, xs, out);
  return out;
}

ClipResult clip_factor(const Tensor& sum_squares, double max_norm) {
  check_dtype("clip_factor", sum_squares, DType::f32, "sum of squares");
  DDP_CHECK(sum_squares.numel() == 1, "clip_factor: needs a scalar sum of squares, got shape {}",
            shape_str(sum_squares.shape()));
  DDP_CHECK(std::isfinite(max_norm) && max_norm > 0,
            "clip_grad_norm_: max_norm {} must be finite and > 0 (to not clip, do not call it)",
            max_norm);
  Tensor both = empty({2}, {.device = sum_squares.device()});
  DDP_DISPATCH(sum_squares.device(), clip_factor, sum_squares, max_norm, both);
  return {both.flat_view(0, {}), both.flat_view(1, {})};
}

void scale_by_(const std::vector<Tensor>& xs, const Tensor& scalar) {
  if (xs.empty()) return;
  const Device device = check_list("scale_by_", xs, "tensor");
  check_same_device("scale_by_", {&xs.front(), &scalar});
  check_dtype("scale_by_", scalar, DType::f32, "scalar");
  DDP_CHECK(scalar.numel() == 1, "scale_by_: the scalar has shape {}, expected one element",
            shape_str(scalar.shape()));
  for (const Tensor& x : xs) x.storage()->bump_version();  // Note [version counter]
  DDP_DISPATCH(device, scale_by_multi, xs, scalar);
}

void adamw_update_all_(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                       std::vector<Tensor>& m, std::vector<Tensor>& v,
                       const std::vector<kernels::AdamWStep>& steps, const Tensor& constants,
                       const Tensor& grad_scale) {
  if (params.empty()) return;
  DDP_CHECK(grads.size() == params.size() && m.size() == params.size() &&
                v.size() == params.size() && steps.size() == params.size(),
            "adamw_update_all_: {} params with {} grads, {} m, {} v and {} steps", params.size(),
            grads.size(), m.size(), v.size(), steps.size());
  if (constants.defined()) {  // Note [captured optimizer steps]
    check_same_device("adamw_update_all_", {&params.front(), &constants});
    check_dtype("adamw_update_all_", constants, DType::f32, "the constants table");
    DDP_CHECK(constants.numel() == static_cast<int64_t>(8 * params.size()),
              "adamw_update_all_: the constants table has {} floats; {} tensors need 8 each "
              "(adamw_constants_table)",
              constants.numel(), params.size());
  }
  if (grad_scale.defined()) {  // Note [clipping in the step]
    check_same_device("adamw_update_all_", {&params.front(), &grad_scale});
    check_dtype("adamw_update_all_", grad_scale, DType::f32, "the gradient scale");
    DDP_CHECK(grad_scale.numel() == 1,
              "adamw_update_all_: the gradient scale has shape {}, expected one element",
              shape_str(grad_scale.shape()));
  }
  if (!params.front().device().is_cuda() && !constants.defined() && !grad_scale.defined()) {
    // The CPU: one kernel per tensor is the loop.
    for (size_t i = 0; i < params.size(); ++i)
      adamw_update_(params[i], grads[i], m[i], v[i], steps[i]);
    return;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor* all[] = {&params[i], &grads[i], &m[i], &v[i]};
    for (const Tensor* t : all) {
      check_same_device("adamw_update_all_", {&params.front(), t});
      check_dtype("adamw_update_all_", *t, DType::f32, "every tensor");
      DDP_CHECK(
          t->shape() == params[i].shape(),
          "adamw_update_all_: tensor {}: param {}, grad, m and v must share its shape, got {}", i,
          shape_str(params[i].shape()), shape_str(t->shape()));
    }
    const kernels::AdamWStep& s = steps[i];
    DDP_CHECK(s.beta1 >= 0.0f && s.beta1 < 1.0f && s.beta2 >= 0.0f && s.beta2 < 1.0f &&
                  s.lr >= 0.0f && s.eps >= 0.0f && s.weight_decay >= 0.0f && s.step >= 1,
              "adamw_update_all_: tensor {}: betas ({}, {}) must be in [0, 1), lr {}, eps {} and "
              "weight_decay {} >= 0 and step {} >= 1",
              i, s.beta1, s.beta2, s.lr, s.eps, s.weight_decay, s.step);
  }
  for (size_t i = 0; i < params.size(); ++i) {  // Note [version counter]
    params[i].storage()->bump_version();
    m[i].storage()->bump_version();
    v[i].storage()->bump_version();
  }
  DDP_DISPATCH(params.front().device(), adamw_update_multi, params, grads, m, v, steps, constants,
               grad_scale);
}

std::vector<float> adamw_constants_table(const std::vector<kernels::AdamWStep>& steps) {
  static_assert(sizeof(kernels::math::AdamWConstants) == 8 * sizeof(float));
  std::vector<float> table(8 * steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const kernels::math::AdamWConstants k = kernels::adamw_constants(steps[i]);
    std::memcpy(&table[8 * i], &k, sizeof(k));
  }
  return table;
}

}  // namespace ddp
