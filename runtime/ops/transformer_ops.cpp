// The checked entry points of the transformer ops: device, shape and dtype checks,
// output allocation on the inputs' device, then the CPU kernel (ops/cpu/transformer.cpp)
// or the CUDA kernel (ops/cuda/transformer.cu, embedding.cu, attention.cu).
#include "runtime/ops/transformer_ops.h"

#include "runtime/env.h"
#include "runtime/logging.h"
#include "runtime/ops/cuda/linear_lt.h"
#include "runtime/ops/cuda/sdpa_cudnn.h"
#include "runtime/ops/dispatch.h"
#include "runtime/ops/ops.h"
#include "runtime/planted_fault.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

namespace ddp {
namespace {

using ops_detail::check_dtype;
using ops_detail::check_f32;
using ops_detail::check_float;
using ops_detail::is_16bit;
using ops_detail::like;
using ops_detail::narrowed;
using ops_detail::widen_on_cpu;
using ops_detail::widened;

// x must have a last dim of at least one element to normalize or softmax over.
void check_last_dim(std::string_view op, const Tensor& x) {
  DDP_CHECK(x.dim() >= 1 && x.size(-1) >= 1,
            "{}: works along the last dim, which needs at least one element; got shape {}", op,
            shape_str(x.shape()));
}

void check_row_param(const Tensor& p, const Tensor& x, const char* what,
                     std::string_view op = "layer_norm") {
  check_f32(op, p, what);
  DDP_CHECK(p.dim() == 1 && p.size(0) == x.size(-1),
            "{}: {} has shape {}, expected [{}] (the last dim of input {})", op, what,
            shape_str(p.shape()), x.size(-1), shape_str(x.shape()));
}

// layer_norm's checks of an f32 x, its parameters and eps.
void check_layer_norm(std::string_view op, const Tensor& x, const Tensor& weight,
                      const Tensor& bias, float eps) {
  check_last_dim(op, x);
  check_row_param(weight, x, "weight", op);
  check_row_param(bias, x, "bias", op);
  DDP_CHECK(eps > 0.0f, "{}: eps must be > 0 (it keeps 1 / sqrt(var + eps) finite), got {}", op,
            eps);
}

void check_norm_dtype(std::string_view op, DType out_dtype) {
  DDP_CHECK(out_dtype == DType::f32 || is_16bit(out_dtype),
            "{}: out_dtype must be f32, bf16 or f16, got {}", op, dtype_name(out_dtype));
}

Tensor softmax_any(const Tensor& x, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_same_device(op, {&x});
  check_f32(op, x, "input");
  check_last_dim(op, x);
  Tensor out = like(x);
  if (out.numel() > 0) DDP_DISPATCH(x.device(), softmax, x, log, out);
  return out;
}

Tensor softmax_backward_any(const Tensor& grad, const Tensor& y, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_same_device(op, {&grad, &y});
  check_f32(op, grad, "grad");
  check_f32(op, y, "output");
  check_same_shape(op, grad, y);
  check_last_dim(op, y);
  Tensor grad_x = like(y);
  if (grad_x.numel() > 0) DDP_DISPATCH(y.device(), softmax_backward, grad, y, log, grad_x);
  return grad_x;
}

}  // namespace

Tensor gelu(const Tensor& x) {
  check_same_device("gelu", {&x});
  check_float("gelu", x);
  if (widen_on_cpu({&x})) return narrowed(gelu(widened(x)), x.dtype());
  Tensor out = like(x);
  if (out.numel() > 0) DDP_DISPATCH(x.device(), gelu, x, out);
  return out;
}

Tensor gelu_backward(const Tensor& grad, const Tensor& x) {
  check_same_device("gelu_backward", {&grad, &x});
  check_float("gelu_backward", grad, "grad");
  check_float("gelu_backward", x);
  check_same_shape("gelu_backward", grad, x);
  DDP_CHECK(grad.dtype() == x.dtype(), "gelu_backward: grad {} and input {} must share a dtype",
            dtype_name(grad.dtype()), dtype_name(x.dtype()));
  if (widen_on_cpu({&x})) return narrowed(gelu_backward(widened(grad), widened(x)), x.dtype());
  Tensor out = like(x);
  if (out.numel() > 0) DDP_DISPATCH(x.device(), gelu_backward, grad, x, out);
  return out;
}

bool gelu_epilogues_enabled() {
  return kernels::cuda::lt_gelu_enabled();
}

void set_gelu_epilogues_enabled(bool enabled) {
  kernels::cuda::set_lt_gelu_enabled(enabled);
}

namespace {
// The 16-bit CUDA tensors of one dtype that Note [gelu epilogues] takes.
bool gelu_epilogue_fits(std::initializer_list<const Tensor*> ts) {
  const Tensor& first = **ts.begin();
  if (!first.device().is_cuda() || !is_16bit(first.dtype()) || !gelu_epilogues_enabled()) {
    return false;
  }
  return std::all_of(ts.begin(), ts.end(),
                     [&](const Tensor* t) { return t->dtype() == first.dtype(); });
}
}  // namespace

LinearGelu linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_same_device("linear_gelu", {&x, &weight, &bias});
  const profile::Scope op_scope("linear_gelu", x.device(), x, weight, bias);
  DDP_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1) && bias.dim() == 1 &&
                bias.size(0) == weight.size(0),
            "linear_gelu: input {}, weight {} and bias {} do not fit (expected [N, in], [out, "
            "in] and [out])",
            shape_str(x.shape()), shape_str(weight.shape()), shape_str(bias.shape()));
  if (gelu_epilogue_fits({&x, &weight, &bias})) {
    Tensor out = empty({x.size(0), weight.size(0)}, {.dtype = x.dtype(), .device = x.device()});
    Tensor pre = like(out);
    if (kernels::cuda::linear_gelu_lt(x, weight, bias, out, pre)) {
      planted_fault::after("linear_gelu", x.device(), out, pre);  // Note [planted faults]
      return {out, pre};
    }
  }
  Tensor pre = linear(x, weight, bias);
  return {gelu(pre), pre};
}

Tensor linear_input_grad_gelu(const Tensor& grad, const Tensor& weight, const Tensor& pre) {
  check_same_device("linear_input_grad_gelu", {&grad, &weight, &pre});
  const profile::Scope op_scope("linear_input_grad_gelu", grad.device(), grad, weight, pre);
  DDP_CHECK(grad.dim() == 2 && weight.dim() == 2 && pre.dim() == 2 &&
                grad.size(1) == weight.size(0) && pre.size(0) == grad.size(0) &&
                pre.size(1) == weight.size(1),
            "linear_input_grad_gelu: grad {}, weight {} and pre {} do not fit (expected [N, "
            "out], [out, in] and [N, in])",
            shape_str(grad.shape()), shape_str(weight.shape()), shape_str(pre.shape()));
  if (gelu_epilogue_fits({&grad, &weight, &pre})) {
    Tensor grad_pre = like(pre);
    if (kernels::cuda::linear_input_grad_dgelu_lt(grad, weight, pre, grad_pre)) {
      planted_fault::after("linear_input_grad_gelu", grad.device(), grad_pre);
      return grad_pre;
    }
  }
  return gelu_backward(matmul(grad, weight), pre);
}

LayerNormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                           DType out_dtype) {
  check_same_device("layer_norm", {&x, &weight, &bias});
  check_float("layer_norm", x);
  check_norm_dtype("layer_norm", out_dtype);
  if (is_16bit(x.dtype())) {  // statistics in f32, as autocast computes layer_norm
    LayerNormResult r = layer_norm(widened(x), weight, bias, eps, out_dtype);
    return r;
  }
  check_layer_norm("layer_norm", x, weight, bias, eps);
  const int64_t rows = x.numel() / x.size(-1);
  if (x.device().is_cpu() && out_dtype != DType::f32) {  // Note [16-bit on the cpu]
    LayerNormResult r = layer_norm(x, weight, bias, eps);
    r.out = narrowed(r.out, out_dtype);
    return r;
  }
  LayerNormResult r{empty(x.shape(), {.dtype = out_dtype, .device = x.device()}),
                    empty({rows}, {.device = x.device()}), empty({rows}, {.device = x.device()})};
  if (rows > 0) DDP_DISPATCH(x.device(), layer_norm, x, weight, bias, eps, r.out, r.mean, r.rstd);
  return r;
}

AddLayerNormResult add_layer_norm(const Tensor& x, const Tensor& y, const Tensor& weight,
                                  const Tensor& bias, float eps, DType out_dtype) {
  constexpr std::string_view op = "add_layer_norm";
  check_same_device(op, {&x, &y, &weight, &bias});
  check_float(op, x, "x");
  check_float(op, y, "y");
  check_same_shape(op, x, y);
  check_norm_dtype(op, out_dtype);
  const bool fused = x.dtype() == DType::f32 && (x.device().is_cpu() || x.device().is_cuda());
  if (!fused) {
    Tensor sum = add(x, y);
    return {sum, layer_norm(sum, weight, bias, eps, out_dtype)};
  }
  check_layer_norm(op, x, weight, bias, eps);
  if (x.device().is_cpu() && (is_16bit(y.dtype()) || out_dtype != DType::f32)) {
    // Note [16-bit on the cpu]: f32 kernels, the output rounded after.
    AddLayerNormResult r = add_layer_norm(x, widened(y), weight, bias, eps);
    r.norm.out = narrowed(r.norm.out, out_dtype);
    return r;
  }
  const int64_t rows = x.numel() / x.size(-1);
  const Device& device = x.device();
  AddLayerNormResult r{like(x),
                       {empty(x.shape(), {.dtype = out_dtype, .device = device}),
                        empty({rows}, {.device = device}), empty({rows}, {.device = device})}};
  if (rows > 0) {
    DDP_DISPATCH(device, residual_layer_norm, x, y, weight, bias, eps, r.sum, r.norm.out,
                 r.norm.mean, r.norm.rstd);
  }
  return r;
}

LayerNormGrads layer_norm_backward(const Tensor& grad, const Tensor& x,
                                   const LayerNormResult& saved, const Tensor& weight,
                                   const Tensor& into_x) {
  check_same_device("layer_norm_backward", {&grad, &x, &saved.mean, &saved.rstd, &weight});
  check_float("layer_norm_backward", grad, "grad");
  if (is_16bit(x.dtype())) {  // the forward widened it: so does the backward
    LayerNormGrads g = layer_norm_backward(grad, widened(x), saved, weight);
    g.x = narrowed(g.x, x.dtype());
    return g;
  }
  check_f32("layer_norm_backward", x, "input");
  if (widen_on_cpu({&grad})) return layer_norm_backward(widened(grad), x, saved, weight, into_x);
  check_same_shape("layer_norm_backward", grad, x);
  check_last_dim("layer_norm_backward", x);
  check_row_param(weight, x, "weight");
  const int64_t rows = x.numel() / x.size(-1);
  for (const Tensor* stat : {&saved.mean, &saved.rstd}) {
    check_f32("layer_norm_backward", *stat, "saved statistic");
    DDP_CHECK(stat->shape() == Shape{rows},
              "layer_norm_backward: a saved statistic has shape {}, expected [{}] for input {}; "
              "pass the LayerNormResult of the forward",
              shape_str(stat->shape()), rows, shape_str(x.shape()));
  }
  const bool accumulate = into_x.defined();
  if (accumulate) {
    check_same_device("layer_norm_backward", {&x, &into_x});
    DDP_CHECK(into_x.dtype() == DType::f32 && into_x.shape() == x.shape(),
              "layer_norm_backward: the gradient to add into is {} {}, expected f32 {} (x's)",
              dtype_name(into_x.dtype()), shape_str(into_x.shape()), shape_str(x.shape()));
    // The kernels read the inputs while and after writing into it (CUDA's blocks,
    // the column sums).
    const std::pair<const Tensor*, const char*> inputs[] = {{&grad, "grad"},
                                                            {&x, "x"},
                                                            {&weight, "weight"},
                                                            {&saved.mean, "the saved mean"},
                                                            {&saved.rstd, "the saved rstd"}};
    for (const auto& [input, name] : inputs) {
      DDP_CHECK(into_x.storage() != input->storage(),
                "layer_norm_backward: the gradient to add into shares memory with {}; pass a "
                "tensor of its own",
                name);
    }
  }
  LayerNormGrads g{accumulate ? into_x : like(x), like(weight), like(weight)};
  if (rows > 0) {
    DDP_DISPATCH(x.device(), layer_norm_backward, grad, x, saved.mean, saved.rstd, weight, g.x,
                 g.weight, g.bias, accumulate);
  } else {
    fill_(g.weight, 0.0);
    fill_(g.bias, 0.0);
  }
  return g;
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  check_same_device("embedding", {&weight, &indices});
  check_f32("embedding", weight, "weight");
  check_dtype("embedding", indices, DType::i64, "indices");
  DDP_CHECK(weight.dim() == 2, "embedding: weight must be a table [V, d], got shape {}",
            shape_str(weight.shape()));
  Shape shape = indices.shape();
  shape.push_back(weight.size(1));
  Tensor out = empty(shape, {.device = weight.device()});
  if (out.numel() > 0) {
    const Tensor flat = indices.reshape({indices.numel()});
    Tensor rows = out.reshape({indices.numel(), weight.size(1)});  // a view: writes land in out
    DDP_DISPATCH(weight.device(), embedding, weight, flat, rows);
  }
  return out;
}

Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_rows) {
  check_same_device("embedding_backward", {&grad, &indices});
  check_f32("embedding_backward", grad, "grad");
  check_dtype("embedding_backward", indices, DType::i64, "indices");
  DDP_CHECK(grad.dim() == indices.dim() + 1 &&
                std::equal(indices.shape().begin(), indices.shape().end(), grad.shape().begin()),
            "embedding_backward: grad has shape {}, expected the indices' shape {} plus [d]",
            shape_str(grad.shape()), shape_str(indices.shape()));
  DDP_CHECK(num_rows >= 0, "embedding_backward: num_rows must be >= 0, got {}", num_rows);
  const int64_t d = grad.size(-1);
  Tensor grad_weight = empty({num_rows, d}, {.device = grad.device()});
  if (grad_weight.numel() > 0) {
    const Tensor rows = grad.reshape({indices.numel(), d});
    const Tensor flat = indices.reshape({indices.numel()});
    DDP_DISPATCH(grad.device(), embedding_backward, rows, flat, grad_weight);
  }
  return grad_weight;
}

Tensor softmax(const Tensor& x) {
  return softmax_any(x, false);
}
Tensor log_softmax(const Tensor& x) {
  return softmax_any(x, true);
}
Tensor softmax_backward(const Tensor& grad, const Tensor& y) {
  return softmax_backward_any(grad, y, false);
}
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y) {
  return softmax_backward_any(grad, y, true);
}

Tensor bmm(const Tensor& a, const Tensor& b, const BmmOptions& o) {
  check_same_device("bmm", {&a, &b});
  check_float("bmm", a, "a");
  check_float("bmm", b, "b");
  DDP_CHECK(a.dtype() == b.dtype(), "bmm: a {} and b {} must share a dtype", dtype_name(a.dtype()),
            dtype_name(b.dtype()));
  if (is_16bit(a.dtype())) {
    // Not on GPT's path (its attention is the packed kernel): computed in f32 on
    // every device and rounded once.
    return narrowed(bmm(widened(a), widened(b), o), a.dtype());
  }
  DDP_CHECK(a.dim() == 3 && b.dim() == 3,
            "bmm: expects 3-D batches [B, M, K] and [B, K, N], got a {} and b {}",
            shape_str(a.shape()), shape_str(b.shape()));
  const int64_t m = o.trans_a ? a.size(2) : a.size(1), k = o.trans_a ? a.size(1) : a.size(2);
  const int64_t kb = o.trans_b ? b.size(2) : b.size(1), n = o.trans_b ? b.size(1) : b.size(2);
  DDP_CHECK(a.size(0) == b.size(0) && k == kb,
            "bmm: a {}{} and b {}{} do not multiply: expected the same batch size and a's "
            "columns ({}) equal to b's rows ({})",
            shape_str(a.shape()), o.trans_a ? " (transposed)" : "", shape_str(b.shape()),
            o.trans_b ? " (transposed)" : "", k, kb);
  Tensor out = empty({a.size(0), m, n}, {.device = a.device()});
  if (out.numel() > 0) DDP_DISPATCH(a.device(), bmm, a, b, out, o.trans_a, o.trans_b, o.alpha);
  return out;
}

Tensor causal_softmax(const Tensor& x) {
  check_same_device("causal_softmax", {&x});
  check_f32("causal_softmax", x, "input");
  DDP_CHECK(x.dim() >= 2 && x.size(-1) == x.size(-2) && x.size(-1) >= 1,
            "causal_softmax: expects square attention scores [..., T, T] with T >= 1, got shape "
            "{}",
            shape_str(x.shape()));
  Tensor out = like(x);
  if (out.numel() > 0) DDP_DISPATCH(x.device(), causal_softmax, x, out);
  return out;
}

namespace {
// Checks qkv [B, T, 3C] with C = heads * D, D >= 1; returns C.
int64_t attention_width(const Tensor& qkv, int64_t heads) {
  check_float("causal_self_attention", qkv, "qkv");
  DDP_CHECK(heads >= 1, "causal_self_attention: heads must be >= 1, got {}", heads);
  DDP_CHECK(qkv.dim() == 3 && qkv.size(2) % (3 * heads) == 0 && qkv.size(2) > 0,
            "causal_self_attention: expects packed projections qkv [B, T, 3C] with C divisible "
            "by heads = {}, got shape {}",
            heads, shape_str(qkv.shape()));
  return qkv.size(2) / 3;
}

// Note [fused attention]: why the fused path did not run, said once per reason.
void note_packed(const std::string& why) {
  static std::mutex mutex;
  static std::set<std::string> said;
  const std::lock_guard lock(mutex);
  if (said.insert(why).second) {
    DDP_LOG_INFO("attention runs as the packed kernels, not cuDNN's fused attention: {}", why);
  }
}

// Whether `path` asks for the fused attention on qkv: fused always does (an input
// it cannot take is an error naming it), automatic does for 16-bit CUDA tensors
// unless DDP_CUDNN_ATTENTION=0.
bool fused_asked(const Tensor& qkv, AttentionPath path) {
  if (path == AttentionPath::packed) return false;
  const bool fits = qkv.device().is_cuda() && is_16bit(qkv.dtype());
  if (path == AttentionPath::fused) {
    DDP_CHECK(fits,
              "causal_self_attention: the fused attention runs on bf16 or f16 CUDA tensors, got "
              "{} on {}; use AttentionPath::automatic or packed",
              dtype_name(qkv.dtype()), qkv.device().str());
    return true;
  }
  if (!fits) return false;
  static const bool enabled = env::get_int(env::kCudnnAttention).value_or(1) != 0;
  return enabled;
}
}  // namespace

AttentionResult causal_self_attention(const Tensor& qkv, int64_t heads, AttentionPath path) {
  check_same_device("causal_self_attention", {&qkv});
  const profile::Scope op_scope("causal_self_attention", qkv.device(), qkv);
  const int64_t c = attention_width(qkv, heads), b = qkv.size(0), t = qkv.size(1);
  if (fused_asked(qkv, path) && qkv.numel() > 0) {  // Note [fused attention]
    AttentionResult r{empty({b, t, c}, {.dtype = qkv.dtype(), .device = qkv.device()}), Tensor(),
                      empty({b, heads, t, 1}, {.device = qkv.device()}), path};
    std::string why;
    if (kernels::cuda::fused_attention_forward(qkv, heads, r.y, r.stats, &why)) {
      planted_fault::after("causal_self_attention", qkv.device(), r.y, r.stats);
      return r;
    }
    if (path == AttentionPath::fused) {
      throw DeviceError(
          fmt::format("causal_self_attention: the fused attention cannot run: {}", why));
    }
    note_packed(why);
  }
  if (is_16bit(qkv.dtype()) && qkv.device().is_cpu()) {  // Note [16-bit attention]
    AttentionResult r = causal_self_attention(widened(qkv), heads, AttentionPath::packed);
    r.y = narrowed(r.y, qkv.dtype());
    r.path = path;
    return r;
  }
  // CUDA keeps 16-bit probabilities for 16-bit qkv (Note [16-bit attention on cuda]).
  AttentionResult r{empty({b, t, c}, {.dtype = qkv.dtype(), .device = qkv.device()}),
                    empty({b, heads, t, t}, {.dtype = qkv.dtype(), .device = qkv.device()}),
                    Tensor(), path};
  if (r.y.numel() > 0) DDP_DISPATCH(qkv.device(), attention_forward, qkv, heads, r.y, r.probs);
  return r;
}

Tensor causal_self_attention_backward(const Tensor& grad_y, const Tensor& qkv,
                                      const AttentionResult& forward, int64_t heads) {
  if (!forward.fused()) return causal_self_attention_backward(grad_y, qkv, forward.probs, heads);
  check_same_device("causal_self_attention_backward", {&grad_y, &qkv, &forward.y, &forward.stats});
  const profile::Scope op_scope("causal_self_attention_backward", qkv.device(), grad_y, qkv);
  const int64_t c = attention_width(qkv, heads), b = qkv.size(0), t = qkv.size(1);
  DDP_CHECK(grad_y.shape() == Shape({b, t, c}) && forward.y.shape() == Shape({b, t, c}) &&
                forward.stats.shape() == Shape({b, heads, t, 1}) &&
                forward.stats.dtype() == DType::f32,
            "causal_self_attention_backward: qkv {} with {} heads expects grad_y and y [{}, {}, "
            "{}] and f32 stats [{}, {}, {}, 1], got {}, {} and {} {}; pass the forward's result",
            shape_str(qkv.shape()), heads, b, t, c, b, heads, t, shape_str(grad_y.shape()),
            shape_str(forward.y.shape()), dtype_name(forward.stats.dtype()),
            shape_str(forward.stats.shape()));
  DDP_CHECK(grad_y.dtype() == qkv.dtype() && forward.y.dtype() == qkv.dtype(),
            "causal_self_attention_backward: grad_y {} and y {} must have qkv's dtype {}",
            dtype_name(grad_y.dtype()), dtype_name(forward.y.dtype()), dtype_name(qkv.dtype()));
  Tensor grad_qkv = like(qkv);
  std::string why;
  if (kernels::cuda::fused_attention_backward(grad_y, qkv, forward.y, forward.stats, heads,
                                              grad_qkv, &why)) {
    planted_fault::after("causal_self_attention_backward", qkv.device(), grad_qkv);
    return grad_qkv;
  }
  // A forward that ran fused whose backward cannot (the forward builds both plans, so
  // only a cuDNN that refuses a plan it built before): the probabilities again, packed.
  if (forward.path == AttentionPath::fused) {
    throw DeviceError(fmt::format(
        "causal_self_attention_backward: the fused attention's backward cannot run: {}", why));
  }
  note_packed(fmt::format("the backward: {}", why));
  const AttentionResult packed = causal_self_attention(qkv, heads, AttentionPath::packed);
  return causal_self_attention_backward(grad_y, qkv, packed.probs, heads);
}

Tensor causal_self_attention_backward(const Tensor& grad_y, const Tensor& qkv, const Tensor& probs,
                                      int64_t heads) {
  DDP_CHECK(probs.defined(),
            "causal_self_attention_backward: probs is undefined, as in a fused forward's result "
            "(Note [fused attention]); pass the whole AttentionResult instead");
  check_same_device("causal_self_attention_backward", {&grad_y, &qkv, &probs});
  const profile::Scope op_scope("causal_self_attention_backward", qkv.device(), grad_y, qkv);
  const int64_t c = attention_width(qkv, heads), b = qkv.size(0), t = qkv.size(1);
  DDP_CHECK(grad_y.shape() == Shape({b, t, c}) && probs.shape() == Shape({b, heads, t, t}),
            "causal_self_attention_backward: qkv {} with {} heads expects grad_y [{}, {}, {}] "
            "and probs [{}, {}, {}, {}], got {} and {}",
            shape_str(qkv.shape()), heads, b, t, c, b, heads, t, t, shape_str(grad_y.shape()),
            shape_str(probs.shape()));
  DDP_CHECK(probs.dtype() == DType::f32 || probs.dtype() == qkv.dtype(),
            "causal_self_attention_backward: probs {} for qkv {}; pass the forward's result",
            dtype_name(probs.dtype()), dtype_name(qkv.dtype()));
  DDP_CHECK(grad_y.dtype() == qkv.dtype(),
            "causal_self_attention_backward: grad_y {} must have qkv's dtype {}",
            dtype_name(grad_y.dtype()), dtype_name(qkv.dtype()));
  if (is_16bit(qkv.dtype()) && probs.dtype() == DType::f32) {  // Note [16-bit attention]
    const Tensor grad_qkv =
        causal_self_attention_backward(widened(grad_y), widened(qkv), probs, heads);
    return narrowed(grad_qkv, qkv.dtype());
  }
  Tensor grad_qkv = like(qkv);
  if (grad_qkv.numel() > 0)
    DDP_DISPATCH(qkv.device(), attention_backward, grad_y, qkv, probs, heads, grad_qkv);
  return grad_qkv;
}

Tensor sum_squares(const Tensor& x) {
  check_same_device("sum_squares", {&x});
  check_f32("sum_squares", x, "input");
  Tensor out = empty({}, {.device = x.device()});
  if (x.numel() == 0) {
    fill_(out, 0.0);
  } else {
    DDP_DISPATCH(x.device(), sum_squares, x, out);
  }
  return out;
}

}  // namespace ddp
