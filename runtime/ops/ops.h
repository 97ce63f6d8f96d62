// Ops: one entry point each. Every op checks that its tensors share one device
// (PyTorch's message), checks shapes and dtypes (naming the op and the shapes),
// allocates its output on that device, and dispatches to the CPU kernels
// (ops/cpu, OpenBLAS for GEMM) or the CUDA kernels (ops/cuda, cuBLAS for GEMM).
// Arithmetic is f32 unless stated. add, sub, mul, scale, add_bias_rows, relu,
// sum and matmul also take bf16 and f16, computing each element in f32 and
// rounding once (Note [16-bit on the cpu] in ops.cpp; the mixed precision of
// Note [autocast] in autograd/autocast.h). All CUDA ops run on the device's
// current stream and do not synchronize.
#pragma once

#include "runtime/ops/kernels.h"
#include "runtime/tensor.h"

#include <initializer_list>
#include <string_view>

namespace ddp {

// Throws DeviceError: "Expected all tensors to be on the same device, but found at
// least two devices, cuda:0 and cpu!" (the first tensor's device first), followed by
// the op when one is named, as torch names the method: " (in matmul; move the
// tensors to one device with .to(device))".
void check_same_device(std::string_view op, std::initializer_list<const Tensor*> tensors);
void check_same_device(std::initializer_list<const Tensor*> tensors);
// Throws ValueError naming op and shapes unless a.shape() == b.shape().
void check_same_shape(std::string_view op, const Tensor& a, const Tensor& b);

struct MatmulOptions {
  bool trans_a = false;  // use a^T
  bool trans_b = false;  // use b^T
  float alpha = 1.0f;
  float beta = 0.0f;  // for gemm_out: out = alpha * op(a) op(b) + beta * out
};
// op(a) [m, k] times op(b) [k, n] -> [m, n]; a and b 2-D and of one dtype (f32, bf16
// or f16), accumulated in f32. matmul's output has their dtype; matmul_out's `out`
// may also be f32 for 16-bit operands (a weight's f32 gradient from bf16 activations).
Tensor matmul(const Tensor& a, const Tensor& b, const MatmulOptions& options = {});
void matmul_out(const Tensor& a, const Tensor& b, Tensor& out, const MatmulOptions& options = {});

// x [N, in] times weight [out, in]^T plus bias [out] (or undefined) broadcast over
// the rows: nn.Linear's product, in x's dtype. x and weight share a dtype; bias has
// it or is f32. 16-bit operands accumulate in f32 and the bias is added before the
// one rounding to the output (cuBLASLt's bias epilogue on CUDA where it is loaded).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// linear's parameter gradients from the output's gradient grad [N, out] and the input
// x [N, in] as the product read it (grad and x of one dtype): weight = grad^T x in
// weight_dtype (x's, or f32 for 16-bit operands), written into `into` when it is
// defined ([out, in] of weight_dtype), and, when with_bias, bias = the sum of grad's
// rows (f32). For 16-bit operands on CUDA into f32, one cuBLASLt matmul gives both
// (Note [weight gradient epilogue] in ops/cuda/lt_plan.h); otherwise a matmul and a
// column sum.
struct LinearParamGrads {
  Tensor weight, bias;
};
LinearParamGrads linear_param_grads(const Tensor& grad, const Tensor& x, DType weight_dtype,
                                    bool with_bias, Tensor into = Tensor());

// Elementwise on one shape. Equal dtypes give that dtype; mixed ones (bf16 with f32)
// give f32, PyTorch's promotion.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& a, float s);
// A new tensor of `shape` whose every element is the one element of `scalar` (f32,
// any shape with one element), on scalar's device. The value is read on the device,
// so this never waits for the kernel that computes `scalar` (unlike fill_ with item()).
Tensor expand_scalar(const Tensor& scalar, const Shape& shape);
void axpy_(float alpha, const Tensor& x, Tensor& y);  // y += alpha * x, in place
// x [rows, cols] + bias [cols] broadcast along rows, in x's dtype (bias: x's or f32).
Tensor add_bias_rows(const Tensor& x, const Tensor& bias);
Tensor relu(const Tensor& x);
// grad * (x > 0)
Tensor relu_backward(const Tensor& grad, const Tensor& x);
// tanh, sigmoid, SiLU (x sigmoid(x)) or |x| of each element (f32, bf16, f16; out like x),
// and grad * op'(x) (grad like x; abs' is sign(x), 0 at 0, as torch).
Tensor unary(kernels::UnaryOp op, const Tensor& x);
Tensor unary_backward(kernels::UnaryOp op, const Tensor& grad, const Tensor& x);
// Per element, logits and targets of one shape (float dtypes, promoted as add):
// binary cross-entropy with logits, max(x, 0) - x y + log(1 + exp(-|x|)), and its
// derivative in the logit, sigmoid(x) - y.
Tensor bce_with_logits(const Tensor& logits, const Tensor& targets);
Tensor bce_with_logits_grad(const Tensor& logits, const Tensor& targets);

// Sums are f32 for every float input (autocast's rule for sum); accumulated in double.
Tensor sum(const Tensor& x);  // scalar (shape [])
Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // i64

// Softmax + cross-entropy, mean over the batch, numerically stable.
// logits [N, C] f32, bf16 or f16, labels [N] i64 in [0, C). Out-of-range labels throw
// on the CPU and give a NaN loss on CUDA (checking there would need a host sync); the
// CUDA backward then gives that row softmax(row) / N, with no one-hot term.
// Note [fused classifier]: f32 logits keep their softmax [N, C] for the backward;
// 16-bit logits (a bf16 LM head under autocast) keep only each row's log-sum-exp,
// computed in f32 from the logits as read, and the backward recomputes the
// probabilities from the logits: no f32 [N, C] tensor is ever made, which for
// GPT-2's vocabulary is the largest activation of the step.
struct CrossEntropyResult {
  Tensor loss;   // scalar f32
  Tensor probs;  // f32 logits: [N, C] softmax, kept for the backward
  Tensor lse;    // 16-bit logits: [N] f32 log(sum(exp(row)))
};
CrossEntropyResult softmax_cross_entropy(const Tensor& logits, const Tensor& labels);
// d(loss)/d(logits) = grad_loss * (probs - onehot(labels)) / N; grad_loss a scalar tensor.
// Note [classifier gradient in place]: `overwrite` writes the gradient over `probs`
// and returns it, for a caller that holds the only reference: no second
// [N, C] tensor at the backward's start, where a language model's memory peaks.
Tensor softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels,
                                      const Tensor& grad_loss, bool overwrite = false);
// The same from 16-bit logits and the forward's lse: probs = exp(logits - lse), the
// gradient in the logits' dtype (each element computed in f32, rounded once);
// `overwrite`: over the logits, as above.
Tensor softmax_cross_entropy_backward_from_logits(const Tensor& logits, const Tensor& lse,
                                                  const Tensor& labels, const Tensor& grad_loss,
                                                  bool overwrite = false);

void fill_(Tensor& t, double value);  // any dtype
// dst <- src: same shape and dtype, any two devices. Never blocks the host between
// two CUDA tensors (same device or not: ordered on the devices' current streams);
// host -> device blocks unless non_blocking, device -> host unless non_blocking and
// dst is pinned. Note [copy semantics] in copy.cpp has the details.
void copy_(Tensor& dst, const Tensor& src, bool non_blocking = false);
// copy_ without counting the write in dst's version (Note [version counter] in
// tensor.h): for the collectives' copies into their outputs, and ZeRO-1/2's of other
// ranks' pieces (it counts the step once, on every rank). Not for a user's writes.
void copy_uncounted_(Tensor& dst, const Tensor& src, bool non_blocking = false);
// Casts between any two dtypes on the tensor's device (f32 <-> bf16/f16 round to nearest even).
Tensor cast(const Tensor& x, DType dtype);

}  // namespace ddp
