// The CUDA kernels of a build without CUDA. The ops reach them only for a cuda
// tensor, which such a build cannot create, so each just names itself and the fix.
#include "runtime/ops/kernels.h"

#define DDP_NO_CUDA_KERNEL(op)                                                        \
  throw ::ddp::DeviceError(op                                                         \
                           ": this build of ddp has no CUDA support (configure with " \
                           "-DDDP_CUDA=ON)")

namespace ddp::kernels::cuda {

void gemm(const Tensor&, const Tensor&, Tensor&, bool, bool, float, float) {
  DDP_NO_CUDA_KERNEL("gemm");
}
void binary(BinaryOp, const Tensor&, const Tensor&, Tensor&) {
  DDP_NO_CUDA_KERNEL("binary");
}
void scale(const Tensor&, float, Tensor&) {
  DDP_NO_CUDA_KERNEL("scale");
}
void broadcast_scalar(const Tensor&, Tensor&) {
  DDP_NO_CUDA_KERNEL("broadcast_scalar");
}
void axpy(float, const Tensor&, Tensor&) {
  DDP_NO_CUDA_KERNEL("axpy");
}
void add_bias_rows(const Tensor&, const Tensor&, Tensor&) {
  DDP_NO_CUDA_KERNEL("add_bias_rows");
}
void unary(UnaryOp, const Tensor&, Tensor&) {
  DDP_NO_CUDA_KERNEL("unary");
}
void unary_backward(UnaryOp, const Tensor&, const Tensor&, Tensor&) {
  DDP_NO_CUDA_KERNEL("unary_backward");
}
void relu(const Tensor&, Tensor&) {
  DDP_NO_CUDA_KERNEL("relu");
}
void relu_backward(const Tensor&, const Tensor&, Tensor&) {
  DDP_NO_CUDA_KERNEL("relu_backward");
}
void sum_all(const Tensor&, Tensor&) {
  DDP_NO_CUDA_KERNEL("sum_all");
}
void sum_dim(const Tensor&, int64_t, int64_t, int64_t, Tensor&) {
  DDP_NO_CUDA_KERNEL("sum_dim");
}
void argmax_dim(const Tensor&, int64_t, int64_t, int64_t, Tensor&) {
  DDP_NO_CUDA_KERNEL("argmax_dim");
}
void softmax_xent_forward(const Tensor&, const Tensor&, Tensor&, Tensor&) {
  DDP_NO_CUDA_KERNEL("softmax_xent_forward");
}
void softmax_xent_backward(const Tensor&, const Tensor&, const Tensor&, Tensor&) {
  DDP_NO_CUDA_KERNEL("softmax_xent_backward");
}
void softmax_xent_lse_forward(const Tensor&, const Tensor&, Tensor&, Tensor&) {
  DDP_NO_CUDA_KERNEL("softmax_xent_lse_forward");
}
void softmax_xent_lse_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               Tensor&) {
  DDP_NO_CUDA_KERNEL("softmax_xent_lse_backward");
}
void fill(Tensor&, double) {
  DDP_NO_CUDA_KERNEL("fill");
}
void cast(const Tensor&, Tensor&) {
  DDP_NO_CUDA_KERNEL("cast");
}
void arange(Tensor&, double, double) {
  DDP_NO_CUDA_KERNEL("arange");
}
void fill_uniform(Tensor&, uint64_t, uint64_t) {
  DDP_NO_CUDA_KERNEL("fill_uniform");
}
void fill_normal(Tensor&, uint64_t, uint64_t) {
  DDP_NO_CUDA_KERNEL("fill_normal");
}

// The layer and optimizer kernels have their stubs in nn_kernels_stub.cpp.

}  // namespace ddp::kernels::cuda
