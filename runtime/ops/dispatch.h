// Internal to runtime/ops: the device switch and the checks every op entry point
// shares (ops.cpp, nn_ops.cpp).
#pragma once

#include "runtime/ops/kernels.h"
#include "runtime/planted_fault.h"
#include "runtime/profile.h"

#include <initializer_list>
#include <string_view>

// Calls kernels::cpu::NAME or kernels::cuda::NAME for `device`, as one op of the op
// profile (Note [op profile] in runtime/profile.h), where a planted fault may hit it
// (Note [planted faults] in runtime/planted_fault.h). `device` and the arguments are
// evaluated three times (the profile and the fault read them too): pass names, not expressions with
// side effects or a cost (x.contiguous()).
#define DDP_DISPATCH(device, name, ...)                                           \
  do {                                                                            \
    const ::ddp::profile::Scope ddp_profile_scope_(#name, (device), __VA_ARGS__); \
    switch ((device).type) {                                                      \
      case ::ddp::DeviceType::cpu:                                                \
        ::ddp::kernels::cpu::name(__VA_ARGS__);                                   \
        break;                                                                    \
      case ::ddp::DeviceType::cuda:                                               \
        ::ddp::kernels::cuda::name(__VA_ARGS__);                                  \
        break;                                                                    \
      case ::ddp::DeviceType::mps:                                                \
        ::ddp::check_available(device);                                           \
        DDP_ASSERT(false, "no mps kernels for " #name);                           \
    }                                                                             \
    ::ddp::planted_fault::after(#name, (device), __VA_ARGS__);                    \
  } while (0)

namespace ddp::ops_detail {

inline bool is_16bit(DType d) {
  return d == DType::bf16 || d == DType::f16;
}
// ValueError unless t is f32, bf16 or f16 (naming op, the role `what`, dtype and shape).
void check_float(std::string_view op, const Tensor& t, const char* what = "input");
// PyTorch's promotion among the float dtypes: equal dtypes stay, others give f32.
DType promote(DType a, DType b);
// Note [16-bit on the cpu] (ops.cpp): widened(t) is t as f32 (a copy for 16-bit t),
// narrowed(t, d) is t rounded to d (t itself when it has d already), and
// widen_on_cpu says whether any of the tensors is a 16-bit CPU tensor.
Tensor widened(const Tensor& t);
Tensor narrowed(const Tensor& t, DType dtype);
bool widen_on_cpu(std::initializer_list<const Tensor*> tensors);

// ValueError naming the op, the tensor's role, the dtypes and its shape.
void check_dtype(std::string_view op, const Tensor& t, DType expected, const char* what);
inline void check_f32(std::string_view op, const Tensor& t, const char* what = "input") {
  check_dtype(op, t, DType::f32, what);
}

// A new (uninitialized) tensor of t's shape, dtype and device.
inline Tensor like(const Tensor& t) {
  return empty(t.shape(), {.dtype = t.dtype(), .device = t.device()});
}

}  // namespace ddp::ops_detail
