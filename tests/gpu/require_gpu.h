// The skip every gpu test starts with: without a CUDA device the test is reported
// as skipped with the reason (the driver's error, or "this build has no CUDA"),
// never as passed (ctest's SKIP_REGULAR_EXPRESSION, tests/CMakeLists.txt).
#pragma once

#include "runtime/cuda/cuda_api.h"
#include "runtime/device.h"

#include <gtest/gtest.h>

#define DDP_REQUIRE_CUDA()                               \
  if (::ddp::device_count(::ddp::DeviceType::cuda) == 0) \
  GTEST_SKIP() << "no CUDA device: " << ::ddp::unavailable_reason(::ddp::DeviceType::cuda)

// For a test of what the emulated CUDA device (Note [emulated CUDA device] in
// runtime/cuda/emu/kernel_emu.h) cannot show: streams that overlap, time, CUDA graphs,
// cuBLASLt or cuDNN. There it skips, saying why; on a GPU it runs.
#define DDP_REQUIRE_REAL_CUDA(why) \
  DDP_REQUIRE_CUDA();              \
  if (::ddp::cuda_api::emulated()) \
  GTEST_SKIP() << "the CUDA device is emulated on the CPU, and this test needs " << (why)

namespace ddp::gpu_test {

// The device the gpu tests run on (one definition for the unity build: Note [unity
// test builds] in tests/CMakeLists.txt).
inline const Device kGpu = Device::cuda(0);

}  // namespace ddp::gpu_test
