// CPU convolutions through oneDNN (Note [oneDNN convolutions] in onednn_conv.cpp),
// and its sgemm for the GEMM shapes where it beats OpenBLAS's (Note [gemm choice]).
// CMake compiles onednn.cpp and onednn_conv.cpp when it finds oneDNN
// (DDP_HAVE_ONEDNN), else onednn_stub.cpp, where available() is false and the rest
// are never called.
// Only runtime/ops calls these: the checked entry points are in nn_ops.h.
#pragma once

#include "runtime/ops/kernels.h"

#include <cstdint>
#include <string>

namespace ddp::kernels::cpu::onednn {

// The build has oneDNN and DDP_ONEDNN is not 0 (read once).
bool available();
// oneDNN's version, e.g. "2.6.3"; "" in a build without it.
std::string version();

// Note [cpu bf16]: while on, f32 matmuls and convolutions on the CPU multiply in
// bf16 (operands rounded to bf16 as they are staged, products accumulated in f32,
// results f32), as torch.autocast(cpu, bfloat16) computes them. Process-wide.
void set_bf16(bool on);
bool bf16();
// The CPU has AVX512_BF16 (oneDNN's effective ISA avx512_core_bf16 or newer); without
// it oneDNN still runs bf16 primitives on avx512_core, emulated and slower.
bool bf16_native();
// Whether oneDNN makes bf16 primitives here (avx512_core and newer; on an AVX2-only CPU
// oneDNN 2.6 makes none). Where it does not, the bf16 precision rounds both operands to
// bf16 values held in f32 and multiplies those with the f32 primitives: the same
// products (a product of two bf16 values is exact in f32), summed in f32.
bool bf16_primitives();
// For tests: take that rounding path even where bf16 primitives run (false: as the CPU
// allows). Process-wide.
void force_bf16_rounding(bool on);
// oneDNN's name for the ISA it dispatches to here, e.g. "avx512_core_bf16", "avx2".
std::string isa_name();

// Whether gemm() sends an f32 product of this shape (row-major C [m, n] = op(A) op(B),
// inner dimension k) to oneDNN's sgemm rather than OpenBLAS's (Note [gemm choice]).
bool sgemm_preferred(int64_t m, int64_t n, int64_t k);
// C = alpha op(A) op(B) + beta C, row-major, as cblas_sgemm with CblasRowMajor.
// matmul_bf16: the same product with A and B rounded to bf16 as they are staged,
// accumulated in f32 (oneDNN's matmul primitive; Note [cpu bf16]).
void matmul_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc);
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// All f32, contiguous, NCHW / OIHW, on the CPU; shapes checked by the caller.
// y [N, C_out, out_h, out_w] = conv(x, w) (+ b when defined).
void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dGeometry& g,
                    Tensor& y);
// grad_x [N, C, H, W] (overwritten) = the adjoint of conv(., w) applied to grad_y.
void conv2d_backward_data(const Tensor& grad_y, const Tensor& w, const Conv2dGeometry& g,
                          Tensor& grad_x);
// grad_w [C_out, C, kh, kw] and, when defined, grad_b [C_out] (both overwritten).
void conv2d_backward_weights(const Tensor& grad_y, const Tensor& x, const Conv2dGeometry& g,
                             Tensor& grad_w, Tensor& grad_b);

}  // namespace ddp::kernels::cpu::onednn
