// Multi-tensor CUDA kernels (ops/multi_tensor.h, Note [clipping on the device]): the
// sum of squares of a list of tensors, the clip factor, the in-place scale and the
// AdamW step, each one launch per kListMax tensors instead of one per tensor.
//
// A launch takes its tensors as a kernel parameter (TensorList, under CUDA's 4 KiB
// parameter limit) and runs one block of kThreads per chunk of kChunk elements of a
// tensor: block b finds its tensor by the prefix of the tensors' chunk counts. Bytes
// moved: the sum of squares reads every element once (4 B), the scale reads and
// writes it (8 B), AdamW reads param, grad, m, v and writes param, m, v (28 B). The
// sum of squares writes one double per chunk; one block then adds the chunks in order,
// so the bits depend only on the tensors' sizes. The sum of squares, the scale and
// AdamW read and write 16-byte vectors (Note [vectorized rows] in vec_map.h: a chunk is a row)
// where all of a tensor's arrays start on a vector, which the kernel checks per
// tensor, else element by element in the same order.
#include "runtime/ops/cuda/launch.cuh"  // first (see its top)

#include "runtime/ops/adamw_constants.h"
#include "runtime/ops/cuda/row_reduce.cuh"
#include "runtime/ops/kernels.h"
#include "runtime/ops/mixed_math.h"

#include <cmath>

namespace ddp::kernels::cuda {
namespace {

using detail::kThreads;
using detail::ptr;
using detail::stream_of;

constexpr int kListMax = 40;      // tensors per launch
constexpr int64_t kChunk = 8192;  // elements per block
constexpr int kPointers = 4;      // param, grad, m, v (AdamW); one for the others

// The tensors of one launch. chunk_end[t] = the chunks of tensors 0..t.
struct TensorList {
  float* p[kPointers][kListMax];
  int64_t n[kListMax];
  int64_t chunk_end[kListMax];
  math::AdamWConstants adamw[kListMax];  // AdamW only
  // AdamW from a device table (Note [captured optimizer steps]): tensor t's constants
  // are table[index[t]]; nullptr: adamw[t].
  const math::AdamWConstants* table;
  // AdamW: nullptr, or the factor every gradient element is multiplied by as it is
  // read (Note [clipping in the step] in optim/optimizer.h).
  const float* grad_scale;
  int index[kListMax];
  int count;
};
static_assert(sizeof(TensorList) <= 4000, "kernel parameters are limited to 4 KiB");

struct ChunkOf {
  int tensor;
  int64_t begin, end;  // elements of that tensor
};
__device__ __forceinline__ ChunkOf chunk_of(const TensorList& l, int64_t block) {
  int t = 0;
  while (block >= l.chunk_end[t]) ++t;
  const int64_t first = t == 0 ? 0 : l.chunk_end[t - 1];
  const int64_t begin = (block - first) * kChunk;
  return {t, begin, begin + kChunk < l.n[t] ? begin + kChunk : l.n[t]};
}

constexpr int kVector = 4;  // f32 elements in 16 bytes
using vec::aligned_for;

__global__ void sum_squares_kernel(TensorList l, double* partials) {
  const ChunkOf c = chunk_of(l, blockIdx.x);
  const float* x = l.p[0][c.tensor];
  double acc = 0.0;
  // The chunk is a row starting at element c.begin of its tensor (Note [vectorized
  // rows]): the order depends only on the sizes, whole vectors or not.
  vec::row_thread<kVector>(
      x + c.begin, c.begin, c.end - c.begin, aligned_for<kVector>(x), threadIdx.x, blockDim.x,
      [&](int64_t j) {
        const float v = x[c.begin + j];
        acc += static_cast<double>(v) * v;
      },
      [&](int64_t, const vec::Pack<float, kVector>& p) {
#pragma unroll
        for (int e = 0; e < kVector; ++e) acc += static_cast<double>(p.v[e]) * p.v[e];
      });
  acc = detail::block_all_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// out[0] = the partials [0, count) added by one block in a fixed order.
__global__ void sum_partials_kernel(const double* partials, int64_t count, float* out) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = detail::block_all_sum(acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(acc);
}

__global__ void clip_factor_kernel(const float* sum_squares, double max_norm, float* out) {
  const double norm = sqrt(static_cast<double>(sum_squares[0]));
  const double factor = isfinite(norm) ? fmin(1.0, max_norm / (norm + 1e-6)) : 1.0;
  out[0] = static_cast<float>(norm);
  out[1] = static_cast<float>(factor);
}

__global__ void scale_kernel(TensorList l, const float* scalar) {
  const ChunkOf c = chunk_of(l, blockIdx.x);
  float* x = l.p[0][c.tensor] + c.begin;
  const float factor = *scalar;
  const bool whole = aligned_for<kVector>(l.p[0][c.tensor]);
  vec::row_thread<kVector>(
      x, c.begin, c.end - c.begin, whole, threadIdx.x, blockDim.x,
      [&](int64_t j) { x[j] *= factor; },
      [&](int64_t j0, const vec::Pack<float, kVector>& p) {
        vec::Pack<float, kVector> o;
#pragma unroll
        for (int e = 0; e < kVector; ++e) o.v[e] = p.v[e] * factor;
        vec::store_at<kVector>(x + j0, o, whole);
      });
}

__global__ void adamw_kernel(TensorList l) {
  const ChunkOf c = chunk_of(l, blockIdx.x);
  float* param = l.p[0][c.tensor] + c.begin;
  const float* grad = l.p[1][c.tensor] + c.begin;
  float* m = l.p[2][c.tensor] + c.begin;
  float* v = l.p[3][c.tensor] + c.begin;
  const math::AdamWConstants k =
      l.table != nullptr ? l.table[l.index[c.tensor]] : l.adamw[c.tensor];
  // g * scale rounded to f32: the bits scale_kernel would have left in the gradient.
  const bool scaled = l.grad_scale != nullptr;
  const float scale = scaled ? *l.grad_scale : 1.0f;
  const auto in = [&](float g) { return scaled ? __fmul_rn(g, scale) : g; };
  // Chunk c as a row (Note [vectorized rows]); every vector of param, grad, m and v
  // is loaded before the first element is computed.
  const bool whole = vec::map_whole<kVector>(l.p[0][c.tensor], l.p[1][c.tensor], l.p[2][c.tensor],
                                             l.p[3][c.tensor]);
  constexpr int V = kVector;
  vec::row_thread<V>(
      grad, c.begin, c.end - c.begin, whole, threadIdx.x, blockDim.x,
      [&](int64_t j) { math::adamw_element(k, in(grad[j]), param[j], m[j], v[j]); },
      [&](int64_t j0, const vec::Pack<float, V>& g) {
        vec::Pack<float, V> p = vec::load_at<V>(param + j0, whole);
        vec::Pack<float, V> mp = vec::load_at<V>(m + j0, whole);
        vec::Pack<float, V> vp = vec::load_at<V>(v + j0, whole);
#pragma unroll
        for (int e = 0; e < V; ++e) math::adamw_element(k, in(g.v[e]), p.v[e], mp.v[e], vp.v[e]);
        vec::store_at<V>(param + j0, p, whole);
        vec::store_at<V>(m + j0, mp, whole);
        vec::store_at<V>(v + j0, vp, whole);
      });
}

int64_t chunks_of(int64_t n) {
  return (n + kChunk - 1) / kChunk;
}

// Calls launch(list, chunks) for consecutive groups of at most kListMax non-empty
// tensors; fill(list, slot, i) puts tensor i's pointers (and constants) in the slot.
template <typename Fill, typename Launch>
void for_each_list(size_t count, const std::vector<int64_t>& sizes, Fill fill, Launch launch) {
  TensorList l{};
  for (size_t i = 0; i < count; ++i) {
    if (sizes[i] == 0) continue;
    const int slot = l.count++;
    fill(l, slot, i);
    l.n[slot] = sizes[i];
    l.chunk_end[slot] = (slot == 0 ? 0 : l.chunk_end[slot - 1]) + chunks_of(sizes[i]);
    if (l.count == kListMax) {
      launch(l, l.chunk_end[slot]);
      l = TensorList{};
    }
  }
  if (l.count > 0) launch(l, l.chunk_end[l.count - 1]);
}

std::vector<int64_t> sizes_of(const std::vector<Tensor>& xs) {
  std::vector<int64_t> n;
  n.reserve(xs.size());
  for (const Tensor& x : xs) n.push_back(x.numel());
  return n;
}

}  // namespace

void sum_squares_multi(const std::vector<Tensor>& xs, Tensor& out) {
  const std::vector<int64_t> sizes = sizes_of(xs);
  int64_t total = 0;
  for (int64_t n : sizes) total += chunks_of(n);
  cuda_api::DeviceGuard guard(out.device().index);
  const cudaStream_t stream = stream_of(out);
  // Doubles from the caching allocator (i64 has their size); freed while the kernels
  // may run: the next user is ordered after them on the stream.
  const Tensor partials =
      empty({std::max<int64_t>(total, 1)}, {.dtype = DType::i64, .device = out.device()});
  auto* base = static_cast<double*>(partials.data_ptr());
  int64_t offset = 0;
  for_each_list(
      xs.size(), sizes,
      [&](TensorList& l, int slot, size_t i) { l.p[0][slot] = ptr<float>(xs[i]); },
      [&](const TensorList& l, int64_t chunks) {
        sum_squares_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(l,
                                                                                   base + offset);
        cuda_api::check_last_error("sum_squares_kernel");
        offset += chunks;
      });
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(base, total, ptr<float>(out));
  cuda_api::check_last_error("sum_partials_kernel (multi-tensor)");
}

void clip_factor(const Tensor& sum_squares, double max_norm, Tensor& out) {
  cuda_api::DeviceGuard guard(out.device().index);
  clip_factor_kernel<<<1, 1, 0, stream_of(out)>>>(ptr<const float>(sum_squares), max_norm,
                                                  ptr<float>(out));
  cuda_api::check_last_error("clip_factor_kernel");
}

void scale_by_multi(const std::vector<Tensor>& xs, const Tensor& scalar) {
  cuda_api::DeviceGuard guard(scalar.device().index);
  const cudaStream_t stream = stream_of(scalar);
  for_each_list(
      xs.size(), sizes_of(xs),
      [&](TensorList& l, int slot, size_t i) { l.p[0][slot] = ptr<float>(xs[i]); },
      [&](const TensorList& l, int64_t chunks) {
        scale_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(
            l, ptr<const float>(scalar));
        cuda_api::check_last_error("scale_kernel (multi-tensor)");
      });
}

void adamw_update_multi(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                        std::vector<Tensor>& m, std::vector<Tensor>& v,
                        const std::vector<AdamWStep>& steps, const Tensor& constants,
                        const Tensor& grad_scale) {
  const float* scale = grad_scale.defined() ? ptr<const float>(grad_scale) : nullptr;
  const auto* table = constants.defined()
                          ? static_cast<const math::AdamWConstants*>(constants.data_ptr())
                          : nullptr;
  cuda_api::DeviceGuard guard(params.front().device().index);
  const cudaStream_t stream = stream_of(params.front());
  for_each_list(
      params.size(), sizes_of(params),
      [&](TensorList& l, int slot, size_t i) {
        l.p[0][slot] = ptr<float>(params[i]);
        l.p[1][slot] = const_cast<float*>(ptr<const float>(grads[i]));  // read only
        l.p[2][slot] = ptr<float>(m[i]);
        l.p[3][slot] = ptr<float>(v[i]);
        l.grad_scale = scale;
        if (table != nullptr) {
          l.table = table;
          l.index[slot] = static_cast<int>(i);
        } else {
          l.adamw[slot] = kernels::adamw_constants(steps[i]);
        }
      },
      [&](const TensorList& l, int64_t chunks) {
        adamw_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(l);
        cuda_api::check_last_error("adamw_kernel (multi-tensor)");
      });
}

}  // namespace ddp::kernels::cuda
