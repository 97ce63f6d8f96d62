// The fused attention of a build without CUDA or without cuDNN's headers: it never
// runs (transformer_ops.cpp keeps the packed kernels).
#include "runtime/ops/cuda/sdpa_cudnn.h"

namespace ddp::kernels::cuda {

bool fused_attention_forward(const Tensor&, int64_t, Tensor&, Tensor&, std::string* why) {
  if (why != nullptr) *why = "this build has no cuDNN (its headers were not found at build time)";
  return false;
}

bool fused_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                              Tensor&, std::string* why) {
  if (why != nullptr) *why = "this build has no cuDNN (its headers were not found at build time)";
  return false;
}

}  // namespace ddp::kernels::cuda
