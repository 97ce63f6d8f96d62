// The layer and optimizer CUDA kernels of a build without CUDA. The ops reach them
// only for a cuda tensor, which such a build cannot create, so each names itself
// and the fix.
#include "runtime/ops/kernels.h"

#define DDP_NO_CUDA_NN_KERNEL(op)                                                     \
  throw ::ddp::DeviceError(op                                                         \
                           ": this build of ddp has no CUDA support (configure with " \
                           "-DDDP_CUDA=ON)")

namespace ddp::kernels::cuda {

void im2col(const Tensor&, const Conv2dGeometry&, Tensor&) {
  DDP_NO_CUDA_NN_KERNEL("im2col");
}
void col2im(const Tensor&, const Conv2dGeometry&, Tensor&) {
  DDP_NO_CUDA_NN_KERNEL("col2im");
}
void permute4(const Tensor&, const std::array<int, 4>&, Tensor&) {
  DDP_NO_CUDA_NN_KERNEL("permute4");
}
void max_pool2d(const Tensor&, const Conv2dGeometry&, Tensor&, Tensor&) {
  DDP_NO_CUDA_NN_KERNEL("max_pool2d");
}
void max_pool2d_backward(const Tensor&, const Tensor&, const Conv2dGeometry&, Tensor&) {
  DDP_NO_CUDA_NN_KERNEL("max_pool2d_backward");
}
void dropout_mask(Tensor&, uint64_t, uint64_t, float) {
  DDP_NO_CUDA_NN_KERNEL("dropout_mask");
}
void sgd_update(Tensor&, const Tensor&, Tensor&, const SgdStep&) {
  DDP_NO_CUDA_NN_KERNEL("sgd_update");
}
void adamw_update(Tensor&, const Tensor&, Tensor&, Tensor&, const AdamWStep&) {
  DDP_NO_CUDA_NN_KERNEL("adamw_update");
}
void sum_squares_multi(const std::vector<Tensor>&, Tensor&) {
  DDP_NO_CUDA_NN_KERNEL("sum_squares_multi");
}
void clip_factor(const Tensor&, double, Tensor&) {
  DDP_NO_CUDA_NN_KERNEL("clip_factor");
}
void scale_by_multi(const std::vector<Tensor>&, const Tensor&) {
  DDP_NO_CUDA_NN_KERNEL("scale_by_multi");
}
void adamw_update_multi(std::vector<Tensor>&, const std::vector<Tensor>&, std::vector<Tensor>&,
                        std::vector<Tensor>&, const std::vector<AdamWStep>&, const Tensor&,
                        const Tensor&) {
  DDP_NO_CUDA_NN_KERNEL("adamw_update_multi");
}

}  // namespace ddp::kernels::cuda
