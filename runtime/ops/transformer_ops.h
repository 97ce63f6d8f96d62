// Ops of a GPT-2 style transformer: GELU (tanh approximation), LayerNorm over the
// last dim, embedding lookup, softmax / log-softmax along the last dim, batched
// matmul, causal softmax, each with its backward. Like ops.h, every op checks that its tensors
// share one device, checks shapes and dtypes (naming the op and the shapes) and allocates its
// output there. f32 only. CPU only for now: on a cuda tensor each throws DeviceError
// "<op>: not implemented on cuda yet".
#pragma once

#include "runtime/tensor.h"

namespace ddp {

// torch.nn.functional.gelu(x, approximate='tanh').
Tensor gelu(const Tensor& x);
// grad * d gelu(x) / dx; grad and x of one shape.
Tensor gelu_backward(const Tensor& grad, const Tensor& x);

struct LayerNormResult {
  Tensor out;   // like x
  Tensor mean;  // [rows], rows = x.numel() / d: kept for the backward
  Tensor rstd;  // [rows], 1 / sqrt(biased var + eps)
};
// torch.nn.functional.layer_norm(x, [d], weight, bias, eps) over the last dim d of x
// (x at least 1-D with d >= 1); weight and bias [d].
LayerNormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                           float eps = 1e-5f);
struct LayerNormGrads {
  Tensor x, weight, bias;
};
LayerNormGrads layer_norm_backward(const Tensor& grad, const Tensor& x,
                                   const LayerNormResult& saved, const Tensor& weight);

// weight [V, d], indices i64 of any shape -> indices.shape + [d]. An index outside
// [0, V) throws ValueError naming it, its position and V.
Tensor embedding(const Tensor& weight, const Tensor& indices);
// A new [V, d]: the rows of grad (shape indices.shape + [d]) summed into the rows
// the indices name; repeated indices accumulate.
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_rows);

// Along the last dim, numerically stable (the row maximum is subtracted first).
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);
// From the forward's output y = softmax(x) (or log_softmax(x)).
Tensor softmax_backward(const Tensor& grad, const Tensor& y);
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y);

struct BmmOptions {
  bool trans_a = false;  // use a[i]^T
  bool trans_b = false;  // use b[i]^T
  float alpha = 1.0f;    // out = alpha * op(a) op(b) (attention's 1 / sqrt(d) comes free)
};
// torch.bmm: out[i] = alpha * op(a[i]) op(b[i]) for i < B; op(a[i]) [M, K] times
// op(b[i]) [K, N] -> out [B, M, N]. a and b 3-D, f32, with the same B.
Tensor bmm(const Tensor& a, const Tensor& b, const BmmOptions& options = {});

// Softmax along the last dim of x [..., T, T] where row i of every [T, T] matrix
// only sees columns j <= i: columns j > i get probability exactly 0 (the causal
// mask of a decoder's self-attention). Its backward is softmax_backward: a zero
// probability passes zero gradient.
Tensor causal_softmax(const Tensor& x);

}  // namespace ddp
