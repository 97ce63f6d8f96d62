// Per-element maths of the mixed-precision and multi-tensor kernels, shared by the CPU
// kernels (ops/cpu) and the CUDA kernels (ops/cuda), so that a CPU test checks the
// very function a kernel runs. Plain C++ with __host__ __device__ under nvcc.
#pragma once

#include <cmath>

#ifndef DDP_MIXED_HD
#ifdef __CUDACC__
#define DDP_MIXED_HD __host__ __device__ __forceinline__
#else
#define DDP_MIXED_HD inline
#endif
#endif

namespace ddp::kernels::math {

// d(mean cross-entropy)/d(logit) for one element: scale * (softmax - onehot), with the
// softmax recomputed from the row's log-sum-exp (Note [fused classifier] in ops.h);
// scale = grad_loss / rows.
DDP_MIXED_HD float xent_grad(float logit, float lse, bool is_label, float scale) {
  return scale * (expf(logit - lse) - (is_label ? 1.0f : 0.0f));
}

// Online softmax statistics of a row (max m and sum s of exp(x - m)), merged in any
// grouping: the classifier's one pass over 16-bit logits.
struct SoftmaxStats {
  float max;
  float sum;
};
DDP_MIXED_HD SoftmaxStats softmax_stats_add(SoftmaxStats a, float x) {
  // exp(-inf) is 0: a masked logit adds nothing (and exp(-inf - -inf) would be NaN),
  // so sum == 0 keeps meaning "saw nothing" for the merge.
  if (x == -INFINITY) return a;
  if (x > a.max) return {x, a.sum * expf(a.max - x) + 1.0f};
  return {a.max, a.sum + expf(x - a.max)};
}
DDP_MIXED_HD SoftmaxStats softmax_stats_merge(SoftmaxStats a, SoftmaxStats b) {
  if (b.sum == 0.0f) return a;  // b saw nothing (its max is -inf)
  if (a.sum == 0.0f) return b;
  if (a.max >= b.max) return {a.max, a.sum + b.sum * expf(b.max - a.max)};
  return {b.max, b.sum + a.sum * expf(a.max - b.max)};
}

// Logistic sigmoid, stable for large |x| (never exp of a large positive number).
DDP_MIXED_HD float sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
}

// torch.nn.functional.binary_cross_entropy_with_logits per element (its stable form).
DDP_MIXED_HD float bce_logits_value(float logit, float target) {
  return fmaxf(logit, 0.0f) - logit * target + log1pf(expf(-fabsf(logit)));
}
DDP_MIXED_HD float bce_logits_grad(float logit, float target) {
  return sigmoid(logit) - target;
}

// The activations of kernels::UnaryOp (op as its int value: tanh 0, sigmoid 1, silu
// 2, abs 3) and their derivatives in x.
DDP_MIXED_HD float unary_value(int op, float x) {
  switch (op) {
    case 0:
      return tanhf(x);
    case 1:
      return sigmoid(x);
    case 2:
      return x * sigmoid(x);
    default:
      return fabsf(x);
  }
}
DDP_MIXED_HD float unary_derivative(int op, float x) {
  switch (op) {
    case 0: {
      const float t = tanhf(x);
      return 1.0f - t * t;
    }
    case 1: {
      const float s = sigmoid(x);
      return s * (1.0f - s);
    }
    case 2: {
      const float s = sigmoid(x);
      return s * (1.0f + x * (1.0f - s));
    }
    default:
      return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
  }
}

// Each operation rounded on its own, on the device too: nvcc (ptxas) may fuse a
// multiply and an add into one rounding, and decides per call site, so one function
// inlined in two loops could give two results (the CPU builds with
// -ffp-contract=off).
DDP_MIXED_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DDP_MIXED_HD float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
DDP_MIXED_HD float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// One element of torch.optim.AdamW's update (kernels::AdamWStep): decay = 1 - lr wd,
// step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t), c1 = 1 - b1, c2 = 1 - b2.
// The per-tensor and the multi-tensor CUDA kernels both run this function, in loops
// of one element and of a vector's elements; every operation is rounded on its own
// (mul_rn above), so all of them give the same bits.
struct AdamWConstants {
  float decay, step_size, bc2_sqrt, b1, b2, c1, c2, eps;
};
DDP_MIXED_HD void adamw_element(const AdamWConstants& k, float g, float& param, float& m,
                                float& v) {
  const float p = mul_rn(param, k.decay);
  const float m1 = add_rn(mul_rn(k.b1, m), mul_rn(k.c1, g));
  const float m2 = add_rn(mul_rn(k.b2, v), mul_rn(mul_rn(k.c2, g), g));
  m = m1;
  v = m2;
  param = sub_rn(p, mul_rn(k.step_size, m1) / add_rn(sqrtf(m2) / k.bc2_sqrt, k.eps));
}

}  // namespace ddp::kernels::math
