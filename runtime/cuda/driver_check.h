// Why CUDA is unavailable, in words a user can act on: the text of
// cuda_api::unavailable_reason(). Pure (no CUDA headers), so it is unit-tested
// on machines without a driver; cuda_api.cpp fills in the facts.
#pragma once

#include <optional>
#include <string>

namespace ddp::cuda_api {

// A CUDA version as the runtime encodes it (1000 * major + 10 * minor): 12040 -> "12.4".
std::string cuda_version_string(int version);
// The oldest Linux driver branch that runs a CUDA major version: 13.x -> "R580",
// 12.x -> "R525", 11.x -> "R450"; "" when this table does not know it.
std::string minimum_driver_branch(int runtime_version);

enum class CudaProblem {
  no_driver,        // no libcuda.so.1 (cudaDriverGetVersion gives 0)
  driver_too_old,   // the driver supports an older CUDA than this build's
  no_device,        // a driver, but no GPU visible
  compat_mismatch,  // a forward-compatibility libcuda that does not fit the GPU or kernel driver
  other,
};

struct CudaStartup {
  CudaProblem problem = CudaProblem::other;
  std::string error;       // "cudaErrorInsufficientDriver: CUDA driver version is insufficient ..."
  int driver_version = 0;  // cudaDriverGetVersion: the newest CUDA the driver supports; 0 = none
  int runtime_version = 0;                     // CUDART_VERSION of this build
  std::optional<std::string> visible_devices;  // CUDA_VISIBLE_DEVICES, if set
};

// One paragraph: what is wrong (versions formatted as 12.4), what this build
// needs (CUDA X.Y, driver branch), and the fix.
std::string describe(const CudaStartup& s);

}  // namespace ddp::cuda_api
