// The words of cuda_api::unavailable_reason() (runtime/cuda/driver_check.h):
// versions as 12.4, the driver branch this build needs and the fix, for each
// way CUDA can be missing.
#include "runtime/cuda/driver_check.h"
#include "runtime/cuda/cuda_api.h"

#include <gtest/gtest.h>

#include <string>

namespace ddp::cuda_api {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(DriverCheck, FormatsVersionsAsMajorDotMinor) {
  EXPECT_EQ(cuda_version_string(12040), "12.4");
  EXPECT_EQ(cuda_version_string(13000), "13.0");
  EXPECT_EQ(cuda_version_string(12010), "12.1");
  EXPECT_EQ(cuda_version_string(11080), "11.8");
  EXPECT_EQ(cuda_version_string(12090), "12.9");
}

TEST(DriverCheck, DriverBranchPerCudaMajor) {
  EXPECT_EQ(minimum_driver_branch(13000), "R580");
  EXPECT_EQ(minimum_driver_branch(13020), "R580");
  EXPECT_EQ(minimum_driver_branch(12040), "R525");
  EXPECT_EQ(minimum_driver_branch(11080), "R450");
  EXPECT_EQ(minimum_driver_branch(99000), "");
}

TEST(DriverCheck, DriverTooOldSaysBothVersionsAndTheFix) {
  const std::string text =
      describe({.problem = CudaProblem::driver_too_old,
                .error = "cudaErrorInsufficientDriver: CUDA driver version is insufficient",
                .driver_version = 12040,
                .runtime_version = 13000,
                .visible_devices = std::nullopt});
  EXPECT_TRUE(contains(text,
                       "the NVIDIA driver supports CUDA up to 12.4 (cudaDriverGetVersion "
                       "12040), but this build of ddp uses CUDA 13.0, which needs NVIDIA "
                       "driver R580 or newer"))
      << text;
  EXPECT_TRUE(contains(text, "Update the driver")) << text;
  EXPECT_TRUE(contains(text, "-DCMAKE_CUDA_COMPILER=/usr/local/cuda-12.4/bin/nvcc")) << text;
  EXPECT_TRUE(contains(text, "cudaErrorInsufficientDriver")) << text;
}

TEST(DriverCheck, NoDriverNoDeviceAndCompat) {
  const std::string none = describe({.problem = CudaProblem::no_driver,
                                     .error = "e",
                                     .driver_version = 0,
                                     .runtime_version = 13000,
                                     .visible_devices = std::nullopt});
  EXPECT_TRUE(contains(none, "no NVIDIA driver on this machine")) << none;
  EXPECT_TRUE(contains(none, "R580")) << none;
  EXPECT_TRUE(contains(none, "--device cpu")) << none;

  const std::string no_gpu = describe({.problem = CudaProblem::no_device,
                                       .error = "cudaErrorNoDevice: no CUDA-capable device",
                                       .driver_version = 13000,
                                       .runtime_version = 13000,
                                       .visible_devices = ""});
  EXPECT_TRUE(contains(no_gpu, "sees no GPU")) << no_gpu;
  EXPECT_TRUE(contains(no_gpu, "CUDA_VISIBLE_DEVICES (set to '')")) << no_gpu;

  const std::string compat = describe({.problem = CudaProblem::compat_mismatch,
                                       .error = "cudaErrorCompatNotSupportedOnDevice",
                                       .driver_version = 13000,
                                       .runtime_version = 13000,
                                       .visible_devices = std::nullopt});
  EXPECT_TRUE(contains(compat, "cuda-compat")) << compat;
}

TEST(DriverCheck, UnavailableReasonOfThisMachine) {
  if (device_count() > 0) GTEST_SKIP() << "this machine has a GPU: there is no reason to check";
  const std::string reason = unavailable_reason();
  if (!compiled()) {
    EXPECT_TRUE(contains(reason, "no CUDA support")) << reason;
    return;
  }
  if (emulated()) {  // Note [emulated CUDA device]: the build says how to turn it on
    EXPECT_TRUE(contains(reason, "set DDP_CUDA_EMULATION=N")) << reason;
    return;
  }
  // A CUDA build without a usable GPU explains which case this is.
  EXPECT_TRUE(contains(reason, "build of ddp uses CUDA") || contains(reason, "sees no GPU"))
      << reason;
}

}  // namespace
}  // namespace ddp::cuda_api
