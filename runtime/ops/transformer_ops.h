// Ops of a GPT-2 style transformer: GELU (tanh approximation), LayerNorm over the
// last dim, embedding lookup, softmax / log-softmax along the last dim, batched
// matmul, causal softmax, each with its backward. Like ops.h, every op checks that its tensors
// share one device, checks shapes and dtypes (naming the op and the shapes) and allocates its
// output there. f32 unless stated (16-bit inputs: Note [16-bit on the cpu] in ops.cpp). CPU kernels
// in ops/cpu/transformer.cpp and ops/cpu/attention.cpp, CUDA kernels in ops/cuda/transformer.cu,
// embedding.cu and attention.cu (deterministic reductions; docs/runtime.md, "Transformer ops").
#pragma once

#include "runtime/tensor.h"

namespace ddp {

// torch.nn.functional.gelu(x, approximate='tanh'); f32, bf16 or f16, out like x.
Tensor gelu(const Tensor& x);
// grad * d gelu(x) / dx; grad and x of one shape and dtype.
Tensor gelu_backward(const Tensor& grad, const Tensor& x);

// Note [gelu epilogues] (ops/cuda/lt_plan.h): a GPT MLP's GELU inside cuBLASLt's
// matmuls. linear_gelu gives out = gelu(linear(x, weight, bias)) and pre =
// linear(x, weight, bias) (x [N, in], weight [out, in], bias [out] defined); on CUDA
// for 16-bit x, weight and bias of one dtype while gelu_epilogues_enabled(), one
// matmul writes both, else linear then gelu.
struct LinearGelu {
  Tensor out, pre;
};
LinearGelu linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias);
// gelu_backward(matmul(grad, weight), pre): the gradient of pre when gelu(pre) was the
// input of a linear layer with this weight (grad [N, out], weight [out, in], pre [N,
// in], one dtype); one matmul under the same conditions.
Tensor linear_input_grad_gelu(const Tensor& grad, const Tensor& weight, const Tensor& pre);
// DDP_LT_GELU (default off until measured on a GPU); set_gelu_epilogues_enabled for
// tests and benchmarks. Always false in a build without CUDA.
bool gelu_epilogues_enabled();
void set_gelu_epilogues_enabled(bool enabled);

struct LayerNormResult {
  Tensor out;   // x's shape, out_dtype
  Tensor mean;  // [rows] f32, rows = x.numel() / d: kept for the backward
  Tensor rstd;  // [rows] f32, 1 / sqrt(biased var + eps)
};
// torch.nn.functional.layer_norm(x, [d], weight, bias, eps) over the last dim d of x
// (x at least 1-D with d >= 1); weight and bias [d] f32. Computed in f32 (a 16-bit x
// is widened first); the output rounded to out_dtype (f32, bf16 or f16; Note
// [autocast] in autograd/autocast.h stores it in bf16).
LayerNormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                           float eps = 1e-5f, DType out_dtype = DType::f32);
// Note [residual layer norm]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A pre-LayerNorm transformer block adds a branch to the residual stream and
// normalizes the result at once: h = x + attn(ln_1(x)), then ln_2(h). As two ops,
// the add writes h and the norm reads it back; add_layer_norm writes h and normalizes
// each row while it is still in the cache (llm.c's fused residual forward), one
// kernel instead of two. The bits are those of add(x, y) then layer_norm(sum): the
// sum rounded to f32 once, then the same per-row code (CPU: norm_row, CUDA: the
// norm_row device function, both shared with layer_norm). Fused when x is f32 (the
// residual stream always is: Note [autocast]) on the CPU or CUDA; otherwise it runs
// the two ops. The backward is the two ops' backwards.
struct AddLayerNormResult {
  Tensor sum;            // x + y: f32 when x is f32 (promotion), x's shape
  LayerNormResult norm;  // layer_norm(sum, weight, bias, eps, out_dtype)
};
// x and y of one shape and device, float; weight and bias as layer_norm's.
AddLayerNormResult add_layer_norm(const Tensor& x, const Tensor& y, const Tensor& weight,
                                  const Tensor& bias, float eps = 1e-5f,
                                  DType out_dtype = DType::f32);

// grad f32 or 16-bit; the gradients have the dtypes of x, weight and bias.
struct LayerNormGrads {
  Tensor x, weight, bias;
};
// into_x: a gradient of x already summed elsewhere (f32, x's shape and device, sharing
// no memory with the other arguments), or undefined; when given for an f32 x, x's
// gradient is added into it in place and it is returned as .x (one kernel instead of the gradient
// and an add: Note [accumulating into a pending gradient] in autograd.h); else .x is new.
LayerNormGrads layer_norm_backward(const Tensor& grad, const Tensor& x,
                                   const LayerNormResult& saved, const Tensor& weight,
                                   const Tensor& into_x = Tensor());

// weight [V, d], indices i64 of any shape -> indices.shape + [d]. An index outside
// [0, V) throws ValueError naming it, its position and V on the CPU; on CUDA (where
// checking would wait for the device) its row is NaN and its gradient is dropped.
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
// op(b[i]) [K, N] -> out [B, M, N]. a and b 3-D, with the same B, both f32 or both
// bf16 (computed in f32 on every device and rounded: it is not on GPT's path).
Tensor bmm(const Tensor& a, const Tensor& b, const BmmOptions& options = {});

// Softmax along the last dim of x [..., T, T] where row i of every [T, T] matrix
// only sees columns j <= i: columns j > i get probability exactly 0 (the causal
// mask of a decoder's self-attention). Its backward is softmax_backward: a zero
// probability passes zero gradient.
Tensor causal_softmax(const Tensor& x);

// Note [packed attention]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A GPT block's c_attn projection gives qkv [B, T, 3C]: q, k and v side by side along
// the last dim, head h at columns h*D .. h*D+D-1 of each third (C = heads * D), as
// nanoGPT's split + view(B, T, H, D).transpose(1, 2) reads it. Our tensors are always
// contiguous, so that transpose would be a copy (four per block forward, four more in
// backward). The attention kernels read each head where it lies instead: a head's
// q, k, v are [T, D] matrices with a leading dimension of 3C, and its output goes to
// y's columns h*D .. with leading dimension C, so y [B, T, C] is already the layout
// c_proj multiplies (nanoGPT's transpose(1, 2).contiguous().view(B, T, C)).
// probs [B, H, T, T] = causal_softmax(q k^T / sqrt(D)) is kept for the backward
// (attention dropout, when the model has dropout, is not applied to it: see
// models/gpt.h).
//
// Note [fused attention]: on CUDA, for bf16 or f16 qkv, the forward and backward run
// as cuDNN's fused (flash) attention where it is available (ops/cuda/sdpa_graph.h):
// no [B, H, T, T] tensor is ever stored. The forward keeps instead stats [B, H, T, 1]
// f32, each row's log-sum-exp of its scaled, masked scores, and the backward
// recomputes the probabilities from q, k and stats. Such a result has stats and no
// probs; pass the whole AttentionResult to the backward.
enum class AttentionPath {
  automatic,  // fused where it runs (CUDA, 16-bit, cuDNN, DDP_CUDNN_ATTENTION not 0), else packed
  packed,     // always the packed kernels, with probs
  fused,      // cuDNN's fused attention, forward and backward, or a DeviceError saying why not
};
struct AttentionResult {
  Tensor y;      // [B, T, C], qkv's dtype
  Tensor probs;  // [B, H, T, T], exact zeros above each diagonal; f32, or 16-bit on CUDA
  Tensor stats;  // [B, H, T, 1] f32 log-sum-exp per row: the fused path (probs undefined)
  AttentionPath path = AttentionPath::automatic;  // what the forward was asked for
  bool fused() const { return stats.defined(); }
};
// qkv [B, T, 3C] with C divisible by heads; throws ValueError naming the shape.
// Note [16-bit attention]: for bf16 or f16 qkv, y has qkv's dtype. On the CPU the
// packed kernels compute in f32 (qkv widened, probs f32), and so does the backward;
// on CUDA the products run on tensor cores and probs is kept in qkv's dtype (Note
// [16-bit attention on cuda] in ops/cuda/attention_plan.h), or the fused path runs.
AttentionResult causal_self_attention(const Tensor& qkv, int64_t heads,
                                      AttentionPath path = AttentionPath::automatic);
// grad_qkv [B, T, 3C] from grad_y [B, T, C], the forward's qkv and its result (y and
// stats for a fused forward, probs otherwise).
Tensor causal_self_attention_backward(const Tensor& grad_y, const Tensor& qkv,
                                      const AttentionResult& forward, int64_t heads);
// The same from probs alone (a packed forward's result).
Tensor causal_self_attention_backward(const Tensor& grad_y, const Tensor& qkv, const Tensor& probs,
                                      int64_t heads);

// The sum of x's squared elements (f32, any shape) as a scalar tensor on x's device:
// gradient-norm clipping's ||g||^2 without a temporary of g's size.
Tensor sum_squares(const Tensor& x);

}  // namespace ddp
