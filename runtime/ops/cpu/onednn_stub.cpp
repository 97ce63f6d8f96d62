// A build without oneDNN: CPU convolutions run as im2col + OpenBLAS
// (autograd/functions.cpp, Note [conv per image]); nothing here is called.
#include "runtime/ops/cpu/onednn.h"

#include "runtime/error.h"

namespace ddp::kernels::cpu::onednn {

bool available() {
  return false;
}

std::string version() {
  return "";
}

void set_bf16(bool on) {
  DDP_ASSERT(!on, "set_bf16: this build has no oneDNN");
}

bool bf16() {
  return false;
}

bool bf16_native() {
  return false;
}

bool bf16_primitives() {
  return false;
}

void force_bf16_rounding(bool) {}

std::string isa_name() {
  return "";
}

void matmul_bf16(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                 int64_t, float, float*, int64_t) {
  DDP_ASSERT(false, "matmul_bf16: this build has no oneDNN");
}

bool sgemm_preferred(int64_t, int64_t, int64_t) {
  return false;
}

void sgemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
           int64_t, float, float*, int64_t) {
  DDP_ASSERT(false, "sgemm: this build has no oneDNN");
}

void conv2d_forward(const Tensor&, const Tensor&, const Tensor&, const Conv2dGeometry&, Tensor&) {
  DDP_ASSERT(false, "conv2d_forward: this build has no oneDNN");
}

void conv2d_backward_data(const Tensor&, const Tensor&, const Conv2dGeometry&, Tensor&) {
  DDP_ASSERT(false, "conv2d_backward_data: this build has no oneDNN");
}

void conv2d_backward_weights(const Tensor&, const Tensor&, const Conv2dGeometry&, Tensor&,
                             Tensor&) {
  DDP_ASSERT(false, "conv2d_backward_weights: this build has no oneDNN");
}

}  // namespace ddp::kernels::cpu::onednn
