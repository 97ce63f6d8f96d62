// The one dispatch point of every op: device, shape and dtype checks, output
// allocation on the inputs' device, then the CPU or CUDA kernel.
#include "runtime/ops/ops.h"

#include "runtime/memory/allocator.h"
#include "runtime/ops/dispatch.h"
#include "runtime/ops/kernels.h"

namespace ddp {

namespace ops_detail {
void check_dtype(std::string_view op, const Tensor& t, DType expected, const char* what) {
  DDP_CHECK(t.dtype() == expected,
            "{}: {} must have dtype {}, got {} (shape {}); convert with cast()", op, what,
            dtype_name(expected), dtype_name(t.dtype()), shape_str(t.shape()));
}
}  // namespace ops_detail

namespace {

using ops_detail::check_dtype;

void check_f32(std::string_view op, const Tensor& t) {
  check_dtype(op, t, DType::f32, "input");
}

Tensor like(const Tensor& t) {
  return empty(t.shape(), {.dtype = t.dtype(), .device = t.device()});
}

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
  check_same_device({&a, &b});
  check_same_shape(op, a, b);
  check_f32(op, a);
  check_f32(op, b);
  Tensor out = like(a);
  DDP_DISPATCH(a.device(), binary, kind, a, b, out);
  return out;
}

}  // namespace

void check_same_device(std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = *tensors.begin();
  for (const Tensor* t : tensors) {
    DDP_CHECK(t->defined(), "an op received an undefined tensor");
    if (t->device() != first->device()) {
      throw DeviceError(
          fmt::format("Expected all tensors to be on the same device, but found at least two "
                      "devices, {} and {}!",
                      first->device().str(), t->device().str()));
    }
  }
}

void check_same_shape(std::string_view op, const Tensor& a, const Tensor& b) {
  DDP_CHECK(a.shape() == b.shape(), "{}: shapes {} and {} must be equal", op, shape_str(a.shape()),
            shape_str(b.shape()));
}

void matmul_out(const Tensor& a, const Tensor& b, Tensor& out, const MatmulOptions& o) {
  check_same_device({&a, &b, &out});
  DDP_CHECK(a.dim() == 2 && b.dim() == 2, "matmul: both operands must be 2-D, got shapes {} and {}",
            shape_str(a.shape()), shape_str(b.shape()));
  DDP_CHECK(a.dtype() == b.dtype() && a.dtype() == out.dtype(),
            "matmul: dtypes must match, got {}, {} and out {}", dtype_name(a.dtype()),
            dtype_name(b.dtype()), dtype_name(out.dtype()));
  DDP_CHECK(is_floating(a.dtype()), "matmul: dtype {} not supported (f32, bf16, f16)",
            dtype_name(a.dtype()));
  const int64_t m = o.trans_a ? a.size(1) : a.size(0), ka = o.trans_a ? a.size(0) : a.size(1);
  const int64_t kb = o.trans_b ? b.size(1) : b.size(0), n = o.trans_b ? b.size(0) : b.size(1);
  DDP_CHECK(ka == kb, "matmul: shapes {}{} and {}{} cannot be multiplied ({}x{} and {}x{})",
            shape_str(a.shape()), o.trans_a ? "^T" : "", shape_str(b.shape()),
            o.trans_b ? "^T" : "", m, ka, kb, n);
  DDP_CHECK(out.shape() == (Shape{m, n}), "matmul: out has shape {}, expected [{}, {}]",
            shape_str(out.shape()), m, n);
  DDP_DISPATCH(a.device(), gemm, a, b, out, o.trans_a, o.trans_b, o.alpha, o.beta);
}

Tensor matmul(const Tensor& a, const Tensor& b, const MatmulOptions& options) {
  check_same_device({&a, &b});
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
  check_f32("scale", a);
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
  check_same_device({&x, &y});
  check_same_shape("axpy_", x, y);
  check_f32("axpy_", x);
  check_f32("axpy_", y);
  DDP_DISPATCH(x.device(), axpy, alpha, x, y);
}

Tensor add_bias_rows(const Tensor& x, const Tensor& bias) {
  check_same_device({&x, &bias});
  check_f32("add_bias_rows", x);
  check_f32("add_bias_rows", bias);
  DDP_CHECK(x.dim() == 2 && bias.dim() == 1 && bias.size(0) == x.size(1),
            "add_bias_rows: expected x [rows, cols] and bias [cols], got {} and {}",
            shape_str(x.shape()), shape_str(bias.shape()));
  Tensor out = like(x);
  DDP_DISPATCH(x.device(), add_bias_rows, x, bias, out);
  return out;
}

Tensor relu(const Tensor& x) {
  check_f32("relu", x);
  Tensor out = like(x);
  DDP_DISPATCH(x.device(), relu, x, out);
  return out;
}

Tensor relu_backward(const Tensor& grad, const Tensor& x) {
  check_same_device({&grad, &x});
  check_same_shape("relu_backward", grad, x);
  check_f32("relu_backward", grad);
  check_f32("relu_backward", x);
  Tensor out = like(x);
  DDP_DISPATCH(x.device(), relu_backward, grad, x, out);
  return out;
}

Tensor sum(const Tensor& x) {
  check_f32("sum", x);
  Tensor out = empty({}, {.dtype = DType::f32, .device = x.device()});
  DDP_DISPATCH(x.device(), sum_all, x, out);
  return out;
}

Tensor sum(const Tensor& x, int64_t dim, bool keepdim) {
  check_f32("sum", x);
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
  check_f32("argmax", x);
  const int64_t d = wrap_dim("argmax", x, dim);
  DDP_CHECK(x.size(d) > 0, "argmax along dim {} of size 0 (shape {})", dim, shape_str(x.shape()));
  const DimView v = view_along(x, d, keepdim);
  Tensor out = empty(v.out_shape, {.dtype = DType::i64, .device = x.device()});
  DDP_DISPATCH(x.device(), argmax_dim, x, v.outer, v.n, v.inner, out);
  return out;
}

CrossEntropyResult softmax_cross_entropy(const Tensor& logits, const Tensor& labels) {
  check_same_device({&logits, &labels});
  check_dtype("cross_entropy", logits, DType::f32, "logits");
  check_dtype("cross_entropy", labels, DType::i64, "labels");
  DDP_CHECK(logits.dim() == 2 && labels.dim() == 1 && labels.size(0) == logits.size(0),
            "cross_entropy: expected logits [N, C] and labels [N], got {} and {}",
            shape_str(logits.shape()), shape_str(labels.shape()));
  DDP_CHECK(logits.size(0) > 0 && logits.size(1) > 0, "cross_entropy: empty logits {}",
            shape_str(logits.shape()));
  CrossEntropyResult r{empty({}, {.device = logits.device()}), like(logits)};
  DDP_DISPATCH(logits.device(), softmax_xent_forward, logits, labels, r.loss, r.probs);
  return r;
}

Tensor softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels,
                                      const Tensor& grad_loss) {
  check_same_device({&probs, &labels, &grad_loss});
  check_dtype("cross_entropy_backward", probs, DType::f32, "probs");
  check_dtype("cross_entropy_backward", labels, DType::i64, "labels");
  check_dtype("cross_entropy_backward", grad_loss, DType::f32, "grad_loss");
  DDP_CHECK(
      probs.dim() == 2 && labels.dim() == 1 && labels.size(0) == probs.size(0) &&
          grad_loss.numel() == 1,
      "cross_entropy_backward: expected probs [N, C], labels [N] and a scalar grad, got {}, {} "
      "and {}",
      shape_str(probs.shape()), shape_str(labels.shape()), shape_str(grad_loss.shape()));
  Tensor out = like(probs);
  DDP_DISPATCH(probs.device(), softmax_xent_backward, probs, labels, grad_loss, out);
  return out;
}

void fill_(Tensor& t, double value) {
  if (t.numel() == 0) return;
  DDP_DISPATCH(t.device(), fill, t, value);
}

Tensor cast(const Tensor& x, DType dtype) {
  Tensor out = empty(x.shape(), {.dtype = dtype, .device = x.device()});
  if (x.numel() > 0) DDP_DISPATCH(x.device(), cast, x, out);
  return out;
}

}  // namespace ddp
