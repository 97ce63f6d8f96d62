// The CUDA entries of the transformer ops (GELU, LayerNorm, embedding, softmax,
// bmm, causal softmax), compiled in every build until their kernels are written:
// each names itself and says to run on the CPU, rather than leaving a cuda tensor with a wrong
// result.
#include "runtime/ops/kernels.h"

#define DDP_PENDING_CUDA_KERNEL(op)                                                  \
  throw ::ddp::DeviceError(op                                                        \
                           ": not implemented on cuda yet (the transformer ops run " \
                           "on the CPU only for now); move the tensors to the CPU with .cpu()")

namespace ddp::kernels::cuda {

void gelu(const Tensor&, Tensor&) {
  DDP_PENDING_CUDA_KERNEL("gelu");
}
void gelu_backward(const Tensor&, const Tensor&, Tensor&) {
  DDP_PENDING_CUDA_KERNEL("gelu_backward");
}
void layer_norm(const Tensor&, const Tensor&, const Tensor&, float, Tensor&, Tensor&, Tensor&) {
  DDP_PENDING_CUDA_KERNEL("layer_norm");
}
void layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         Tensor&, Tensor&, Tensor&) {
  DDP_PENDING_CUDA_KERNEL("layer_norm_backward");
}
void embedding(const Tensor&, const Tensor&, Tensor&) {
  DDP_PENDING_CUDA_KERNEL("embedding");
}
void embedding_backward(const Tensor&, const Tensor&, Tensor&) {
  DDP_PENDING_CUDA_KERNEL("embedding_backward");
}
void softmax(const Tensor&, bool, Tensor&) {
  DDP_PENDING_CUDA_KERNEL("softmax");
}
void softmax_backward(const Tensor&, const Tensor&, bool, Tensor&) {
  DDP_PENDING_CUDA_KERNEL("softmax_backward");
}

void bmm(const Tensor&, const Tensor&, Tensor&, bool, bool, float) {
  DDP_PENDING_CUDA_KERNEL("bmm");
}
void causal_softmax(const Tensor&, Tensor&) {
  DDP_PENDING_CUDA_KERNEL("causal_softmax");
}

void attention_forward(const Tensor&, int64_t, Tensor&, Tensor&) {
  DDP_PENDING_CUDA_KERNEL("attention_forward");
}
void attention_backward(const Tensor&, const Tensor&, const Tensor&, int64_t, Tensor&) {
  DDP_PENDING_CUDA_KERNEL("attention_backward");
}
void sum_squares(const Tensor&, Tensor&) {
  DDP_PENDING_CUDA_KERNEL("sum_squares");
}

}  // namespace ddp::kernels::cuda
