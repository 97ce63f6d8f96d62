// Random fills on CUDA: the Philox stream of rng/philox.h, so a tensor filled on
// the GPU equals the one filled on the CPU with the same seed and offset (up to
// the last bits of logf/sinf/cosf for normals). Keep this file free of fast math.
#include "runtime/ops/cuda/launch.cuh"
#include "runtime/ops/kernels.h"
#include "runtime/rng/philox.h"

namespace ddp::kernels::cuda {
namespace {

using detail::ptr;

// Note [rng stream] in rng/philox.h: thread-index g is one counter, offset + g,
// whose four words give elements 4g .. 4g+3 (the last group may be partial).
struct UniformFn {
  float* out;
  int64_t n;
  uint64_t seed, offset;
  __device__ void operator()(int64_t g) const {
    const rng::Philox4 block = rng::philox_block(seed, offset + static_cast<uint64_t>(g));
    for (int j = 0; j < 4 && 4 * g + j < n; ++j)
      out[4 * g + j] = rng::uniform_from_word(block.v[j]);
  }
};

struct NormalFn {
  float* out;
  int64_t n;
  uint64_t seed, offset;
  __device__ void operator()(int64_t g) const {
    const rng::Philox4 block = rng::philox_block(seed, offset + static_cast<uint64_t>(g));
    float values[4];
    rng::normal_pair(block.v[0], block.v[1], &values[0], &values[1]);
    rng::normal_pair(block.v[2], block.v[3], &values[2], &values[3]);
    for (int j = 0; j < 4 && 4 * g + j < n; ++j) out[4 * g + j] = values[j];
  }
};

int64_t groups(const Tensor& t) {
  return static_cast<int64_t>(rng::philox_counters(static_cast<uint64_t>(t.numel())));
}

}  // namespace

void fill_uniform(Tensor& t, uint64_t seed, uint64_t offset) {
  detail::for_each_index(t, groups(t), UniformFn{ptr<float>(t), t.numel(), seed, offset},
                         "fill_uniform");
}

void fill_normal(Tensor& t, uint64_t seed, uint64_t offset) {
  detail::for_each_index(t, groups(t), NormalFn{ptr<float>(t), t.numel(), seed, offset},
                         "fill_normal");
}

}  // namespace ddp::kernels::cuda
