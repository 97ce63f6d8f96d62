// The one dispatch point of every op: device, shape and dtype checks, output
// allocation on the inputs' device, then the CPU or CUDA kernel.
#include "runtime/ops/ops.h"

#include "runtime/memory/allocator.h"
#include "runtime/ops/cuda/linear_lt.h"
#include "runtime/ops/dispatch.h"
#include "runtime/ops/kernels.h"
#include "runtime/planted_fault.h"

#include <cmath>
#include <limits>

namespace ddp {

namespace ops_detail {
// f32, bf16 or f16: the dtypes the elementwise and reduction ops compute on.
void check_float(std::string_view op, const Tensor& t, const char* what) {
  DDP_CHECK(t.dtype() == DType::f32 || is_16bit(t.dtype()),
            "{}: {} must be f32, bf16 or f16, got {} (shape {}); convert with cast()", op, what,
            dtype_name(t.dtype()), shape_str(t.shape()));
}

// PyTorch's promotion among the float dtypes: equal dtypes stay, bf16 with f16 or
// either with f32 gives f32.
DType promote(DType a, DType b) {
  return a == b ? a : DType::f32;
}

// Note [16-bit on the cpu]: the CPU kernels compute in f32 only. A CPU op on bf16 or
// f16 tensors widens them to f32 (exact), runs the f32 kernel, and rounds the result
// once to the output's dtype: the reference that the CUDA 16-bit kernels, which
// also compute each element in f32 and round once, are tested against.
Tensor widened(const Tensor& t) {
  return is_16bit(t.dtype()) ? cast(t, DType::f32) : t;
}
bool widen_on_cpu(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (t->defined() && t->device().is_cpu() && is_16bit(t->dtype())) return true;
  }
  return false;
}
Tensor narrowed(const Tensor& t, DType dtype) {
  return t.dtype() == dtype ? t : cast(t, dtype);
}

void check_dtype(std::string_view op, const Tensor& t, DType expected, const char* what) {
  DDP_CHECK(t.dtype() == expected,
            "{}: {} must have dtype {}, got {} (shape {}); convert with cast()", op, what,
            dtype_name(expected), dtype_name(t.dtype()), shape_str(t.shape()));
}
}  // namespace ops_detail

namespace {

using ops_detail::check_dtype;
using ops_detail::check_f32;
using ops_detail::check_float;
using ops_detail::is_16bit;
using ops_detail::like;
using ops_detail::narrowed;
using ops_detail::promote;
using ops_detail::widen_on_cpu;
using ops_detail::widened;

int64_t wrap_dim(std::string_view op, const Tensor& x, int64_t dim) {
  const int64_t n = x.dim();
  DDP_CHECK(dim >= -n && dim < n,
            "{}: dim {} out of range for a tensor of shape {} (valid: {} to {})", op, dim,
            shape_str(x.shape()), -n, n - 1);
  return dim < 0 ? dim + n : dim;
}

struct DimView {
  int64_t outer = 1, n = 1, inner = 1;
  Shape out_shape;
};

DimView view_along(const Tensor& x, int64_t dim, bool keepdim) {
  DimView v;
  for (int64_t i = 0; i < x.dim(); ++i) {
    const int64_t s = x.shape()[static_cast<size_t>(i)];
    if (i < dim) v.outer *= s;
    if (i == dim) v.n = s;
    if (i > dim) v.inner *= s;
    if (i != dim) v.out_shape.push_back(s);
    if (i == dim && keepdim) v.out_shape.push_back(1);
  }
  return v;
}

Tensor binary_op(std::string_view op, kernels::BinaryOp kind, const Tensor& a, const Tensor& b) {
  check_same_device(op, {&a, &b});
  check_same_shape(op, a, b);
  check_float(op, a, "a");
  check_float(op, b, "b");
  const DType out_dtype = promote(a.dtype(), b.dtype());
  if (widen_on_cpu({&a, &b})) {
    return narrowed(binary_op(op, kind, widened(a), widened(b)), out_dtype);
  }
  Tensor out = empty(a.shape(), {.dtype = out_dtype, .device = a.device()});
  DDP_DISPATCH(a.device(), binary, kind, a, b, out);
  return out;
}

}  // namespace

void check_same_device(std::string_view op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = *tensors.begin();
  for (const Tensor* t : tensors) {
    DDP_CHECK(t->defined(), "{} received an undefined tensor", op.empty() ? "an op" : op);
    if (t->device() != first->device()) {
      throw DeviceError(fmt::format(
          "Expected all tensors to be on the same device, but found at least two devices, {} "
          "and {}!{}",
          first->device().str(), t->device().str(),
          op.empty()
              ? std::string()
              : fmt::format(" (in {}; move the tensors to one device with .to(device))", op)));
    }
  }
}

void check_same_device(std::initializer_list<const Tensor*> tensors) {
  check_same_device({}, tensors);
}

void check_same_shape(std::string_view op, const Tensor& a, const Tensor& b) {
  DDP_CHECK(a.shape() == b.shape(), "{}: shapes {} and {} must be equal", op, shape_str(a.shape()),
            shape_str(b.shape()));
}

void matmul_out(const Tensor& a, const Tensor& b, Tensor& out, const MatmulOptions& o) {
  check_same_device("matmul_out", {&a, &b, &out});
  DDP_CHECK(a.dim() == 2 && b.dim() == 2, "matmul: both operands must be 2-D, got shapes {} and {}",
            shape_str(a.shape()), shape_str(b.shape()));
  DDP_CHECK(a.dtype() == b.dtype() && (a.dtype() == out.dtype() || out.dtype() == DType::f32),
            "matmul: a and b must share a dtype, and out have it or f32, got {}, {} and out {}",
            dtype_name(a.dtype()), dtype_name(b.dtype()), dtype_name(out.dtype()));
  DDP_CHECK(is_floating(a.dtype()), "matmul: dtype {} not supported (f32, bf16, f16)",
            dtype_name(a.dtype()));
  const int64_t m = o.trans_a ? a.size(1) : a.size(0), ka = o.trans_a ? a.size(0) : a.size(1);
  const int64_t kb = o.trans_b ? b.size(1) : b.size(0), n = o.trans_b ? b.size(0) : b.size(1);
  DDP_CHECK(ka == kb, "matmul: shapes {}{} and {}{} cannot be multiplied ({}x{} and {}x{})",
            shape_str(a.shape()), o.trans_a ? "^T" : "", shape_str(b.shape()),
            o.trans_b ? "^T" : "", m, ka, kb, n);
  DDP_CHECK(out.shape() == (Shape{m, n}), "matmul: out has shape {}, expected [{}, {}]",
            shape_str(out.shape()), m, n);
  out.storage()->bump_version();  // Note [version counter]
  DDP_DISPATCH(a.device(), gemm, a, b, out, o.trans_a, o.trans_b, o.alpha, o.beta);
}

Tensor matmul(const Tensor& a, const Tensor& b, const MatmulOptions& options) {
  check_same_device("matmul", {&a, &b});
  DDP_CHECK(a.dim() == 2 && b.dim() == 2, "matmul: both operands must be 2-D, got shapes {} and {}",
            shape_str(a.shape()), shape_str(b.shape()));
  const int64_t m = options.trans_a ? a.size(1) : a.size(0);
  const int64_t n = options.trans_b ? b.size(0) : b.size(1);
  Tensor out = empty({m, n}, {.dtype = a.dtype(), .device = a.device()});
  MatmulOptions o = options;
  o.beta = 0.0f;
  matmul_out(a, b, out, o);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_same_device("linear", {&x, &weight});
  const profile::Scope op_scope("linear", x.device(), x, weight, bias);
  DDP_CHECK(x.dim() != 2 || weight.dim() != 2 || x.size(1) == weight.size(1),
            "linear: input {} does not match weight {} (expected input [N, {}])",
            shape_str(x.shape()), shape_str(weight.shape()), weight.size(1));
  DDP_CHECK(weight.dim() == 2, "linear: weight has shape {}, expected [out_features, in_features]",
            shape_str(weight.shape()));
  DDP_CHECK(x.dim() == 2,
            "linear: input {} has {} dimension(s); linear takes [N, in_features] (torch's [*, "
            "in_features] is not supported): reshape it to [-1, {}] and the output back",
            shape_str(x.shape()), x.dim(), weight.size(1));
  if (x.device().is_cuda() && is_16bit(x.dtype()) && weight.dtype() == x.dtype()) {
    if (bias.defined()) check_same_device("linear", {&x, &bias});
    Tensor out = empty({x.size(0), weight.size(0)}, {.dtype = x.dtype(), .device = x.device()});
    if (bias.defined()) {
      DDP_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0),
                "linear: bias has shape {}, expected [{}] (the weight's rows)",
                shape_str(bias.shape()), weight.size(0));
    }
    if (kernels::cuda::linear_lt(x, weight, bias, out)) {  // Note [cublasLt linear]
      planted_fault::after("linear", x.device(), out);     // Note [planted faults]
      return out;
    }
  }
  if (!bias.defined()) return matmul(x, weight, {.trans_b = true});
  if (!is_16bit(x.dtype())) return add_bias_rows(matmul(x, weight, {.trans_b = true}), bias);
  // 16-bit: the product in f32, then the bias and the one rounding in one kernel.
  check_same_device("linear", {&x, &bias});
  Tensor acc = empty({x.size(0), weight.size(0)}, {.dtype = DType::f32, .device = x.device()});
  matmul_out(x, weight, acc, {.trans_b = true});
  if (widen_on_cpu({&x})) return narrowed(add_bias_rows(acc, widened(bias)), x.dtype());
  DDP_CHECK(bias.dtype() == x.dtype() || bias.dtype() == DType::f32,
            "linear: bias must have the input's dtype {} or f32, got {}", dtype_name(x.dtype()),
            dtype_name(bias.dtype()));
  DDP_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0),
            "linear: bias has shape {}, expected [{}] (the weight's rows)", shape_str(bias.shape()),
            weight.size(0));
  Tensor out = empty(acc.shape(), {.dtype = x.dtype(), .device = x.device()});
  DDP_DISPATCH(x.device(), add_bias_rows, acc, bias, out);
  return out;
}

LinearParamGrads linear_param_grads(const Tensor& grad, const Tensor& x, DType weight_dtype,
                                    bool with_bias, Tensor into) {
  check_same_device("linear_param_grads", {&grad, &x});
  const profile::Scope op_scope("linear_param_grads", x.device(), grad, x);
  DDP_CHECK(grad.dim() == 2 && x.dim() == 2 && grad.size(0) == x.size(0),
            "linear backward: the output's gradient {} and the input {} must be [N, out] and "
            "[N, in] with the same N",
            shape_str(grad.shape()), shape_str(x.shape()));
  const int64_t out = grad.size(1), in = x.size(1);
  if (into.defined()) {
    check_same_device("linear_param_grads", {&grad, &into});
    DDP_CHECK(into.shape() == (Shape{out, in}) && into.dtype() == weight_dtype,
              "linear backward: the weight gradient's memory is {} {}, expected {} [{}, {}]",
              dtype_name(into.dtype()), shape_str(into.shape()), dtype_name(weight_dtype), out, in);
  } else {
    into = empty({out, in}, {.dtype = weight_dtype, .device = grad.device()});
  }
  if (with_bias && grad.device().is_cuda() && is_16bit(grad.dtype()) && x.dtype() == grad.dtype() &&
      weight_dtype == DType::f32) {
    Tensor bias = empty({out}, {.device = grad.device()});
    if (kernels::cuda::linear_weight_grad_lt(grad, x, into, bias)) {
      planted_fault::after("linear_param_grads", x.device(), into, bias);
      return {into, bias};
    }
  }
  matmul_out(grad, x, into, {.trans_a = true});
  return {into, with_bias ? sum(grad, 0) : Tensor()};
}

Tensor add(const Tensor& a, const Tensor& b) {
  return binary_op("add", kernels::BinaryOp::add, a, b);
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary_op("sub", kernels::BinaryOp::sub, a, b);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary_op("mul", kernels::BinaryOp::mul, a, b);
}

Tensor scale(const Tensor& a, float s) {
  check_float("scale", a);
  if (widen_on_cpu({&a})) return narrowed(scale(widened(a), s), a.dtype());
  Tensor out = like(a);
  DDP_DISPATCH(a.device(), scale, a, s, out);
  return out;
}

Tensor expand_scalar(const Tensor& scalar, const Shape& shape) {
  check_f32("expand_scalar", scalar);
  DDP_CHECK(scalar.numel() == 1, "expand_scalar: needs a tensor with one element, got shape {}",
            shape_str(scalar.shape()));
  Tensor out = empty(shape, {.dtype = DType::f32, .device = scalar.device()});
  if (out.numel() > 0) DDP_DISPATCH(scalar.device(), broadcast_scalar, scalar, out);
  return out;
}

void axpy_(float alpha, const Tensor& x, Tensor& y) {
  check_same_device("axpy_", {&x, &y});
  check_same_shape("axpy_", x, y);
  check_f32("axpy_", x);
  check_f32("axpy_", y);
  y.storage()->bump_version();  // Note [version counter]
  DDP_DISPATCH(x.device(), axpy, alpha, x, y);
}

Tensor add_bias_rows(const Tensor& x, const Tensor& bias) {
  check_same_device("add_bias_rows", {&x, &bias});
  check_float("add_bias_rows", x);
  DDP_CHECK(bias.dtype() == x.dtype() || bias.dtype() == DType::f32,
            "add_bias_rows: bias must have x's dtype {} or f32, got {}", dtype_name(x.dtype()),
            dtype_name(bias.dtype()));
  DDP_CHECK(x.dim() == 2 && bias.dim() == 1 && bias.size(0) == x.size(1),
            "add_bias_rows: expected x [rows, cols] and bias [cols], got {} and {}",
            shape_str(x.shape()), shape_str(bias.shape()));
  if (widen_on_cpu({&x, &bias})) {
    return narrowed(add_bias_rows(widened(x), widened(bias)), x.dtype());
  }
  Tensor out = like(x);
  DDP_DISPATCH(x.device(), add_bias_rows, x, bias, out);
  return out;
}

Tensor relu(const Tensor& x) {
  check_float("relu", x);
  if (widen_on_cpu({&x})) return narrowed(relu(widened(x)), x.dtype());
  Tensor out = like(x);
  DDP_DISPATCH(x.device(), relu, x, out);
  return out;
}

Tensor relu_backward(const Tensor& grad, const Tensor& x) {
  check_same_device("relu_backward", {&grad, &x});
  check_same_shape("relu_backward", grad, x);
  check_float("relu_backward", grad, "grad");
  check_float("relu_backward", x);
  DDP_CHECK(grad.dtype() == x.dtype(), "relu_backward: grad {} and input {} must share a dtype",
            dtype_name(grad.dtype()), dtype_name(x.dtype()));
  if (widen_on_cpu({&x})) return narrowed(relu_backward(widened(grad), widened(x)), x.dtype());
  Tensor out = like(x);
  DDP_DISPATCH(x.device(), relu_backward, grad, x, out);
  return out;
}

Tensor unary(kernels::UnaryOp op, const Tensor& x) {
  check_float("unary", x);
  if (widen_on_cpu({&x})) return narrowed(unary(op, widened(x)), x.dtype());
  Tensor out = like(x);
  if (out.numel() > 0) DDP_DISPATCH(x.device(), unary, op, x, out);
  return out;
}

Tensor unary_backward(kernels::UnaryOp op, const Tensor& grad, const Tensor& x) {
  check_same_device("unary_backward", {&grad, &x});
  check_same_shape("unary_backward", grad, x);
  check_float("unary_backward", x);
  DDP_CHECK(grad.dtype() == x.dtype(), "unary_backward: grad {} and input {} must share a dtype",
            dtype_name(grad.dtype()), dtype_name(x.dtype()));
  if (widen_on_cpu({&x})) {
    return narrowed(unary_backward(op, widened(grad), widened(x)), x.dtype());
  }
  Tensor out = like(x);
  if (out.numel() > 0) DDP_DISPATCH(x.device(), unary_backward, op, grad, x, out);
  return out;
}

Tensor bce_with_logits(const Tensor& logits, const Tensor& targets) {
  return binary_op("binary_cross_entropy_with_logits", kernels::BinaryOp::bce_logits, logits,
                   targets);
}

Tensor bce_with_logits_grad(const Tensor& logits, const Tensor& targets) {
  return binary_op("binary_cross_entropy_with_logits_backward", kernels::BinaryOp::bce_logits_grad,
                   logits, targets);
}

Tensor sum(const Tensor& x) {
  check_float("sum", x);
  if (widen_on_cpu({&x})) return sum(widened(x));
  Tensor out = empty({}, {.dtype = DType::f32, .device = x.device()});
  DDP_DISPATCH(x.device(), sum_all, x, out);
  return out;
}

Tensor sum(const Tensor& x, int64_t dim, bool keepdim) {
  check_float("sum", x);
  if (widen_on_cpu({&x})) return sum(widened(x), dim, keepdim);
  const DimView v = view_along(x, wrap_dim("sum", x, dim), keepdim);
  Tensor out = empty(v.out_shape, {.dtype = DType::f32, .device = x.device()});
  DDP_DISPATCH(x.device(), sum_dim, x, v.outer, v.n, v.inner, out);
  return out;
}

Tensor mean(const Tensor& x) {
  DDP_CHECK(x.numel() > 0, "mean of an empty tensor (shape {}) is undefined", shape_str(x.shape()));
  return scale(sum(x), 1.0f / static_cast<float>(x.numel()));
}

Tensor mean(const Tensor& x, int64_t dim, bool keepdim) {
  const int64_t n = x.size(dim);
  DDP_CHECK(n > 0, "mean along dim {} of size 0 (shape {}) is undefined", dim,
            shape_str(x.shape()));
  return scale(sum(x, dim, keepdim), 1.0f / static_cast<float>(n));
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  check_float("argmax", x);
  // Widening is exact and keeps the order: 16-bit logits (an evaluation under
  // autocast) get the f32 kernel's answer on every device.
  if (is_16bit(x.dtype())) return argmax(widened(x), dim, keepdim);
  const int64_t d = wrap_dim("argmax", x, dim);
  DDP_CHECK(x.size(d) > 0, "argmax along dim {} of size 0 (shape {})", dim, shape_str(x.shape()));
  const DimView v = view_along(x, d, keepdim);
  Tensor out = empty(v.out_shape, {.dtype = DType::i64, .device = x.device()});
  DDP_DISPATCH(x.device(), argmax_dim, x, v.outer, v.n, v.inner, out);
  return out;
}

namespace {
void check_xent_inputs(std::string_view op, const Tensor& logits, const Tensor& labels) {
  check_dtype(op, labels, DType::i64, "labels");
  DDP_CHECK(logits.dim() == 2 && labels.dim() == 1 && labels.size(0) == logits.size(0),
            "{}: expected logits [N, C] and labels [N], got {} and {}", op,
            shape_str(logits.shape()), shape_str(labels.shape()));
}
void check_grad_loss(std::string_view op, const Tensor& grad_loss) {
  check_dtype(op, grad_loss, DType::f32, "grad_loss");
  DDP_CHECK(grad_loss.numel() == 1, "{}: grad_loss must be a scalar, got shape {}", op,
            shape_str(grad_loss.shape()));
}
}  // namespace

CrossEntropyResult softmax_cross_entropy(const Tensor& logits, const Tensor& labels) {
  check_same_device("softmax_cross_entropy", {&logits, &labels});
  check_float("cross_entropy", logits, "logits");
  check_xent_inputs("cross_entropy", logits, labels);
  DDP_CHECK(logits.size(0) > 0 && logits.size(1) > 0, "cross_entropy: empty logits {}",
            shape_str(logits.shape()));
  CrossEntropyResult r{empty({}, {.device = logits.device()}), Tensor(), Tensor()};
  if (is_16bit(logits.dtype())) {  // Note [fused classifier]
    r.lse = empty({logits.size(0)}, {.device = logits.device()});
    DDP_DISPATCH(logits.device(), softmax_xent_lse_forward, logits, labels, r.loss, r.lse);
    return r;
  }
  r.probs = like(logits);
  DDP_DISPATCH(logits.device(), softmax_xent_forward, logits, labels, r.loss, r.probs);
  return r;
}

Tensor softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels,
                                      const Tensor& grad_loss, bool overwrite) {
  check_same_device("softmax_cross_entropy_backward", {&probs, &labels, &grad_loss});
  check_dtype("cross_entropy_backward", probs, DType::f32, "probs");
  check_xent_inputs("cross_entropy_backward", probs, labels);
  check_grad_loss("cross_entropy_backward", grad_loss);
  // Note [classifier gradient in place]: each element is read, then written, by one thread.
  // A new tensor over the same memory: the result carries none of probs' autograd state.
  Tensor out = overwrite ? probs.flat_view(0, probs.shape()) : like(probs);
  DDP_DISPATCH(probs.device(), softmax_xent_backward, probs, labels, grad_loss, out);
  return out;
}

Tensor softmax_cross_entropy_backward_from_logits(const Tensor& logits, const Tensor& lse,
                                                  const Tensor& labels, const Tensor& grad_loss,
                                                  bool overwrite) {
  constexpr std::string_view op = "cross_entropy_backward";
  check_same_device(op, {&logits, &lse, &labels, &grad_loss});
  check_float(op, logits, "logits");
  check_xent_inputs(op, logits, labels);
  check_grad_loss(op, grad_loss);
  check_dtype(op, lse, DType::f32, "lse");
  DDP_CHECK(lse.shape() == Shape{logits.size(0)},
            "{}: lse has shape {}, expected [{}]; pass the forward's CrossEntropyResult", op,
            shape_str(lse.shape()), logits.size(0));
  Tensor out = overwrite ? logits.flat_view(0, logits.shape()) : like(logits);
  if (out.numel() > 0) {
    DDP_DISPATCH(logits.device(), softmax_xent_lse_backward, logits, lse, labels, grad_loss, out);
  }
  return out;
}

namespace {
// torch's checked conversion of a fill value (c10::checked_convert, "value cannot be
// converted to type uint8_t without overflow"): a value outside the dtype's range is
// refused, not converted (a double out of an integer's range converts undefined: 300
// became 44 in u8, 3e9 -2147483648 in i32). Infinities and NaN fill the float dtypes;
// a fraction truncates toward zero in the integer ones, as torch's.
void check_fill_value(const Tensor& t, double value) {
  const DType d = t.dtype();
  if (is_floating(d)) {
    const double max = d == DType::f32    ? static_cast<double>(std::numeric_limits<float>::max())
                       : d == DType::bf16 ? 3.3895313892515355e38  // bf16 0x7f7f
                                          : 65504.0;               // f16 0x7bff
    DDP_CHECK(!std::isfinite(value) || std::fabs(value) <= max,
              "fill: value {} is out of the range of {} (-{} to {}, or inf, -inf, nan) for a "
              "tensor of shape {}; {}",
              value, dtype_name(d), max, max, shape_str(t.shape()),
              d == DType::f32 ? "use a value in range" : "use f32 or a value in range");
    return;
  }
  // Bounds the truncated value must lie strictly within (exact in double).
  double below = -1.0, above = 256.0;  // u8
  const char* range = "0 to 255";
  if (d == DType::i32) {
    below = -2147483649.0, above = 2147483648.0, range = "-2147483648 to 2147483647";
  } else if (d == DType::i64) {  // the doubles next to -2^63 (exclusive) and 2^63
    below = -9223372036854777856.0, above = 9223372036854775808.0;
    range = "-9223372036854775808 to 9223372036854775807";
  }
  DDP_CHECK(value > below && value < above,
            "fill: value {} is out of the range of {} ({}) for a tensor of shape {}; use a wider "
            "dtype or a value in range",
            value, dtype_name(d), range, shape_str(t.shape()));
}
}  // namespace

void fill_(Tensor& t, double value) {
  check_fill_value(t, value);
  t.storage()->bump_version();  // Note [version counter]
  if (t.numel() == 0) return;
  DDP_DISPATCH(t.device(), fill, t, value);
}

Tensor cast(const Tensor& x, DType dtype) {
  Tensor out = empty(x.shape(), {.dtype = dtype, .device = x.device()});
  if (x.numel() > 0) DDP_DISPATCH(x.device(), cast, x, out);
  return out;
}

}  // namespace ddp
