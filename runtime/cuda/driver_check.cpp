#include "runtime/cuda/driver_check.h"

#include "runtime/fmt.h"

namespace ddp::cuda_api {

std::string cuda_version_string(int version) {
  return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

std::string minimum_driver_branch(int runtime_version) {
  // NVIDIA's CUDA release notes, "minimum required driver version" (Linux):
  // minor-version compatibility lets every 1x.y run on the 1x.0 branch.
  switch (runtime_version / 1000) {
    case 11:
      return "R450";
    case 12:
      return "R525";
    case 13:
      return "R580";
    default:
      return "";
  }
}

namespace {

std::string build_needs(int runtime_version) {
  const std::string branch = minimum_driver_branch(runtime_version);
  const std::string cuda = cuda_version_string(runtime_version);
  if (branch.empty()) return fmt::format("CUDA {}, which needs a driver for CUDA {}", cuda, cuda);
  return fmt::format("CUDA {}, which needs NVIDIA driver {} or newer", cuda, branch);
}

}  // namespace

std::string describe(const CudaStartup& s) {
  const std::string needs = build_needs(s.runtime_version);
  const std::string cpu = "; without a GPU, use --device cpu";
  switch (s.problem) {
    case CudaProblem::no_driver:
      return fmt::format(
          "no NVIDIA driver on this machine (cudaGetDeviceCount: {}). This build of ddp uses {}. "
          "Install the driver{}",
          s.error, needs, cpu);
    case CudaProblem::driver_too_old:
      return fmt::format(
          "the NVIDIA driver supports CUDA up to {} (cudaDriverGetVersion {}), but this build of "
          "ddp uses {} (cudaGetDeviceCount: {}). Update the driver, or build ddp with the CUDA "
          "toolkit that matches it (cmake -DCMAKE_CUDA_COMPILER=/usr/local/cuda-{}/bin/nvcc){}",
          cuda_version_string(s.driver_version), s.driver_version, needs, s.error,
          cuda_version_string(s.driver_version), cpu);
    case CudaProblem::no_device:
      return fmt::format(
          "the NVIDIA driver (CUDA {}) sees no GPU (cudaGetDeviceCount: {}). Check nvidia-smi{}{}",
          cuda_version_string(s.driver_version), s.error,
          s.visible_devices
              ? fmt::format(" and CUDA_VISIBLE_DEVICES (set to '{}')", *s.visible_devices)
              : std::string(),
          cpu);
    case CudaProblem::compat_mismatch:
      return fmt::format(
          "the CUDA forward-compatibility driver (a cuda-compat libcuda.so on LD_LIBRARY_PATH, "
          "CUDA {}) does not fit this GPU or its kernel driver (cudaGetDeviceCount: {}). Remove "
          "the cuda-compat folder from LD_LIBRARY_PATH, or update the NVIDIA driver; this build "
          "uses {}{}",
          cuda_version_string(s.driver_version), s.error, needs, cpu);
    case CudaProblem::other:
      break;
  }
  return fmt::format("cudaGetDeviceCount: {} (driver supports CUDA {}; this build uses {}){}",
                     s.error, cuda_version_string(s.driver_version), needs, cpu);
}

}  // namespace ddp::cuda_api
