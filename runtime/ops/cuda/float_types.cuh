// The float element types of the CUDA kernels (internal; .cu files only): f32,
// bf16 and f16 loaded as float and stored with one round to nearest even, and the
// switch from a DType to the device type.
//
//   dispatch_float(x.dtype(), [&](auto tag) {
//     using T = typename decltype(tag)::type;   // float, __nv_bfloat16 or __half
//     ... ptr<const T>(x) ...
//   });
#pragma once

#include "runtime/dtype.h"
#include "runtime/error.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace ddp::kernels::cuda::detail {

template <typename T>
struct Tag {
  using type = T;
};

template <typename T>
__host__ __device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(v);
  } else {
    static_assert(std::is_same_v<T, float>, "to_float: float, __nv_bfloat16 or __half");
    return v;
  }
}

template <typename T>
__host__ __device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else {
    static_assert(std::is_same_v<T, float>, "from_float: float, __nv_bfloat16 or __half");
    return v;
  }
}

// Calls fn(Tag<T>{}) with T the device type of a float dtype (f32, bf16, f16).
template <typename Fn>
void dispatch_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(Tag<float>{});
    case DType::bf16:
      return fn(Tag<__nv_bfloat16>{});
    case DType::f16:
      return fn(Tag<__half>{});
    default:
      break;
  }
  DDP_ASSERT(false, "a float kernel reached with dtype {}", dtype_name(dtype));
}

}  // namespace ddp::kernels::cuda::detail
