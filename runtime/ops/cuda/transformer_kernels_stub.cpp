// The transformer CUDA kernels of a build without CUDA (the kernels are in
// transformer.cu, embedding.cu and attention.cu). The ops reach them only for a cuda
// tensor, which such a build cannot create, so each names itself and the fix.
#include "runtime/ops/kernels.h"

#define DDP_NO_CUDA_TRANSFORMER_KERNEL(op)                                            \
  throw ::ddp::DeviceError(op                                                         \
                           ": this build of ddp has no CUDA support (configure with " \
                           "-DDDP_CUDA=ON)")

namespace ddp::kernels::cuda {

void gelu(const Tensor&, Tensor&) {
  DDP_NO_CUDA_TRANSFORMER_KERNEL("gelu");
}
void gelu_backward(const Tensor&, const Tensor&, Tensor&) {
  DDP_NO_CUDA_TRANSFORMER_KERNEL("gelu_backward");
}
void layer_norm(const Tensor&, const Tensor&, const Tensor&, float, Tensor&, Tensor&, Tensor&) {
  DDP_NO_CUDA_TRANSFORMER_KERNEL("layer_norm");
}
void residual_layer_norm(const Tensor&, const Tensor&, const Tensor&, const Tensor&, float, Tensor&,
                         Tensor&, Tensor&, Tensor&) {
  DDP_NO_CUDA_TRANSFORMER_KERNEL("residual_layer_norm");
}
void layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         Tensor&, Tensor&, Tensor&, bool) {
  DDP_NO_CUDA_TRANSFORMER_KERNEL("layer_norm_backward");
}
void embedding(const Tensor&, const Tensor&, Tensor&) {
  DDP_NO_CUDA_TRANSFORMER_KERNEL("embedding");
}
void embedding_backward(const Tensor&, const Tensor&, Tensor&) {
  DDP_NO_CUDA_TRANSFORMER_KERNEL("embedding_backward");
}
void softmax(const Tensor&, bool, Tensor&) {
  DDP_NO_CUDA_TRANSFORMER_KERNEL("softmax");
}
void softmax_backward(const Tensor&, const Tensor&, bool, Tensor&) {
  DDP_NO_CUDA_TRANSFORMER_KERNEL("softmax_backward");
}
void bmm(const Tensor&, const Tensor&, Tensor&, bool, bool, float) {
  DDP_NO_CUDA_TRANSFORMER_KERNEL("bmm");
}
void causal_softmax(const Tensor&, Tensor&) {
  DDP_NO_CUDA_TRANSFORMER_KERNEL("causal_softmax");
}
void attention_forward(const Tensor&, int64_t, Tensor&, Tensor&) {
  DDP_NO_CUDA_TRANSFORMER_KERNEL("attention_forward");
}
void attention_backward(const Tensor&, const Tensor&, const Tensor&, int64_t, Tensor&) {
  DDP_NO_CUDA_TRANSFORMER_KERNEL("attention_backward");
}
void sum_squares(const Tensor&, Tensor&) {
  DDP_NO_CUDA_TRANSFORMER_KERNEL("sum_squares");
}

}  // namespace ddp::kernels::cuda
