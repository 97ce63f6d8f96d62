// linear_lt of a build without CUDA: ops.cpp reaches it only for CUDA tensors, which
// such a build cannot create.
#include "runtime/ops/cuda/linear_lt.h"

namespace ddp::kernels::cuda {

bool linear_lt(const Tensor&, const Tensor&, const Tensor&, Tensor&) {
  return false;
}

bool linear_weight_grad_lt(const Tensor&, const Tensor&, Tensor&, Tensor&) {
  return false;
}

bool lt_bias_grad_enabled() {
  return false;
}

void set_lt_bias_grad_enabled(bool) {}

bool linear_gelu_lt(const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&) {
  return false;
}

bool linear_input_grad_dgelu_lt(const Tensor&, const Tensor&, const Tensor&, Tensor&) {
  return false;
}

bool lt_gelu_enabled() {
  return false;
}

void set_lt_gelu_enabled(bool) {}

}  // namespace ddp::kernels::cuda
