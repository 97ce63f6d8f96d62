// Internal to runtime/ops: the device switch and the checks every op entry point
// shares (ops.cpp, nn_ops.cpp).
#pragma once

#include "runtime/ops/kernels.h"

#include <string_view>

// Calls kernels::cpu::NAME or kernels::cuda::NAME for `device`.
#define DDP_DISPATCH(device, name, ...)                 \
  do {                                                  \
    switch ((device).type) {                            \
      case ::ddp::DeviceType::cpu:                      \
        ::ddp::kernels::cpu::name(__VA_ARGS__);         \
        break;                                          \
      case ::ddp::DeviceType::cuda:                     \
        ::ddp::kernels::cuda::name(__VA_ARGS__);        \
        break;                                          \
      case ::ddp::DeviceType::mps:                      \
        ::ddp::check_available(device);                 \
        DDP_ASSERT(false, "no mps kernels for " #name); \
    }                                                   \
  } while (0)

namespace ddp::ops_detail {

// ValueError naming the op, the tensor's role, the dtypes and its shape.
void check_dtype(std::string_view op, const Tensor& t, DType expected, const char* what);

}  // namespace ddp::ops_detail
