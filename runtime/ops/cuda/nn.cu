// CUDA kernels of the model zoo's layers and fused optimizer steps: one grid-stride
// functor per kernel (launch.cuh). Every thread writes its own output element; the
// adjoints (col2im, max_pool2d_backward) run one thread per input pixel that gathers
// from the windows covering it, so there are no atomics, results are deterministic
// and each pixel sums in the order the CPU kernels use (windows by (oh, ow)).
#include "runtime/ops/adamw_constants.h"
#include "runtime/ops/cuda/launch.cuh"
#include "runtime/ops/kernels.h"
#include "runtime/ops/mixed_math.h"
#include "runtime/rng/philox.h"

#include <cmath>

namespace ddp::kernels::cuda {
namespace {

using detail::for_each_index;
using detail::ptr;

// The window positions o in [begin, end) whose taps o * stride .. o * stride + kernel - 1
// include `pos` (a padded coordinate, >= 0).
struct Covering {
  int64_t begin, end;
};

__device__ __forceinline__ Covering covering(int64_t pos, int64_t kernel, int64_t stride,
                                             int64_t out_size) {
  const int64_t begin = pos < kernel ? 0 : (pos - kernel) / stride + 1;
  const int64_t end = pos / stride + 1;
  return {begin, end < out_size ? end : out_size};
}

// The first maximum wins; a NaN beats every number (as the CPU kernel).
__device__ __forceinline__ bool better(float candidate, float best) {
  return candidate > best || (isnan(candidate) && !isnan(best));
}

// Geometry plus the derived output size (Conv2dGeometry's methods are host-only).
struct Geometry {
  Conv2dGeometry g;
  int64_t out_h, out_w;
};

Geometry device_geometry(const Conv2dGeometry& g) {
  return {g, g.out_h(), g.out_w()};
}

// One thread per cols entry: row (n, oh, ow), column (c, kh, kw).
struct Im2colFn {
  const float* x;
  float* cols;
  Geometry geo;
  __device__ void operator()(int64_t i) const {
    const Conv2dGeometry& g = geo.g;
    const int64_t taps = g.kernel_h * g.kernel_w, row_len = g.c * taps;
    const int64_t row = i / row_len, col = i - row * row_len;
    const int64_t c = col / taps, kh = (col - c * taps) / g.kernel_w, kw = col % g.kernel_w;
    const int64_t ow = row % geo.out_w, oh = (row / geo.out_w) % geo.out_h;
    const int64_t n = row / (geo.out_w * geo.out_h);
    const int64_t ih = oh * g.stride_h - g.pad_h + kh, iw = ow * g.stride_w - g.pad_w + kw;
    const bool inside = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
    cols[i] = inside ? x[((n * g.c + c) * g.h + ih) * g.w + iw] : 0.0f;
  }
};

// One thread per input pixel (n, c, h, w), summing the cols entries that read it.
struct Col2imFn {
  const float* cols;
  float* grad_x;
  Geometry geo;
  __device__ void operator()(int64_t i) const {
    const Conv2dGeometry& g = geo.g;
    const int64_t w = i % g.w, h = (i / g.w) % g.h, nc = i / (g.w * g.h);
    const int64_t c = nc % g.c, n = nc / g.c;
    const int64_t taps = g.kernel_h * g.kernel_w, row_len = g.c * taps;
    const Covering rows = covering(h + g.pad_h, g.kernel_h, g.stride_h, geo.out_h);
    const Covering columns = covering(w + g.pad_w, g.kernel_w, g.stride_w, geo.out_w);
    float sum = 0.0f;
    for (int64_t oh = rows.begin; oh < rows.end; ++oh) {
      const int64_t kh = h + g.pad_h - oh * g.stride_h;
      for (int64_t ow = columns.begin; ow < columns.end; ++ow) {
        const int64_t kw = w + g.pad_w - ow * g.stride_w;
        const int64_t row = (n * geo.out_h + oh) * geo.out_w + ow;
        sum += cols[row * row_len + c * taps + kh * g.kernel_w + kw];
      }
    }
    grad_x[i] = sum;
  }
};

// One thread per output element; the input strides are listed in output order.
template <typename T>
struct PermuteFn {
  const T* x;
  T* out;
  int64_t size[4];
  int64_t stride[4];
  __device__ void operator()(int64_t i) const {
    int64_t rest = i, src = 0;
    for (int d = 3; d >= 0; --d) {
      src += (rest % size[d]) * stride[d];
      rest /= size[d];
    }
    out[i] = x[src];
  }
};

template <typename T>
void launch_permute(const Tensor& x, const std::array<int, 4>& perm, Tensor& out) {
  const Shape& s = x.shape();
  const int64_t in_stride[4] = {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1};
  PermuteFn<T> fn{ptr<const T>(x), ptr<T>(out), {}, {}};
  for (size_t d = 0; d < 4; ++d) {
    fn.size[d] = s[static_cast<size_t>(perm[d])];
    fn.stride[d] = in_stride[perm[d]];
  }
  for_each_index(out, out.numel(), fn, "permute4");
}

// One thread per output (plane, oh, ow); padding is never a candidate.
struct MaxPoolFn {
  const float* x;
  float* out;
  int64_t* indices;
  Geometry geo;
  __device__ void operator()(int64_t i) const {
    const Conv2dGeometry& g = geo.g;
    const int64_t ow = i % geo.out_w, oh = (i / geo.out_w) % geo.out_h;
    const int64_t plane = i / (geo.out_w * geo.out_h);
    const int64_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
    const int64_t h_begin = h0 > 0 ? h0 : 0, h_end = h0 + g.kernel_h < g.h ? h0 + g.kernel_h : g.h;
    const int64_t w_begin = w0 > 0 ? w0 : 0, w_end = w0 + g.kernel_w < g.w ? w0 + g.kernel_w : g.w;
    const float* src = x + plane * g.h * g.w;
    int64_t best_index = h_begin * g.w + w_begin;
    float best = src[best_index];
    for (int64_t h = h_begin; h < h_end; ++h) {
      for (int64_t w = w_begin; w < w_end; ++w) {
        if (better(src[h * g.w + w], best)) {
          best = src[h * g.w + w];
          best_index = h * g.w + w;
        }
      }
    }
    out[i] = best;
    indices[i] = best_index;
  }
};

// One thread per input pixel: the gradients of the windows covering it that chose it.
struct MaxPoolBackwardFn {
  const float* grad_out;
  const int64_t* indices;
  float* grad_x;
  Geometry geo;
  __device__ void operator()(int64_t i) const {
    const Conv2dGeometry& g = geo.g;
    const int64_t w = i % g.w, h = (i / g.w) % g.h, plane = i / (g.w * g.h);
    const int64_t self = h * g.w + w, first = plane * geo.out_h * geo.out_w;
    const Covering rows = covering(h + g.pad_h, g.kernel_h, g.stride_h, geo.out_h);
    const Covering columns = covering(w + g.pad_w, g.kernel_w, g.stride_w, geo.out_w);
    float sum = 0.0f;
    for (int64_t oh = rows.begin; oh < rows.end; ++oh) {
      for (int64_t ow = columns.begin; ow < columns.end; ++ow) {
        const int64_t o = first + oh * geo.out_w + ow;
        if (indices[o] == self) sum += grad_out[o];
      }
    }
    grad_x[i] = sum;
  }
};

// Note [rng stream] in rng/philox.h: thread g thresholds the four uniforms of counter
// offset + g, exactly the draws of fill_uniform.
struct DropoutMaskFn {
  float* mask;
  int64_t n;
  uint64_t seed, offset;
  float p, keep_scale;
  __device__ void operator()(int64_t g) const {
    const rng::Philox4 block = rng::philox_block(seed, offset + static_cast<uint64_t>(g));
    for (int j = 0; j < 4 && 4 * g + j < n; ++j) {
      mask[4 * g + j] = rng::uniform_from_word(block.v[j]) >= p ? keep_scale : 0.0f;
    }
  }
};

struct SgdFn {
  float* param;
  const float* grad;
  float* buf;  // null when momentum == 0
  SgdStep s;
  __device__ void operator()(int64_t i) const {
    float d = grad[i] + s.weight_decay * param[i];
    if (buf != nullptr) {
      const float b = s.first_step ? d : s.momentum * buf[i] + d;
      buf[i] = b;
      d = s.nesterov ? d + s.momentum * b : b;
    }
    // Note [captured optimizer steps]: a capturable SGD's lr is read from the device.
    param[i] -= (s.lr_on_device != nullptr ? *s.lr_on_device : s.lr) * d;
  }
};

// The constants are computed on the host exactly as the CPU kernel computes them.
struct AdamWFn {
  float* param;
  const float* grad;
  float* m;
  float* v;
  math::AdamWConstants k;
  __device__ void operator()(int64_t i) const {
    math::adamw_element(k, grad[i], param[i], m[i], v[i]);
  }
};

}  // namespace

void im2col(const Tensor& x, const Conv2dGeometry& g, Tensor& cols) {
  const Im2colFn fn{ptr<const float>(x), ptr<float>(cols), device_geometry(g)};
  for_each_index(cols, cols.numel(), fn, "im2col");
}

void col2im(const Tensor& cols, const Conv2dGeometry& g, Tensor& grad_x) {
  const Col2imFn fn{ptr<const float>(cols), ptr<float>(grad_x), device_geometry(g)};
  for_each_index(grad_x, grad_x.numel(), fn, "col2im");
}

void permute4(const Tensor& x, const std::array<int, 4>& perm, Tensor& out) {
  switch (element_size(x.dtype())) {
    case 1:
      return launch_permute<uint8_t>(x, perm, out);
    case 2:
      return launch_permute<uint16_t>(x, perm, out);
    case 4:
      return launch_permute<uint32_t>(x, perm, out);
    case 8:
      return launch_permute<uint64_t>(x, perm, out);
  }
  DDP_ASSERT(false, "permute4: no kernel for elements of {} bytes", element_size(x.dtype()));
}

void max_pool2d(const Tensor& x, const Conv2dGeometry& g, Tensor& out, Tensor& indices) {
  const MaxPoolFn fn{ptr<const float>(x), ptr<float>(out), ptr<int64_t>(indices),
                     device_geometry(g)};
  for_each_index(out, out.numel(), fn, "max_pool2d");
}

void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Conv2dGeometry& g,
                         Tensor& grad_x) {
  const MaxPoolBackwardFn fn{ptr<const float>(grad_out), ptr<const int64_t>(indices),
                             ptr<float>(grad_x), device_geometry(g)};
  for_each_index(grad_x, grad_x.numel(), fn, "max_pool2d_backward");
}

void dropout_mask(Tensor& mask, uint64_t seed, uint64_t offset, float p) {
  const int64_t n = mask.numel();
  const DropoutMaskFn fn{ptr<float>(mask), n, seed, offset, p, 1.0f / (1.0f - p)};
  const auto groups = static_cast<int64_t>(rng::philox_counters(static_cast<uint64_t>(n)));
  for_each_index(mask, groups, fn, "dropout_mask");
}

void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdStep& s) {
  float* b = s.momentum == 0.0f ? nullptr : ptr<float>(buf);
  const SgdFn fn{ptr<float>(param), ptr<const float>(grad), b, s};
  for_each_index(param, param.numel(), fn, "sgd_update");
}

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s) {
  const AdamWFn fn{ptr<float>(param), ptr<const float>(grad), ptr<float>(m), ptr<float>(v),
                   kernels::adamw_constants(s)};
  for_each_index(param, param.numel(), fn, "adamw_update");
}

}  // namespace ddp::kernels::cuda
