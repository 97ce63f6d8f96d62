// The skip every gpu test starts with: without a CUDA device the test is reported
// as skipped with the reason (the driver's error, or "this build has no CUDA"),
// never as passed (ctest's SKIP_REGULAR_EXPRESSION, tests/CMakeLists.txt).
#pragma once

#include "runtime/device.h"

#include <gtest/gtest.h>

#define DDP_REQUIRE_CUDA()                               \
  if (::ddp::device_count(::ddp::DeviceType::cuda) == 0) \
  GTEST_SKIP() << "no CUDA device: " << ::ddp::unavailable_reason(::ddp::DeviceType::cuda)
