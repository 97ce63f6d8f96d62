// Differentiable ops (the torch.nn.functional of ddp). Each computes its output
// with the ops of ops/ and, when autograd::needs_grad, records a Node whose
// backward is written with the same ops, so it runs on the inputs' device.
// Inside an AutocastGuard each op computes in the dtype Note [autocast]
// (autograd/autocast.h) gives it.
#pragma once

#include "runtime/autograd/autograd.h"
#include "runtime/ops/transformer_ops.h"
#include "runtime/rng/generator.h"

#include <cstdint>

namespace ddp::functional {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& a, float s);
Tensor matmul(const Tensor& a, const Tensor& b);
// x in `dtype` (x itself when it has it); the gradient comes back in x's dtype.
Tensor cast(const Tensor& x, DType dtype);
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);
Tensor reshape(const Tensor& x, const Shape& shape);
// [N, ...] -> [N, prod(...)]
Tensor flatten(const Tensor& x);
Tensor relu(const Tensor& x);
// x [N, in], weight [out, in], bias [out] or undefined: x weight^T + bias.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// A language model's head over `columns` >= vocab logits: x [N, d], weight [vocab, d]
// (the token embedding, tied): logits [N, columns], x weight^T in the first vocab
// columns and -inf in the rest, which a cross-entropy then weighs as nothing (Note
// [padded head]). columns == vocab: linear(x, weight, {}).
Tensor lm_head(const Tensor& x, const Tensor& weight, int64_t columns);
// Mean softmax cross-entropy of logits [N, C] against i64 labels [N].
Tensor cross_entropy(const Tensor& logits, const Tensor& labels);
// Activations, elementwise in the input's dtype (torch.tanh, torch.sigmoid, F.silu, abs).
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor abs(const Tensor& x);
// Losses, the mean over every element (torch's reduction='mean'), computed in f32; input
// and target of one shape (targets of any float dtype, e.g. [N, k] for k outputs).
Tensor mse_loss(const Tensor& input, const Tensor& target);
Tensor l1_loss(const Tensor& input, const Tensor& target);
// max(x, 0) - x y + log(1 + exp(-|x|)) per element, as
// torch.nn.functional.binary_cross_entropy_with_logits (targets in [0, 1]).
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets);

struct Conv2dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
};
// x [N, C, H, W], weight [C_out, C, kh, kw], bias [C_out] or undefined (im2col + GEMM).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options = {});
// Square window `kernel`, stride defaults to the kernel (as torch's max_pool2d).
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride = 0);
// Inverted dropout: in training, zeroes each element with probability p and scales the
// rest by 1 / (1 - p); the mask comes from `gen`. Identity when !training or p == 0.
Tensor dropout(const Tensor& x, float p, bool training, Generator& gen);

// Transformer layers (ops/transformer_ops.h).
// GELU with the tanh approximation (torch's approximate='tanh').
Tensor gelu(const Tensor& x);
// linear(gelu(linear(x, fc_weight, fc_bias)), proj_weight, proj_bias): a GPT MLP before
// its dropout, as one node. Under autocast on CUDA with gelu_epilogues_enabled(), the
// GELU and its derivative run inside the two matmuls (Note [gelu epilogues] in
// ops/cuda/lt_plan.h); otherwise the same values and gradients as the three ops.
Tensor gelu_mlp(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias,
                const Tensor& proj_weight, const Tensor& proj_bias);
// LayerNorm over the last dim with weight and bias [d] (torch's defaults: eps 1e-5).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f);
// sum = add(x, y) and out = layer_norm(sum, weight, bias, eps) in one pass (Note
// [residual layer norm] in ops/transformer_ops.h): the same values and gradients as
// the two ops, each output recorded as its op records it.
struct AddLayerNorm {
  Tensor sum, out;
};
AddLayerNorm add_layer_norm(const Tensor& x, const Tensor& y, const Tensor& weight,
                            const Tensor& bias, float eps = 1e-5f);
// weight [V, d] rows picked by i64 indices of any shape -> indices.shape + [d];
// the weight's gradient is the scatter-add of the output's rows.
Tensor embedding(const Tensor& weight, const Tensor& indices);
// Along the last dim.
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);
// torch.bmm with optional transposes and scale: out[i] = alpha * op(a[i]) op(b[i]).
Tensor bmm(const Tensor& a, const Tensor& b, const BmmOptions& options = {});
// Softmax over the last dim of [..., T, T] with columns j > i of row i at probability 0.
Tensor causal_softmax(const Tensor& x);
// Causal self-attention of q, k, v [B, H, T, D]:
// causal_softmax(q k^T / sqrt(D)) v -> [B, H, T, D]. Composed of bmm and
// causal_softmax, so its backward is theirs; it keeps the [B*H, T, T] probabilities.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v);
// Causal multi-head self-attention on a GPT block's packed projections qkv [B, T, 3C]
// (Note [packed attention] in ops/transformer_ops.h) -> y [B, T, C]: the same values as
// causal_attention on the heads split out of qkv, with y's heads side by side, but
// without the permutes. Keeps the [B, H, T, T] probabilities for the backward.
Tensor causal_self_attention(const Tensor& qkv, int64_t heads);

}  // namespace ddp::functional
