#include "runtime/autograd/functions.h"

#include "runtime/autograd/autocast.h"
#include "runtime/cuda_graph.h"
#include "runtime/ops/nn_ops.h"
#include "runtime/ops/ops.h"
#include "runtime/ops/transformer_ops.h"

#include <cmath>
#include <limits>
#include <optional>

namespace ddp::functional {
namespace {

using autograd::needs_grad;
using autograd::record;

// A node whose backward is a lambda over saved tensors.
template <typename Backward>
struct LambdaNode : Node {
  LambdaNode(std::string name, Backward fn, SavedVersions saved)
      : name_(std::move(name)), fn_(std::move(fn)), saved_(std::move(saved)) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    DDP_CHECK(fn_.has_value(),
              "{}: trying to backward through the graph a second time; its saved tensors were "
              "freed after the first backward. Run the forward again.",
              name_);
    saved_.check(name_);  // Note [version counter]
    return (*fn_)(g);
  }
  std::string name() const override { return name_; }
  void release() override { fn_.reset(); }

 private:
  std::string name_;
  std::optional<Backward> fn_;
  SavedVersions saved_;
};

// Records `backward` for `out` unless no input needs a gradient. `saved`: every tensor
// whose values `backward` reads (the closure keeps them), whose versions the backward
// checks (Note [version counter]); they must still hold their tensors here (a closure
// that moved one out of its variable would leave it unchecked).
template <typename Backward>
Tensor recorded(Tensor out, const char* name, std::initializer_list<const Tensor*> inputs,
                std::initializer_list<const Tensor*> saved, Backward backward) {
  if (needs_grad(inputs)) {
    record(out,
           std::make_shared<LambdaNode<Backward>>(name, std::move(backward), SavedVersions(saved)),
           inputs);
  }
  return out;
}

// `t` when the gradient that reads it will be computed, else none (null): torch saves
// an operand of a product only for the other operand's gradient (Note [version
// counter]: changing a first layer's weight before the backward is fine when its
// input needs no gradient).
const Tensor* if_needed(bool needed, const Tensor& t) {
  return needed ? &t : nullptr;
}

// op(a) op(b) for the gradient of an input whose dtype was `dtype`: straight into
// f32 when the operands are 16-bit and the input was f32 (a parameter's gradient
// under autocast is never rounded to bf16 on the way; Note [autocast]).
Tensor matmul_into(DType dtype, const Tensor& a, const Tensor& b, const MatmulOptions& o,
                   Tensor out = Tensor()) {
  if (out.defined()) {
    ddp::matmul_out(a, b, out, o);
    return out;
  }
  if (dtype == a.dtype()) return ddp::matmul(a, b, o);
  const int64_t m = o.trans_a ? a.size(1) : a.size(0);
  const int64_t n = o.trans_b ? b.size(0) : b.size(1);
  out = empty({m, n}, {.dtype = dtype, .device = a.device()});
  ddp::matmul_out(a, b, out, o);
  return out;
}

}  // namespace

namespace {
// sum = a + b with add's backward recorded.
Tensor recorded_add(Tensor sum, const Tensor& a, const Tensor& b) {
  return recorded(std::move(sum), "AddBackward", {&a, &b}, {}, [](const Tensor& g) {
    return std::vector<Tensor>{g, g};
  });
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return recorded_add(ddp::add(a, b), a, b);
}

Tensor sub(const Tensor& a, const Tensor& b) {
  return recorded(ddp::sub(a, b), "SubBackward", {&a, &b}, {}, [](const Tensor& g) {
    return std::vector<Tensor>{g, ddp::scale(g, -1.0f)};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  return recorded(ddp::mul(a, b), "MulBackward", {&a, &b},
                  {if_needed(requires_grad(b), a), if_needed(requires_grad(a), b)},
                  [a, b](const Tensor& g) {
                    return std::vector<Tensor>{ddp::mul(g, b), ddp::mul(g, a)};
                  });
}

Tensor scale(const Tensor& a, float s) {
  return recorded(ddp::scale(a, s), "ScaleBackward", {&a}, {},
                  [s](const Tensor& g) { return std::vector<Tensor>{ddp::scale(g, s)}; });
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  const Tensor al = autocast::lower(a), bl = autocast::lower(b);  // Note [autocast]
  return recorded(ddp::matmul(al, bl), "MatmulBackward", {&a, &b},
                  {if_needed(requires_grad(b), al), if_needed(requires_grad(a), bl)},
                  [al, bl, da = a.dtype(), db = b.dtype()](const Tensor& g) {
                    return std::vector<Tensor>{matmul_into(da, g, bl, {.trans_b = true}),
                                               matmul_into(db, al, g, {.trans_a = true})};
                  });
}

Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  // An integer result is not differentiable (torch's: it does not require grad).
  if (!is_floating(dtype)) return ddp::cast(x, dtype);
  // The engine casts the gradient back to x's dtype (Note [gradient dtypes]).
  return recorded(ddp::cast(x, dtype), "CastBackward", {&x}, {},
                  [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor sum(const Tensor& x) {
  // The upstream gradient stays on the device: reading it with item() would block
  // the host in the middle of backward.
  return recorded(ddp::sum(x), "SumBackward", {&x}, {}, [shape = x.shape()](const Tensor& g) {
    return std::vector<Tensor>{ddp::expand_scalar(g, shape)};
  });
}

Tensor mean(const Tensor& x) {
  const float inv = 1.0f / static_cast<float>(x.numel());
  return functional::scale(functional::sum(x), inv);
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  return recorded(
      x.reshape(shape), "ReshapeBackward", {&x}, {},
      [from = x.shape()](const Tensor& g) { return std::vector<Tensor>{g.reshape(from)}; });
}

Tensor flatten(const Tensor& x) {
  DDP_CHECK(x.dim() >= 1, "flatten: needs at least one dimension, got shape {}",
            shape_str(x.shape()));
  return reshape(x, {x.size(0), x.size(0) == 0 ? 0 : x.numel() / x.size(0)});
}

Tensor relu(const Tensor& x) {
  return recorded(ddp::relu(x), "ReluBackward", {&x}, {&x},
                  [x](const Tensor& g) { return std::vector<Tensor>{ddp::relu_backward(g, x)}; });
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  // Note [autocast]: the bias in the region's dtype too (cuBLASLt's bias epilogue
  // takes the output's type), added before the one rounding.
  const Tensor xl = autocast::lower(x), wl = autocast::lower(weight), bl = autocast::lower(bias);
  Tensor y = ddp::linear(xl, wl, bl);
  return recorded(y, "LinearBackward", {&x, &weight, &bias},
                  {if_needed(requires_grad(weight), xl), if_needed(requires_grad(x), wl)},
                  [weight, xl, wl, x_dtype = x.dtype(), x_needs = requires_grad(x),
                   has_bias = bias.defined()](const Tensor& g) {
                    std::vector<Tensor> grads(3);
                    if (x_needs) grads[0] = matmul_into(x_dtype, g, wl, {});
                    // Note [gradient destinations]
                    auto p = ddp::linear_param_grads(g, xl, weight.dtype(), has_bias,
                                                     gradient_destination(weight));
                    grads[1] = std::move(p.weight);
                    grads[2] = std::move(p.bias);
                    return grads;
                  });
}

// Note [padded head]
// ~~~~~~~~~~~~~~~~~~
// GPT-2's vocabulary of 50257 makes the head's logits [N, 50257]: in bf16 a row is
// 100514 bytes, not a multiple of 16, and every matmul that writes or reads them
// (the forward's product, the backward's input and weight gradients; about 30% of
// a GPT-2 step's FLOPs) gets a leading dimension off 16-byte alignment, which
// tensor-core GEMM kernels need (cuBLAS then runs "align1" kernels, several times
// slower: pytorch/pytorch#146817). nanoGPT and llm.c pad the vocabulary to 50304.
// lm_head pads the product instead, not the model: the weight's bf16 copy gets
// zero rows up to `columns`, a bias of 0 for the real columns and -inf for the
// padding rides cuBLASLt's bias epilogue, and the logits [N, columns] have aligned
// rows. The padded logits are -inf, so the fused cross-entropy (Note [fused
// classifier] in ops/ops.h) adds exp(-inf) = 0 for them and gives them a zero
// gradient: the loss and every gradient are the unpadded model's, up to the order of
// the row sums. The parameters keep their shapes (checkpoints, exports and the
// optimizer see GPT-2's), and the weight's gradient is the first vocab rows of the
// padded product's, in the weight's dtype.
Tensor lm_head(const Tensor& x, const Tensor& weight, int64_t columns) {
  const int64_t vocab = weight.size(0), d = weight.size(1);
  if (columns == vocab) return functional::linear(x, weight, Tensor());
  DDP_CHECK(columns > vocab,
            "lm_head: {} columns for a weight of {} rows; give at least as many columns as "
            "the vocabulary",
            columns, vocab);
  const Tensor xl = autocast::lower(x), wl = autocast::lower(weight);
  const TensorOptions like{.dtype = wl.dtype(), .device = wl.device()};
  Tensor padded = empty({columns, d}, like);
  {
    Tensor head = padded.slice(0, vocab), rest = padded.slice(vocab, columns);
    copy_(head, wl);
    fill_(rest, 0.0);
  }
  Tensor bias = zeros({columns}, like);
  {
    Tensor rest = bias.slice(vocab, columns);
    fill_(rest, -std::numeric_limits<double>::infinity());
  }
  Tensor y = ddp::linear(xl, padded, bias);
  return recorded(y, "LmHeadBackward", {&x, &weight},
                  {if_needed(requires_grad(weight), xl), if_needed(requires_grad(x), padded)},
                  [padded, xl, vocab, weight_dtype = weight.dtype(), x_dtype = x.dtype(),
                   x_needs = requires_grad(x)](const Tensor& g) {
                    std::vector<Tensor> grads(2);
                    if (x_needs) grads[0] = matmul_into(x_dtype, g, padded, {});
                    // The padding's rows of the weight gradient are zero (their logits'
                    // gradients are): the first vocab rows are the weight's gradient.
                    grads[1] =
                        ddp::linear_param_grads(g, xl, weight_dtype, false).weight.slice(0, vocab);
                    return grads;
                  });
}

Tensor gelu_mlp(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias,
                const Tensor& proj_weight, const Tensor& proj_bias) {
  const Tensor xl = autocast::lower(x), w1 = autocast::lower(fc_weight);
  const Tensor b1 = autocast::lower(fc_bias), w2 = autocast::lower(proj_weight);
  const Tensor b2 = autocast::lower(proj_bias);
  LinearGelu f = ddp::linear_gelu(xl, w1, b1);
  Tensor y = ddp::linear(f.out, w2, b2);
  // The hidden layer's gradient (from w2 and pre) feeds x's and the first layer's.
  const bool hidden = requires_grad(x) || requires_grad(fc_weight) || requires_grad(fc_bias);
  return recorded(y, "GeluMlpBackward", {&x, &fc_weight, &fc_bias, &proj_weight, &proj_bias},
                  {if_needed(requires_grad(fc_weight), xl), if_needed(requires_grad(x), w1),
                   if_needed(hidden, w2), if_needed(requires_grad(proj_weight), f.out),
                   if_needed(hidden, f.pre)},
                  [xl, w1, w2, h = f.out, pre = f.pre, fc_weight, proj_weight, x_dtype = x.dtype(),
                   x_needs = requires_grad(x)](const Tensor& g) {
                    std::vector<Tensor> grads(5);
                    // Note [gradient destinations], as linear's backward.
                    auto proj = ddp::linear_param_grads(g, h, proj_weight.dtype(), true,
                                                        gradient_destination(proj_weight));
                    const Tensor grad_pre = ddp::linear_input_grad_gelu(g, w2, pre);
                    auto fc = ddp::linear_param_grads(grad_pre, xl, fc_weight.dtype(), true,
                                                      gradient_destination(fc_weight));
                    if (x_needs) grads[0] = matmul_into(x_dtype, grad_pre, w1, {});
                    grads[1] = std::move(fc.weight);
                    grads[2] = std::move(fc.bias);
                    grads[3] = std::move(proj.weight);
                    grads[4] = std::move(proj.bias);
                    return grads;
                  });
}

namespace {
// Whether `t` (a closure's copy) is the only reference to its tensor and storage, and
// that storage ddp's own (not memory from_blob wraps for its caller).
bool sole_owner(const Tensor& t) {
  return t.is_only_reference() && t.storage()->allocator() != nullptr;
}
}  // namespace

// Note [classifier gradient in place] (ops/ops.h): the backward writes the gradient over
// the probabilities it alone keeps, and over the 16-bit logits when nothing else holds
// them any more (a model's output dropped after the loss, as train and bench gpt do; a
// caller that keeps it gets a new tensor). The graph is never run twice (the engine
// releases a node's closure after it ran), so nothing reads them after.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels) {
  auto r = softmax_cross_entropy(logits, labels);
  if (r.lse.defined()) {  // 16-bit logits: Note [fused classifier] in ops/ops.h
    return recorded(r.loss, "CrossEntropyBackward", {&logits}, {&logits, &r.lse, &labels},
                    [logits, lse = r.lse, labels](const Tensor& g) {
                      return std::vector<Tensor>{softmax_cross_entropy_backward_from_logits(
                          logits, lse, labels, g, sole_owner(logits))};
                    });
  }
  return recorded(r.loss, "CrossEntropyBackward", {&logits}, {&r.probs, &labels},
                  [probs = r.probs, labels](const Tensor& g) {
                    return std::vector<Tensor>{
                        softmax_cross_entropy_backward(probs, labels, g, sole_owner(probs))};
                  });
}

namespace {

// Note [conv per image]
// On the CPU a convolution is one GEMM per image, in NCHW throughout: with cols
// the im2col rows [N*HW, K] and W [C_out, K],
//   y_i [C_out, HW]  = W cols_i^T          (+ bias as a rank-1 update b 1^T)
//   dW  [C_out, K]   = sum_i dy_i cols_i
//   dcols_i [HW, K]  = dy_i^T W
//   db  [C_out]      = sum_i dy_i 1
// so neither direction permutes NHWC rows to NCHW and back. The single-GEMM form
// (rows = cols W^T, then a [HW, C] -> [C, HW] transpose per image, and the reverse
// for the gradient) spent 23.5% of the CNN's step in those transposes on one Zen 4
// thread, more than im2col and col2im together; the per-image GEMMs cost a call
// each (N per direction). CUDA keeps the single GEMM: there a launch per image
// costs more than its transpose kernel.
Tensor conv2d_per_image(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const kernels::Conv2dGeometry& geom) {
  // k from the weight's other dims: numel() / c_out divides by zero for c_out == 0.
  const int64_t c_out = weight.size(0), k = weight.size(1) * weight.size(2) * weight.size(3);
  const int64_t n = x.size(0), hw = geom.out_h() * geom.out_w();
  Tensor cols = im2col(x, geom);
  Tensor w2d = weight.reshape({c_out, k});
  Tensor y =
      empty({n, c_out, geom.out_h(), geom.out_w()}, {.dtype = x.dtype(), .device = x.device()});
  // Every helper on x's device: a cpu:1 input (Note [virtual cpu devices]) must not
  // meet cpu tensors made here.
  const TensorOptions on_x{.dtype = x.dtype(), .device = x.device()};
  const Tensor ones_row = bias.defined() ? ones({1, hw}, on_x) : Tensor();
  const Tensor bias_col = bias.defined() ? bias.reshape({c_out, 1}) : Tensor();
  for (int64_t i = 0; i < n; ++i) {
    Tensor yi = y.flat_view(i * c_out * hw, {c_out, hw});
    const Tensor ci = cols.flat_view(i * hw * k, {hw, k});
    if (bias.defined()) ddp::matmul_out(bias_col, ones_row, yi);
    ddp::matmul_out(w2d, ci, yi, {.trans_b = true, .beta = bias.defined() ? 1.0f : 0.0f});
  }
  return recorded(
      y, "Conv2dBackward", {&x, &weight, &bias},
      {if_needed(requires_grad(weight), cols), if_needed(requires_grad(x), w2d)},
      [cols, w2d, geom, n, hw, k, c_out, wshape = weight.shape(), has_bias = bias.defined(),
       x_needs = requires_grad(x)](const Tensor& g) {
        std::vector<Tensor> grads(3);
        // An empty batch writes no GEMM: its gradients are zeros.
        // On g's device (Note [virtual cpu devices]: cpu:1's helpers must not be cpu's).
        const auto make = [&](const Shape& shape) {
          const TensorOptions on_g{.dtype = g.dtype(), .device = g.device()};
          return n == 0 ? zeros(shape, on_g) : empty(shape, on_g);
        };
        Tensor gw = make({c_out, k});
        Tensor gcols =
            x_needs ? empty({n * hw, k}, {.dtype = g.dtype(), .device = g.device()}) : Tensor();
        Tensor gb = has_bias ? make({c_out, 1}) : Tensor();
        const Tensor ones_col =
            has_bias ? ones({hw, 1}, {.dtype = g.dtype(), .device = g.device()}) : Tensor();
        for (int64_t i = 0; i < n; ++i) {
          const Tensor gi = g.flat_view(i * c_out * hw, {c_out, hw});
          const float beta = i == 0 ? 0.0f : 1.0f;
          ddp::matmul_out(gi, cols.flat_view(i * hw * k, {hw, k}), gw, {.beta = beta});
          if (has_bias) ddp::matmul_out(gi, ones_col, gb, {.beta = beta});
          if (x_needs) {
            Tensor gci = gcols.flat_view(i * hw * k, {hw, k});
            ddp::matmul_out(gi, w2d, gci, {.trans_a = true});
          }
        }
        if (x_needs) grads[0] = col2im(gcols, geom);
        grads[1] = gw.reshape(wshape);
        if (has_bias) grads[2] = gb.reshape({c_out});
        return grads;
      });
}

// On the CPU with oneDNN (Note [oneDNN convolutions] in ops/cpu/onednn_conv.cpp):
// the direct convolution in each direction, no column matrix.
Tensor conv2d_onednn_recorded(const Tensor& x, const Tensor& weight, const Tensor& bias,
                              const kernels::Conv2dGeometry& geom) {
  Tensor y = ddp::conv2d_onednn(x, weight, bias, geom);
  return recorded(y, "Conv2dBackward", {&x, &weight, &bias},
                  {if_needed(requires_grad(weight), x), if_needed(requires_grad(x), weight)},
                  [x, weight, bias, geom, has_bias = bias.defined(),
                   x_needs = requires_grad(x)](const Tensor& g) {
                    std::vector<Tensor> grads(3);
                    if (x_needs) grads[0] = ddp::conv2d_backward_input_onednn(g, weight, geom);
                    // Note [gradient destinations]
                    ddp::Conv2dParamGrads into{gradient_destination(weight),
                                               has_bias ? gradient_destination(bias) : Tensor()};
                    auto params = ddp::conv2d_backward_params_onednn(g, x, weight.shape(), geom,
                                                                     has_bias, std::move(into));
                    grads[1] = std::move(params.weight);
                    grads[2] = std::move(params.bias);
                    return grads;
                  });
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& o) {
  // Note [autocast]: convolutions stay f32 (a 16-bit input is widened, and its
  // gradient cast back by the engine).
  if (autocast_enabled() && x_in.dtype() != DType::f32) {
    return conv2d(functional::cast(x_in, DType::f32), weight, bias, o);
  }
  const Tensor& x = x_in;
  check_same_device("conv2d", {&x, &weight});
  DDP_CHECK(
      weight.dim() == 4 && x.dim() == 4 && weight.size(1) == x.size(1),
      "conv2d: input {} does not match weight {} (expected [N, C, H, W] and [C_out, C, kh, kw] "
      "with the same C)",
      shape_str(x.shape()), shape_str(weight.shape()));
  DDP_CHECK(weight.size(2) == weight.size(3), "conv2d: only square kernels, got weight {}",
            shape_str(weight.shape()));
  const auto geom = conv_geometry(x, weight.size(2), o.stride, o.padding);
  if (x.device().is_cpu()) {
    return ddp::onednn_convolutions() ? conv2d_onednn_recorded(x, weight, bias, geom)
                                      : conv2d_per_image(x, weight, bias, geom);
  }
  const int64_t c_out = weight.size(0), k = weight.size(1) * weight.size(2) * weight.size(3);
  const int64_t n = x.size(0), oh = geom.out_h(), ow = geom.out_w();
  Tensor cols = im2col(x, geom);
  Tensor w2d = weight.reshape({c_out, k});
  Tensor rows = ddp::matmul(cols, w2d, {.trans_b = true});
  if (bias.defined()) rows = ddp::add_bias_rows(rows, bias);
  Tensor y = permute4(rows.reshape({n, oh, ow, c_out}), {0, 3, 1, 2});
  return recorded(y, "Conv2dBackward", {&x, &weight, &bias},
                  {if_needed(requires_grad(weight), cols), if_needed(requires_grad(x), w2d)},
                  [cols, w2d, geom, wshape = weight.shape(), has_bias = bias.defined(),
                   x_needs = requires_grad(x)](const Tensor& g) {
                    Tensor grows = permute4(g, {0, 2, 3, 1}).reshape({cols.size(0), w2d.size(0)});
                    std::vector<Tensor> grads(3);
                    if (x_needs) grads[0] = col2im(ddp::matmul(grows, w2d), geom);
                    grads[1] = ddp::matmul(grows, cols, {.trans_a = true}).reshape(wshape);
                    if (has_bias) grads[2] = ddp::sum(grows, 0);
                    return grads;
                  });
}

Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride) {
  const auto geom = conv_geometry(x, kernel, stride == 0 ? kernel : stride, 0);
  auto r = ddp::max_pool2d(x, geom);
  return recorded(r.out, "MaxPool2dBackward", {&x}, {&r.indices},
                  [indices = r.indices, geom](const Tensor& g) {
                    return std::vector<Tensor>{max_pool2d_backward(g, indices, geom)};
                  });
}

Tensor dropout(const Tensor& x, float p, bool training, Generator& gen) {
  DDP_CHECK(p >= 0.0f && p < 1.0f, "dropout: probability {} is outside [0, 1)", p);
  if (!training || p == 0.0f) return x;
  // Note [cuda graphs]: the seed and offset are kernel arguments, so every replay of a
  // captured graph would draw this one mask.
  DDP_CHECK(!is_capturing(x.device()),
            "dropout (p = {}) while capturing a CUDA graph: every replay would drop the same "
            "elements; train without --cuda-graph, or without dropout",
            p);
  Tensor mask = dropout_mask(x.shape(), gen.seed(), gen.take(x.numel()), p, x.device());
  // A 16-bit x keeps its dtype (the product is rounded once; its gradient, f32 from
  // the f32 mask, is cast back by the engine).
  Tensor y = ddp::mul(x, mask);
  if (y.dtype() != x.dtype()) y = ddp::cast(y, x.dtype());
  return recorded(y, "DropoutBackward", {&x}, {&mask},
                  [mask](const Tensor& g) { return std::vector<Tensor>{ddp::mul(g, mask)}; });
}

Tensor gelu(const Tensor& x) {
  return recorded(ddp::gelu(x), "GeluBackward", {&x}, {&x},
                  [x](const Tensor& g) { return std::vector<Tensor>{ddp::gelu_backward(g, x)}; });
}

namespace {
// Note [autocast]: layer_norm's statistics in f32, its output in the region's dtype.
DType norm_dtype() {
  const AutocastState ac = autocast_state();
  return ac.enabled ? ac.dtype : DType::f32;
}

// r.out with layer_norm's backward over (x, weight, bias) recorded.
Tensor recorded_norm(const LayerNormResult& r, const Tensor& x, const Tensor& weight,
                     const Tensor& bias) {
  // Only the statistics are kept: the node holding its own output would be a cycle.
  LayerNormResult saved{Tensor(), r.mean, r.rstd};
  return recorded(r.out, "LayerNormBackward", {&x, &weight, &bias}, {&x, &weight},
                  [x, weight, saved = std::move(saved)](const Tensor& g) {
                    // x's gradient added into the one waiting from x's other use (the
                    // residual stream's): Note [accumulating into a pending gradient].
                    auto grads = ddp::layer_norm_backward(
                        g, x, saved, weight,
                        x.dtype() == DType::f32 ? pending_gradient(0, x) : Tensor());
                    return std::vector<Tensor>{grads.x, grads.weight, grads.bias};
                  });
}
}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  return recorded_norm(ddp::layer_norm(x, weight, bias, eps, norm_dtype()), x, weight, bias);
}

AddLayerNorm add_layer_norm(const Tensor& x, const Tensor& y, const Tensor& weight,
                            const Tensor& bias, float eps) {
  auto r = ddp::add_layer_norm(x, y, weight, bias, eps, norm_dtype());
  // The sum's node first: the norm's edge to it needs its grad_fn.
  Tensor sum = recorded_add(r.sum, x, y);
  return {sum, recorded_norm(r.norm, sum, weight, bias)};
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  return recorded(ddp::embedding(weight, indices), "EmbeddingBackward", {&weight}, {&indices},
                  [indices, rows = weight.size(0)](const Tensor& g) {
                    return std::vector<Tensor>{ddp::embedding_backward(g, indices, rows)};
                  });
}

namespace {
// Note [autocast]: softmaxes run in f32; a 16-bit input is cast (differentiably).
Tensor in_f32(const Tensor& x) {
  return autocast_enabled() && x.dtype() != DType::f32 ? functional::cast(x, DType::f32) : x;
}
}  // namespace

Tensor softmax(const Tensor& x_in) {
  const Tensor x = in_f32(x_in);
  Tensor y = ddp::softmax(x);
  // The backward keeps a view of y, not y itself: y's node holding y would be a cycle.
  return recorded(y, "SoftmaxBackward", {&x}, {&y},
                  [saved = y.reshape(y.shape())](const Tensor& g) {
                    return std::vector<Tensor>{ddp::softmax_backward(g, saved)};
                  });
}

namespace {
Tensor unary_fn(kernels::UnaryOp op, const char* name, const Tensor& x) {
  return recorded(ddp::unary(op, x), name, {&x}, {&x}, [x, op](const Tensor& g) {
    return std::vector<Tensor>{ddp::unary_backward(op, g, x)};
  });
}

void check_loss_shapes(const char* op, const Tensor& input, const Tensor& target) {
  check_same_device(op, {&input, &target});
  DDP_CHECK(input.shape() == target.shape(),
            "{}: input {} and target {} must have one shape (reshape the target, e.g. [N] to "
            "[N, 1])",
            op, shape_str(input.shape()), shape_str(target.shape()));
  DDP_CHECK(input.numel() > 0, "{}: the mean over an empty input {} is undefined", op,
            shape_str(input.shape()));
}
}  // namespace

Tensor tanh(const Tensor& x) {
  return unary_fn(kernels::UnaryOp::tanh, "TanhBackward", x);
}
Tensor sigmoid(const Tensor& x) {
  return unary_fn(kernels::UnaryOp::sigmoid, "SigmoidBackward", x);
}
Tensor silu(const Tensor& x) {
  return unary_fn(kernels::UnaryOp::silu, "SiluBackward", x);
}
Tensor abs(const Tensor& x) {
  return unary_fn(kernels::UnaryOp::abs, "AbsBackward", x);
}

// The losses compute in f32 (Note [autocast]: torch.autocast lists them as f32 ops).
Tensor mse_loss(const Tensor& input, const Tensor& target) {
  check_loss_shapes("mse_loss", input, target);
  const Tensor d = functional::sub(in_f32(input), in_f32(target));
  return functional::mean(functional::mul(d, d));
}

Tensor l1_loss(const Tensor& input, const Tensor& target) {
  check_loss_shapes("l1_loss", input, target);
  return functional::mean(functional::abs(functional::sub(in_f32(input), in_f32(target))));
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets) {
  check_loss_shapes("binary_cross_entropy_with_logits", logits, targets);
  const Tensor x = in_f32(logits), y = in_f32(targets);
  const float inv_n = 1.0f / static_cast<float>(x.numel());
  const Tensor loss = ddp::scale(ddp::sum(ddp::bce_with_logits(x, y)), inv_n);
  // d/dx = (sigmoid(x) - y) / N, d/dy = -x / N, times the upstream scalar (on the device).
  return recorded(loss, "BinaryCrossEntropyWithLogitsBackward", {&x, &y}, {&x, &y},
                  [x, y, inv_n, y_needs = requires_grad(y)](const Tensor& g) {
                    const Tensor gn = ddp::expand_scalar(ddp::scale(g, inv_n), x.shape());
                    std::vector<Tensor> grads(2);
                    grads[0] = ddp::mul(gn, ddp::bce_with_logits_grad(x, y));
                    if (y_needs) grads[1] = ddp::mul(gn, ddp::scale(x, -1.0f));
                    return grads;
                  });
}

Tensor log_softmax(const Tensor& x_in) {
  const Tensor x = in_f32(x_in);
  Tensor y = ddp::log_softmax(x);
  // The backward keeps a view of y, not y itself: y's node holding y would be a cycle.
  return recorded(y, "LogSoftmaxBackward", {&x}, {&y},
                  [saved = y.reshape(y.shape())](const Tensor& g) {
                    return std::vector<Tensor>{ddp::log_softmax_backward(g, saved)};
                  });
}

// Note [bmm backward]: with C = alpha op(A) op(B),
//   dA = alpha g op(B)^T   (A used as is)     dA = alpha op(B) g^T   (A transposed)
//   dB = alpha op(A)^T g   (B used as is)     dB = alpha g^T op(A)   (B transposed)
// and op(X)^T is X itself when X was transposed, so each is one bmm with flags.
Tensor bmm(const Tensor& a_in, const Tensor& b_in, const BmmOptions& o) {
  // Note [autocast]: the operands in the region's dtype; the engine casts each
  // gradient back to its input's dtype.
  const Tensor a = autocast::lower(a_in), b = autocast::lower(b_in);
  return recorded(
      ddp::bmm(a, b, o), "BmmBackward", {&a_in, &b_in},
      {if_needed(requires_grad(b_in), a), if_needed(requires_grad(a_in), b)},
      [a, b, o, a_needs = requires_grad(a_in), b_needs = requires_grad(b_in)](const Tensor& g) {
        std::vector<Tensor> grads(2);
        if (a_needs) {
          grads[0] = o.trans_a
                         ? ddp::bmm(b, g, {.trans_a = o.trans_b, .trans_b = true, .alpha = o.alpha})
                         : ddp::bmm(g, b, {.trans_b = !o.trans_b, .alpha = o.alpha});
        }
        if (b_needs) {
          grads[1] = o.trans_b
                         ? ddp::bmm(g, a, {.trans_a = true, .trans_b = o.trans_a, .alpha = o.alpha})
                         : ddp::bmm(a, g, {.trans_a = !o.trans_a, .alpha = o.alpha});
        }
        return grads;
      });
}

Tensor causal_softmax(const Tensor& x_in) {
  const Tensor x = in_f32(x_in);
  Tensor y = ddp::causal_softmax(x);
  // The masked probabilities are exactly 0, so softmax's backward gives them zero
  // gradient. A view of y, not y itself: y's node holding y would be a cycle.
  return recorded(y, "CausalSoftmaxBackward", {&x}, {&y},
                  [saved = y.reshape(y.shape())](const Tensor& g) {
                    return std::vector<Tensor>{ddp::softmax_backward(g, saved)};
                  });
}

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  DDP_CHECK(q.dim() == 4 && q.shape() == k.shape() && q.shape() == v.shape(),
            "causal_attention: q, k and v must share one shape [B, H, T, D], got q {}, k {}, v {}",
            shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  const int64_t bh = q.size(0) * q.size(1), t = q.size(2), d = q.size(3);
  DDP_CHECK(d >= 1, "causal_attention: head dim D must be >= 1, got shape {}",
            shape_str(q.shape()));
  const Shape flat = {bh, t, d};
  // Qualified: ADL would also find ddp::bmm and ddp::causal_softmax, which record nothing.
  const Tensor scores =
      functional::bmm(functional::reshape(q, flat), functional::reshape(k, flat),
                      {.trans_b = true, .alpha = 1.0f / std::sqrt(static_cast<float>(d))});
  const Tensor probs = functional::causal_softmax(scores);
  return functional::reshape(functional::bmm(probs, functional::reshape(v, flat)), q.shape());
}

Tensor causal_self_attention(const Tensor& qkv_in, int64_t heads) {
  const Tensor qkv = autocast::lower(qkv_in);  // Note [autocast]
  const AttentionResult r = ddp::causal_self_attention(qkv, heads);
  // probs and stats are not the recorded output, so keeping them is no cycle; the fused
  // backward also reads y (Note [fused attention]), kept as a view: y's node holding y
  // would be one.
  AttentionResult saved{r.fused() ? r.y.reshape(r.y.shape()) : Tensor(), r.probs, r.stats, r.path};
  const Tensor& kept_y = saved.y;
  return recorded(
      r.y, "CausalSelfAttentionBackward", {&qkv_in}, {&qkv, &kept_y, &r.probs, &r.stats},
      [qkv, saved, heads](const Tensor& g) {
        return std::vector<Tensor>{ddp::causal_self_attention_backward(g, qkv, saved, heads)};
      });
}

}  // namespace ddp::functional
