// The checked entry points of the layer and optimizer ops: device, geometry, shape
// and dtype checks, output allocation on the inputs' device, then the CPU or CUDA
// kernel (ops/cpu/nn.cpp, ops/cuda/nn.cu).
#include "runtime/ops/nn_ops.h"

#include "runtime/ops/cpu/onednn.h"
#include "runtime/ops/dispatch.h"

#include "runtime/ops/ops.h"

#include <string>
#include <string_view>

namespace ddp {
namespace {

using kernels::Conv2dGeometry;

using ops_detail::check_dtype;
using ops_detail::check_f32;

std::string geometry_str(const Conv2dGeometry& g) {
  return fmt::format("kernel [{}, {}], stride [{}, {}], padding [{}, {}]", g.kernel_h, g.kernel_w,
                     g.stride_h, g.stride_w, g.pad_h, g.pad_w);
}

Shape input_shape(const Conv2dGeometry& g) {
  return {g.n, g.c, g.h, g.w};
}
Shape pooled_shape(const Conv2dGeometry& g) {
  return {g.n, g.c, g.out_h(), g.out_w()};
}

// Throws unless the window of `g` is well formed and fits the input at least once.
// (out_h() alone cannot tell: C++ division rounds -1 / 2 up to 0, giving out_h 1.)
void check_geometry(std::string_view op, const Conv2dGeometry& g) {
  const Shape input = input_shape(g);
  DDP_CHECK(g.kernel_h >= 1 && g.kernel_w >= 1 && g.stride_h >= 1 && g.stride_w >= 1 &&
                g.pad_h >= 0 && g.pad_w >= 0,
            "{}: invalid window {} for input {}: kernel and stride must be >= 1, padding >= 0", op,
            geometry_str(g), shape_str(input));
  DDP_CHECK(g.n >= 0 && g.c >= 0 && g.h >= 0 && g.w >= 0,
            "{}: invalid input shape {} in the geometry", op, shape_str(input));
  DDP_CHECK(g.h + 2 * g.pad_h >= g.kernel_h && g.w + 2 * g.pad_w >= g.kernel_w,
            "{}: the window ({}) does not fit input {}: needs H + 2 * pad_h >= kernel_h and "
            "W + 2 * pad_w >= kernel_w, got {} and {}; use a smaller kernel, more padding or a "
            "larger input",
            op, geometry_str(g), shape_str(input), g.h + 2 * g.pad_h, g.w + 2 * g.pad_w);
}

// x must be the [N, C, H, W] input that `g` was made for.
void check_input(std::string_view op, const Tensor& x, const Conv2dGeometry& g, const char* what) {
  check_geometry(op, g);
  DDP_CHECK(x.shape() == input_shape(g),
            "{}: {} has shape {}, but the geometry ({}) is for input {}; make it with "
            "conv_geometry(x, ...)",
            op, what, shape_str(x.shape()), geometry_str(g), shape_str(input_shape(g)));
}

void check_shape(std::string_view op, const Tensor& t, const Shape& expected, const char* what,
                 const Conv2dGeometry& g) {
  DDP_CHECK(t.shape() == expected, "{}: {} has shape {}, expected {} for input {} and {}", op, what,
            shape_str(t.shape()), shape_str(expected), shape_str(input_shape(g)), geometry_str(g));
}

Tensor empty_f32(const Shape& shape, const Device& device) {
  return empty(shape, {.dtype = DType::f32, .device = device});
}

}  // namespace

kernels::Conv2dGeometry conv_geometry(const Tensor& x, std::array<int64_t, 2> kernel,
                                      std::array<int64_t, 2> stride,
                                      std::array<int64_t, 2> padding) {
  DDP_CHECK(x.defined(), "conv_geometry: the input is an undefined tensor");
  DDP_CHECK(x.dim() == 4, "conv_geometry: expected an input [N, C, H, W], got shape {}",
            shape_str(x.shape()));
  check_f32("conv_geometry", x, "input");
  const Conv2dGeometry g{.n = x.size(0),
                         .c = x.size(1),
                         .h = x.size(2),
                         .w = x.size(3),
                         .kernel_h = kernel[0],
                         .kernel_w = kernel[1],
                         .stride_h = stride[0],
                         .stride_w = stride[1],
                         .pad_h = padding[0],
                         .pad_w = padding[1]};
  check_geometry("conv_geometry", g);
  return g;
}

kernels::Conv2dGeometry conv_geometry(const Tensor& x, int64_t kernel, int64_t stride,
                                      int64_t padding) {
  return conv_geometry(x, {kernel, kernel}, {stride, stride}, {padding, padding});
}

Tensor im2col(const Tensor& x, const Conv2dGeometry& g) {
  check_same_device("im2col", {&x});
  check_f32("im2col", x, "input");
  check_input("im2col", x, g, "input");
  Tensor cols = empty_f32({g.n * g.out_h() * g.out_w(), g.c * g.kernel_h * g.kernel_w}, x.device());
  if (cols.numel() > 0) DDP_DISPATCH(x.device(), im2col, x, g, cols);
  return cols;
}

Tensor col2im(const Tensor& cols, const Conv2dGeometry& g) {
  check_same_device("col2im", {&cols});
  check_f32("col2im", cols, "cols");
  check_geometry("col2im", g);
  check_shape("col2im", cols, {g.n * g.out_h() * g.out_w(), g.c * g.kernel_h * g.kernel_w}, "cols",
              g);
  Tensor grad_x = empty_f32(input_shape(g), cols.device());
  if (grad_x.numel() > 0) DDP_DISPATCH(cols.device(), col2im, cols, g, grad_x);
  return grad_x;
}

Tensor permute4(const Tensor& x, std::array<int, 4> perm) {
  check_same_device("permute4", {&x});
  DDP_CHECK(x.dim() == 4, "permute4: expected a 4-D input, got shape {}", shape_str(x.shape()));
  bool seen[4] = {false, false, false, false};
  for (int p : perm) {
    DDP_CHECK(p >= 0 && p < 4 && !seen[p],
              "permute4: perm [{}, {}, {}, {}] is not a permutation of [0, 1, 2, 3] (input {})",
              perm[0], perm[1], perm[2], perm[3], shape_str(x.shape()));
    seen[p] = true;
  }
  Shape shape(4);
  for (size_t i = 0; i < 4; ++i) shape[i] = x.size(perm[i]);
  Tensor out = empty(shape, {.dtype = x.dtype(), .device = x.device()});
  if (out.numel() > 0) DDP_DISPATCH(x.device(), permute4, x, perm, out);
  return out;
}

bool onednn_convolutions() {
  return kernels::cpu::onednn::available();
}

std::string onednn_version() {
  return kernels::cpu::onednn::version();
}

void set_cpu_precision(CpuPrecision precision, bool allow_emulation) {
  if (precision == CpuPrecision::f32) {
    if (onednn_convolutions()) kernels::cpu::onednn::set_bf16(false);
    return;
  }
  DDP_CHECK(onednn_convolutions(), "bf16 precision on the CPU runs through oneDNN, {}",
            kernels::cpu::onednn::version().empty()
                ? "which this build does not have; install libdnnl-dev and rebuild "
                  "(deploy/install-deps.sh), or use f32 (train --precision fp32)"
                : "which DDP_ONEDNN=0 turned off; unset it, or use f32 (train --precision fp32)");
  if (!cpu_has_bf16() && !allow_emulation) {
    throw DeviceError(fmt::format(
        "bf16 precision needs a CPU with AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4 or "
        "newer); this CPU's best ISA for oneDNN is {}, where bf16 would only be emulated and "
        "slower than f32. Use f32 (train --precision fp32)",
        kernels::cpu::onednn::isa_name()));
  }
  kernels::cpu::onednn::set_bf16(true);
}

CpuPrecision cpu_precision() {
  return kernels::cpu::onednn::bf16() ? CpuPrecision::bf16 : CpuPrecision::f32;
}

bool cpu_has_bf16() {
  return onednn_convolutions() && kernels::cpu::onednn::bf16_native();
}

bool onednn_gemm(int64_t m, int64_t n, int64_t k) {
  return kernels::cpu::onednn::sgemm_preferred(m, n, k);
}

namespace {

// The checks the three oneDNN convolution ops share: CPU f32 tensors, oneDNN on,
// grad_or_y [N, C_out, out_h, out_w] when given, weight [C_out, C, kh, kw].
void check_onednn_conv(std::string_view op, const Tensor& t, const Shape& weight_shape,
                       const Conv2dGeometry& g) {
  DDP_CHECK(onednn_convolutions(),
            "{}: this build has no oneDNN, or DDP_ONEDNN=0 turned it off; use the im2col path "
            "(functional::conv2d chooses it by itself)",
            op);
  DDP_CHECK(t.device().is_cpu(), "{}: oneDNN convolutions run on the CPU, got a tensor on {}", op,
            t.device().str());
  check_f32(op, t, "input");
  check_geometry(op, g);
  const Shape expected{weight_shape.at(0), g.c, g.kernel_h, g.kernel_w};
  DDP_CHECK(weight_shape == expected, "{}: weight shape {} does not match input {} and {}", op,
            shape_str(weight_shape), shape_str(input_shape(g)), geometry_str(g));
}

Shape conv_out_shape(const Conv2dGeometry& g, int64_t c_out) {
  return {g.n, c_out, g.out_h(), g.out_w()};
}

}  // namespace

Tensor conv2d_onednn(const Tensor& x, const Tensor& weight, const Tensor& bias,
                     const Conv2dGeometry& g) {
  if (bias.defined()) {
    check_same_device("conv2d_onednn", {&x, &weight, &bias});
  } else {
    check_same_device("conv2d_onednn", {&x, &weight});
  }
  check_onednn_conv("conv2d_onednn", x, weight.shape(), g);
  check_input("conv2d_onednn", x, g, "input");
  check_f32("conv2d_onednn", weight, "weight");
  const int64_t c_out = weight.size(0);
  if (bias.defined()) {
    check_f32("conv2d_onednn", bias, "bias");
    check_shape("conv2d_onednn", bias, {c_out}, "bias", g);
  }
  Tensor y = empty_f32(conv_out_shape(g, c_out), x.device());
  if (x.numel() > 0 && y.numel() > 0) {
    const profile::Scope op_scope("conv2d_onednn", x.device(), x, weight, y);
    kernels::cpu::onednn::conv2d_forward(x, weight, bias, g, y);
  } else if (y.numel() > 0) {  // no input channels: the bias alone, as PyTorch gives
    ddp::fill_(y, 0.0);
    if (bias.defined()) {
      const int64_t oh = g.out_h(), ow = g.out_w();
      y = permute4(add_bias_rows(zeros({g.n * oh * ow, c_out}, {.device = x.device()}), bias)
                       .reshape({g.n, oh, ow, c_out}),
                   {0, 3, 1, 2});
    }
  }
  return y;
}

Tensor conv2d_backward_input_onednn(const Tensor& grad_y, const Tensor& weight,
                                    const Conv2dGeometry& g) {
  check_same_device("conv2d_backward_input_onednn", {&grad_y, &weight});
  check_onednn_conv("conv2d_backward_input_onednn", grad_y, weight.shape(), g);
  check_f32("conv2d_backward_input_onednn", weight, "weight");
  check_shape("conv2d_backward_input_onednn", grad_y, conv_out_shape(g, weight.size(0)), "grad_y",
              g);
  Tensor grad_x = empty_f32(input_shape(g), grad_y.device());
  if (grad_y.numel() > 0 && grad_x.numel() > 0) {
    const profile::Scope op_scope("conv2d_backward_input_onednn", grad_y.device(), grad_y, weight);
    kernels::cpu::onednn::conv2d_backward_data(grad_y, weight, g, grad_x);
  } else if (grad_x.numel() > 0) {  // no output channels: nothing flows back
    ddp::fill_(grad_x, 0.0);
  }
  return grad_x;
}

Conv2dParamGrads conv2d_backward_params_onednn(const Tensor& grad_y, const Tensor& x,
                                               const Shape& weight_shape, const Conv2dGeometry& g,
                                               bool with_bias, Conv2dParamGrads into) {
  const char* op = "conv2d_backward_params_onednn";
  check_same_device(op, {&grad_y, &x});
  check_onednn_conv(op, x, weight_shape, g);
  check_input(op, x, g, "input");
  check_f32(op, grad_y, "grad_y");
  check_shape(op, grad_y, conv_out_shape(g, weight_shape.at(0)), "grad_y", g);
  // An empty batch or image runs no primitive: its gradients are zeros.
  const bool empty_input = x.numel() == 0 || grad_y.numel() == 0;
  const auto destination = [&](Tensor& t, const Shape& shape, const char* what) {
    if (t.defined()) {
      check_same_device(op, {&x, &t});
      check_f32(op, t, what);
      check_shape(op, t, shape, what, g);
      if (empty_input) ddp::fill_(t, 0.0);
    } else {
      const TensorOptions f32{.dtype = DType::f32, .device = x.device()};
      t = empty_input ? zeros(shape, f32) : empty(shape, f32);
    }
  };
  destination(into.weight, weight_shape, "weight gradient");
  if (with_bias) {
    destination(into.bias, {weight_shape.at(0)}, "bias gradient");
  } else {
    into.bias = Tensor();
  }
  if (!empty_input) {
    const profile::Scope op_scope("conv2d_backward_params_onednn", x.device(), grad_y, x);
    kernels::cpu::onednn::conv2d_backward_weights(grad_y, x, g, into.weight, into.bias);
  }
  return into;
}

MaxPoolResult max_pool2d(const Tensor& x, const Conv2dGeometry& g) {
  check_same_device("max_pool2d", {&x});
  check_f32("max_pool2d", x, "input");
  check_input("max_pool2d", x, g, "input");
  DDP_CHECK(2 * g.pad_h <= g.kernel_h && 2 * g.pad_w <= g.kernel_w,
            "max_pool2d: padding must be at most half the kernel, got {} for input {}",
            geometry_str(g), shape_str(x.shape()));
  MaxPoolResult r{empty_f32(pooled_shape(g), x.device()),
                  empty(pooled_shape(g), {.dtype = DType::i64, .device = x.device()})};
  if (r.out.numel() > 0) DDP_DISPATCH(x.device(), max_pool2d, x, g, r.out, r.indices);
  return r;
}

Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Conv2dGeometry& g) {
  check_same_device("max_pool2d_backward", {&grad_out, &indices});
  check_f32("max_pool2d_backward", grad_out, "grad_out");
  check_dtype("max_pool2d_backward", indices, DType::i64, "indices");
  check_geometry("max_pool2d_backward", g);
  check_shape("max_pool2d_backward", grad_out, pooled_shape(g), "grad_out", g);
  check_shape("max_pool2d_backward", indices, pooled_shape(g), "indices", g);
  Tensor grad_x = empty_f32(input_shape(g), grad_out.device());
  if (grad_x.numel() > 0) {
    DDP_DISPATCH(grad_out.device(), max_pool2d_backward, grad_out, indices, g, grad_x);
  }
  return grad_x;
}

Tensor dropout_mask(const Shape& shape, uint64_t seed, uint64_t offset, float p,
                    const Device& device) {
  DDP_CHECK(p >= 0.0f && p < 1.0f,
            "dropout_mask: p must be in [0, 1), got {} (p is the probability of dropping)", p);
  Tensor mask = empty_f32(shape, device);
  if (mask.numel() > 0) DDP_DISPATCH(device, dropout_mask, mask, seed, offset, p);
  return mask;
}

void sgd_update_(Tensor& param, const Tensor& grad, Tensor& buf, const kernels::SgdStep& s) {
  const bool momentum = s.momentum != 0.0f;
  if (momentum) {
    check_same_device("sgd_update_", {&param, &grad, &buf});
  } else {
    check_same_device("sgd_update_", {&param, &grad});
  }
  check_f32("sgd_update_", param, "param");
  check_f32("sgd_update_", grad, "grad");
  check_same_shape("sgd_update_", param, grad);
  if (momentum) {
    check_f32("sgd_update_", buf, "momentum buffer");
    check_same_shape("sgd_update_", param, buf);
  }
  DDP_CHECK(s.lr >= 0.0f && s.momentum >= 0.0f && s.weight_decay >= 0.0f,
            "sgd_update_: lr, momentum and weight_decay must be >= 0, got {}, {} and {}", s.lr,
            s.momentum, s.weight_decay);
  DDP_CHECK(!s.nesterov || momentum, "sgd_update_: nesterov needs momentum > 0, got momentum 0");
  param.storage()->bump_version();  // Note [version counter]
  if (momentum) buf.storage()->bump_version();
  if (param.numel() > 0) DDP_DISPATCH(param.device(), sgd_update, param, grad, buf, s);
}

void adamw_update_(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                   const kernels::AdamWStep& s) {
  check_same_device("adamw_update_", {&param, &grad, &m, &v});
  check_f32("adamw_update_", param, "param");
  check_f32("adamw_update_", grad, "grad");
  check_f32("adamw_update_", m, "m (first moment)");
  check_f32("adamw_update_", v, "v (second moment)");
  check_same_shape("adamw_update_", param, grad);
  check_same_shape("adamw_update_", param, m);
  check_same_shape("adamw_update_", param, v);
  DDP_CHECK(s.beta1 >= 0.0f && s.beta1 < 1.0f && s.beta2 >= 0.0f && s.beta2 < 1.0f,
            "adamw_update_: betas must be in [0, 1), got ({}, {})", s.beta1, s.beta2);
  DDP_CHECK(s.lr >= 0.0f && s.eps >= 0.0f && s.weight_decay >= 0.0f,
            "adamw_update_: lr, eps and weight_decay must be >= 0, got {}, {} and {}", s.lr, s.eps,
            s.weight_decay);
  DDP_CHECK(s.step >= 1,
            "adamw_update_: step counts the steps taken including this one (>= 1), got {}", s.step);
  for (Tensor* t : {&param, &m, &v}) t->storage()->bump_version();  // Note [version counter]
  if (param.numel() > 0) DDP_DISPATCH(param.device(), adamw_update, param, grad, m, v, s);
}

}  // namespace ddp
