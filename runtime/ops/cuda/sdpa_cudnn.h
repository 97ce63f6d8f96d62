// cuDNN's fused causal attention on the packed qkv (Note [fused attention] in
// ops/transformer_ops.h; the graphs in sdpa_graph.h). Internal to ops:
// transformer_ops.cpp calls it for 16-bit CUDA tensors and falls back to the packed
// kernels when it returns false. CMake compiles sdpa_cudnn.cpp where the CUDA
// toolkit has cuDNN's graph header, sdpa_cudnn_stub.cpp otherwise.
#pragma once

#include "runtime/tensor.h"

#include <string>

namespace ddp::kernels::cuda {

// y [B, T, C] (qkv's dtype) and stats [B, H, T, 1] (f32) from qkv [B, T, 3C], all on
// one CUDA device. Returns false, doing nothing, with the reason in *why when the
// fused attention cannot run here: no cuDNN, a GPU before sm_80, a head size that is
// not a multiple of 8 or above 128, misaligned data, or no cuDNN engine for the
// graph (cuDNN's message, with the shape). Throws CudaError when a plan that cuDNN
// accepted fails to execute.
bool fused_attention_forward(const Tensor& qkv, int64_t heads, Tensor& y, Tensor& stats,
                             std::string* why);

// grad_qkv [B, T, 3C] from grad_y, and the forward's qkv, y and stats. The same
// contract.
bool fused_attention_backward(const Tensor& grad_y, const Tensor& qkv, const Tensor& y,
                              const Tensor& stats, int64_t heads, Tensor& grad_qkv,
                              std::string* why);

}  // namespace ddp::kernels::cuda
