// Embedding lookup and its backward on CUDA.
//
// Note [deterministic embedding backward]: grad_weight[v] is the sum of the grad
// rows at the positions whose index is v, and a token can repeat thousands of times
// in a batch. Float atomics would add those rows in whatever order the threads
// arrive. Instead the positions are sorted by index on the device (CUB's radix sort,
// which is stable, so each index's positions stay in increasing order), and one
// thread per element of grad_weight finds its index's run of positions by binary
// search and adds their rows in position order, starting from 0: exactly the CPU
// kernel's order, so the result is the CPU's to the bit, on every run. Rows that no
// position names get 0 from the same thread, so nothing needs zeroing first.
//
// An index outside [0, V) cannot be reported without waiting for the device: the
// forward writes NaN for its row (so the loss shows it, as cross-entropy does for a
// bad label) and the backward ignores its position. The CPU kernels throw instead.
#include "runtime/ops/cuda/launch.cuh"  // first (see its top)

#include "runtime/ops/kernels.h"

#include <math_constants.h>
#include <cub/device/device_radix_sort.cuh>

#include <climits>

namespace ddp::kernels::cuda {
namespace {

using detail::ptr;

struct EmbeddingFn {
  const float* weight;
  const int64_t* indices;
  int64_t vocab, d;
  float* out;
  __device__ void operator()(int64_t i) const {
    const int64_t row = i / d, j = i - row * d;
    const int64_t v = indices[row];
    out[i] = (v >= 0 && v < vocab) ? weight[v * d + j] : CUDART_NAN_F;
  }
};

// Sort keys: the index, or `vocab` (a key no output row looks up) when out of range.
struct SortKeysFn {
  const int64_t* indices;
  int64_t vocab;
  uint32_t* keys;
  int32_t* positions;
  __device__ void operator()(int64_t i) const {
    const int64_t v = indices[i];
    keys[i] = static_cast<uint32_t>((v >= 0 && v < vocab) ? v : vocab);
    positions[i] = static_cast<int32_t>(i);
  }
};

// One thread per grad_weight element (v, j): the run of v in the sorted keys.
struct GatherRowsFn {
  const float* grad;
  const uint32_t* sorted_keys;
  const int32_t* sorted_positions;
  int64_t n, d;
  float* grad_weight;
  __device__ void operator()(int64_t i) const {
    const int64_t v = i / d, j = i - v * d;
    int64_t lo = 0, hi = n;  // first sorted slot with key >= v
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (sorted_keys[mid] < static_cast<uint64_t>(v)) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    float acc = 0.0f;
    for (int64_t s = lo; s < n && sorted_keys[s] == static_cast<uint64_t>(v); ++s) {
      acc += grad[static_cast<int64_t>(sorted_positions[s]) * d + j];
    }
    grad_weight[i] = acc;
  }
};

// Bits that hold every key 0..vocab (the radix sort skips the rest).
int key_bits(int64_t vocab) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) <= vocab) ++bits;
  return bits;
}

Tensor device_buffer(int64_t count, DType dtype, const Tensor& on) {
  return empty({count}, {.dtype = dtype, .device = on.device()});
}

}  // namespace

void embedding(const Tensor& weight, const Tensor& indices, Tensor& out) {
  const EmbeddingFn fn{ptr<const float>(weight), ptr<const int64_t>(indices), weight.size(0),
                       weight.size(1), ptr<float>(out)};
  detail::for_each_index(out, out.numel(), fn, "embedding");
}

void embedding_backward(const Tensor& grad, const Tensor& indices, Tensor& grad_weight) {
  const int64_t vocab = grad_weight.size(0), d = grad_weight.size(1), n = indices.numel();
  DDP_CHECK(vocab < INT32_MAX && n <= INT32_MAX,
            "embedding_backward on cuda: {} rows and {} positions, expected fewer than {} of "
            "each (the sort uses 32-bit keys); split the batch",
            vocab, n, INT32_MAX);
  cuda_api::DeviceGuard guard(grad_weight.device().index);
  const cudaStream_t stream = detail::stream_of(grad_weight);
  // All scratch from the caching allocator on this stream (see reduce_sum in reduce.cu).
  // Four allocations rather than two halves: each starts aligned as CUB's vector loads want.
  const Tensor keys = device_buffer(n, DType::i32, grad_weight);
  const Tensor sorted_keys = device_buffer(n, DType::i32, grad_weight);
  const Tensor positions = device_buffer(n, DType::i32, grad_weight);
  const Tensor sorted_positions = device_buffer(n, DType::i32, grad_weight);
  auto* keys_in = ptr<uint32_t>(keys);
  auto* positions_in = ptr<int32_t>(positions);
  auto* keys_out = ptr<uint32_t>(sorted_keys);
  auto* positions_out = ptr<int32_t>(sorted_positions);
  if (n > 0) {
    detail::for_each_index(grad_weight, n,
                           SortKeysFn{ptr<const int64_t>(indices), vocab, keys_in, positions_in},
                           "embedding_backward (keys)");
    const int bits = key_bits(vocab);
    size_t temp_bytes = 0;
    DDP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out,
                                                   positions_in, positions_out, static_cast<int>(n),
                                                   0, bits, stream));
    const Tensor temp = device_buffer(std::max<int64_t>(static_cast<int64_t>(temp_bytes), 1),
                                      DType::u8, grad_weight);
    DDP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, keys_in, keys_out,
                                                   positions_in, positions_out, static_cast<int>(n),
                                                   0, bits, stream));
  }
  const GatherRowsFn fn{ptr<const float>(grad), keys_out, positions_out, n, d,
                        ptr<float>(grad_weight)};
  detail::for_each_index(grad_weight, grad_weight.numel(), fn, "embedding_backward");
}

}  // namespace ddp::kernels::cuda
