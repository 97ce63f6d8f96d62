// BareCublas in a build without CUDA: nothing to compare with.
#include "bench/gemm_cublas.h"

#include "runtime/error.h"

namespace ddp::bench {

BareCublas::BareCublas(const Device& device) {
  throw DeviceError(fmt::format(
      "bench gemm on {}: this build has no CUDA, so there is no cuBLAS to compare with. "
      "Configure with -DDDP_CUDA=ON on a machine with the CUDA toolkit, or use --device cpu.",
      device.str()));
}

BareCublas::~BareCublas() = default;

void BareCublas::sgemm(const GemmDims&, const float*, const float*, float*) {
  throw DeviceError("BareCublas::sgemm: this build has no CUDA");
}

}  // namespace ddp::bench
