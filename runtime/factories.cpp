// Factories create the data on the target device: CUDA tensors are filled by
// kernels, never built on the host and copied.
#include "runtime/ops/kernels.h"
#include "runtime/ops/ops.h"
#include "runtime/profile.h"

#include <cmath>

namespace ddp {
namespace {

void check_shape(const char* op, const Shape& shape) {
  for (int64_t s : shape) {
    DDP_CHECK(s >= 0, "{}: negative dimension {} in shape {}", op, s, shape_str(shape));
  }
}

}  // namespace

Tensor empty(const Shape& shape, const TensorOptions& options) {
  check_shape("empty", shape);
  DDP_CHECK(!options.pinned || options.device.is_cpu(),
            "pinned memory is host memory: ask for device cpu with pinned, not {}",
            options.device.str());
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(
      options.device, shape_nbytes("empty", shape, options.dtype), options.pinned);
  impl->shape = shape;
  impl->dtype = options.dtype;
  return Tensor(std::move(impl));
}

Tensor full(const Shape& shape, double value, const TensorOptions& options) {
  Tensor t = empty(shape, options);
  fill_(t, value);
  t.storage()->restore_version(0);  // a new tensor (Note [version counter])
  return t;
}

Tensor zeros(const Shape& shape, const TensorOptions& options) {
  return full(shape, 0.0, options);
}
Tensor ones(const Shape& shape, const TensorOptions& options) {
  return full(shape, 1.0, options);
}

Tensor arange(int64_t n, const TensorOptions& options) {
  return arange(0.0, static_cast<double>(n), 1.0, options);
}

Tensor arange(double start, double end, double step, const TensorOptions& options) {
  DDP_CHECK(step != 0.0 && std::isfinite(step), "arange: step must be finite and non-zero, got {}",
            step);
  // As torch ("unsupported range: 0 -> inf", "invalid size, possible overflow?"): the
  // count must be a number an int64 holds, or converting it is undefined (it came out
  // as a "negative dimension -9223372036854775808" the caller never gave).
  DDP_CHECK(std::isfinite(start) && std::isfinite(end),
            "arange: start and end must be finite, got {} and {}", start, end);
  DDP_CHECK((end - start) / step >= 0.0,
            "arange: the range from {} to {} cannot be reached with step {}", start, end, step);
  const double count = std::ceil((end - start) / step);
  DDP_CHECK(count < 9223372036854775808.0,
            "arange: {} to {} with step {} is {} elements, more than a tensor can hold; use a "
            "larger step or a shorter range",
            start, end, step, count);
  const auto n = static_cast<int64_t>(count);
  Tensor t = empty({n}, options);
  if (n == 0) return t;
  const profile::Scope op_scope("arange", t.device(), t);
  if (t.device().is_cuda()) {
    kernels::cuda::arange(t, start, step);
  } else {
    kernels::cpu::arange(t, start, step);
  }
  return t;
}

namespace {

template <typename Fill>
Tensor random_tensor(const char* op, const Shape& shape, const TensorOptions& options, Fill fill) {
  DDP_CHECK(is_floating(options.dtype), "{}: dtype {} is not a floating type (f32, bf16, f16)", op,
            dtype_name(options.dtype));
  TensorOptions f32 = options;
  f32.dtype = DType::f32;
  Tensor t = empty(shape, f32);
  if (t.numel() > 0) {
    const profile::Scope op_scope(op, t.device(), t);
    fill(t);
  }
  return options.dtype == DType::f32 ? t : cast(t, options.dtype);
}

}  // namespace

Tensor rand(const Shape& shape, uint64_t seed, const TensorOptions& options, uint64_t offset) {
  return random_tensor("rand", shape, options, [&](Tensor& t) {
    if (t.device().is_cuda()) {
      kernels::cuda::fill_uniform(t, seed, offset);
    } else {
      kernels::cpu::fill_uniform(t, seed, offset);
    }
  });
}

Tensor randn(const Shape& shape, uint64_t seed, const TensorOptions& options, uint64_t offset) {
  return random_tensor("randn", shape, options, [&](Tensor& t) {
    if (t.device().is_cuda()) {
      kernels::cuda::fill_normal(t, seed, offset);
    } else {
      kernels::cpu::fill_normal(t, seed, offset);
    }
  });
}

}  // namespace ddp
