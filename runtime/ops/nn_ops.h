// Layer and optimizer ops of the model zoo: convolution as im2col + GEMM, max
// pooling, dropout masks and fused SGD / AdamW steps. Like ops.h, every op checks
// that its tensors share one device, checks shapes and dtypes (naming the op and
// the shapes), allocates its output there and runs the CPU or CUDA kernel on the
// device's current stream (no synchronization). All arithmetic is f32.
#pragma once

#include "runtime/ops/kernels.h"
#include "runtime/tensor.h"

#include <array>
#include <cstdint>
#include <string>

namespace ddp {

// The geometry of a window of `kernel` {h, w} moved by `stride` over x [N, C, H, W]
// zero-padded by `padding` on each side. Throws ValueError (naming the shape and the
// parameters) unless x is 4-D f32, kernel and stride >= 1, padding >= 0 and the
// window fits at least once: out_h = (H + 2 pad_h - kernel_h) / stride_h + 1 >= 1.
kernels::Conv2dGeometry conv_geometry(const Tensor& x, std::array<int64_t, 2> kernel,
                                      std::array<int64_t, 2> stride,
                                      std::array<int64_t, 2> padding);
// Square kernel, stride and padding.
kernels::Conv2dGeometry conv_geometry(const Tensor& x, int64_t kernel, int64_t stride,
                                      int64_t padding);

// x [N, C, H, W] -> cols [N * out_h * out_w, C * kernel_h * kernel_w]: row (n, oh, ow),
// column (c, kh, kw), zero padding. A convolution is then
// matmul(cols, weight.reshape({C_out, -1}), {.trans_b = true}) -> [N * out_h * out_w, C_out].
Tensor im2col(const Tensor& x, const kernels::Conv2dGeometry& geometry);
// The adjoint of im2col: a new [N, C, H, W] summing the entries that read each pixel.
Tensor col2im(const Tensor& cols, const kernels::Conv2dGeometry& geometry);
// out.shape[i] = x.shape[perm[i]] (torch.permute, materialized); x 4-D of any dtype.
// E.g. [N, out_h, out_w, C_out] -> [N, C_out, out_h, out_w] is perm {0, 3, 1, 2}.
Tensor permute4(const Tensor& x, std::array<int, 4> perm);

// CPU convolutions through oneDNN (Note [oneDNN convolutions] in ops/cpu/onednn_conv.cpp),
// the alternative to im2col + GEMM. onednn_convolutions() is true when the build has
// oneDNN and DDP_ONEDNN is not 0; the three ops below throw otherwise. x [N, C, H, W],
// weight [C_out, C, kh, kw], bias [C_out] or undefined, all f32 on the CPU.
bool onednn_convolutions();
// "2.6.3", or "" in a build without oneDNN.
std::string onednn_version();
// Whether an f32 matmul on the CPU with output [m, n] and inner dimension k runs on
// oneDNN's sgemm (else OpenBLAS's): Note [gemm choice] in ops/cpu/onednn.cpp.
bool onednn_gemm(int64_t m, int64_t n, int64_t k);
// A new [N, C_out, out_h, out_w] = conv(x, weight) + bias.
Tensor conv2d_onednn(const Tensor& x, const Tensor& weight, const Tensor& bias,
                     const kernels::Conv2dGeometry& geometry);
// A new [N, C, H, W]: the gradient of conv2d_onednn with respect to x for grad_y.
Tensor conv2d_backward_input_onednn(const Tensor& grad_y, const Tensor& weight,
                                    const kernels::Conv2dGeometry& geometry);
// Note [cpu bf16] (ops/cpu/onednn.cpp): CpuPrecision::bf16 makes the f32 matmuls of
// matmul()/matmul_out() and the convolutions on the CPU multiply in bf16 (operands
// rounded to bf16, products summed in f32, results f32; weights and activations
// stay f32), as torch.autocast("cpu", dtype=torch.bfloat16) computes linear and
// conv layers; attention's batched products stay f32. Process-wide; CUDA is
// unaffected. Needs oneDNN (ValueError otherwise) and, unless allow_emulation (for
// tests), a CPU with AVX512_BF16 (DeviceError naming the ISA).
enum class CpuPrecision { f32, bf16 };
void set_cpu_precision(CpuPrecision precision, bool allow_emulation = false);
CpuPrecision cpu_precision();
// The CPU multiplies bf16 natively (AVX512_BF16), as oneDNN sees it; false without oneDNN.
bool cpu_has_bf16();

struct Conv2dParamGrads {
  Tensor weight;  // [C_out, C, kh, kw]
  Tensor bias;    // [C_out], undefined unless asked for
};
// The gradients of conv2d_onednn with respect to the weight (of shape weight_shape)
// and, when with_bias, the bias: written into `into`'s tensors where defined (a
// gradient destination, Note [gradient destinations]; overwritten), else new.
Conv2dParamGrads conv2d_backward_params_onednn(const Tensor& grad_y, const Tensor& x,
                                               const Shape& weight_shape,
                                               const kernels::Conv2dGeometry& geometry,
                                               bool with_bias, Conv2dParamGrads into = {});

struct MaxPoolResult {
  Tensor out;      // [N, C, out_h, out_w] f32
  Tensor indices;  // same shape, i64: h * W + w of the (first) maximum within its (n, c) plane
};
// Padding (at most half the kernel, as in PyTorch) never wins; NaN propagates.
MaxPoolResult max_pool2d(const Tensor& x, const kernels::Conv2dGeometry& geometry);
// A new [N, C, H, W]: grad_out summed into the pixels named by indices. Out-of-range
// indices throw on the CPU and are ignored on CUDA (checking there needs a host sync).
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices,
                           const kernels::Conv2dGeometry& geometry);

// A new f32 tensor of `shape` on `device`: element i is 1 / (1 - p) where the i-th
// Philox uniform of (seed, offset) is >= p, else 0 -- the draws of
// rand(shape, seed, {.device = device}, offset). p in [0, 1). The next draw of the
// stream should start at offset + rng::philox_counters(numel) (Note [rng stream]).
Tensor dropout_mask(const Shape& shape, uint64_t seed, uint64_t offset, float p,
                    const Device& device);

// One torch.optim.SGD step (dampening 0) in place, see kernels::SgdStep. param, grad
// and buf are f32 of one shape on one device; buf may be undefined when momentum == 0.
void sgd_update_(Tensor& param, const Tensor& grad, Tensor& buf, const kernels::SgdStep& step);
// One torch.optim.AdamW step in place, see kernels::AdamWStep (step >= 1 counts the
// steps taken, this one included). param, grad, m and v are f32 of one shape.
void adamw_update_(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                   const kernels::AdamWStep& step);

}  // namespace ddp
