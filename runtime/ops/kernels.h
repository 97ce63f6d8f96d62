// Per-device kernels behind the ops. CMake compiles ops/cuda/*.cu, or
// ops/cuda/cuda_kernels_stub.cpp in a build without CUDA.
#pragma once

#include "runtime/tensor.h"

#include <array>
#include <vector>

namespace ddp::kernels {

// bce_logits: the elementwise binary cross-entropy of logit a and target b,
// max(a, 0) - a b + log(1 + exp(-|a|)); bce_logits_grad its derivative in a,
// sigmoid(a) - b (math::bce_logits_* in ops/mixed_math.h).
enum class BinaryOp { add, sub, mul, bce_logits, bce_logits_grad };
// Activations with their derivative from the input (math::unary_value /
// unary_derivative in ops/mixed_math.h); abs' is sign(x), 0 at 0 as torch's.
enum class UnaryOp { tanh, sigmoid, silu, abs };

struct Conv2dGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input [N, C, H, W]
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t out_h() const { return (h + 2 * pad_h - kernel_h) / stride_h + 1; }
  int64_t out_w() const { return (w + 2 * pad_w - kernel_w) / stride_w + 1; }
};

struct SgdStep {
  float lr = 0.01f, momentum = 0.0f, weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer is initialised from this gradient
  // Note [captured optimizer steps]: when set, the lr is read from here (one f32 on the
  // parameter's device) when the kernel runs, and `lr` is not used.
  const float* lr_on_device{};
};

struct AdamWStep {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 1e-2f;
  int64_t step = 1;  // 1-based, for the bias corrections
};

namespace cpu {
#include "runtime/ops/kernel_decls.inc"
}  // namespace cpu

namespace cuda {
#include "runtime/ops/kernel_decls.inc"
}  // namespace cuda

}  // namespace ddp::kernels
