// Note [emulated CUDA device] (runtime/cuda/emu/kernel_emu.h): the emulation's own
// contract, with kernels written here. A -DDDP_CUDA=EMULATE build only (CI's sanitizer
// phase); other builds compile this file to nothing.
#include "ddp/config.h"

#if DDP_CUDA_EMULATION
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/emu/kernel_emu.h"
#include "runtime/error.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

namespace ddp {
namespace {

using cuda_emu::Config;
using cuda_emu::launch;

// One partial sum per block through shared memory and a tree of __syncthreads (for
// blocks of a power of two threads, at most kThreads).
template <int kThreads>
void block_sums_kernel(const int* x, int n, int* sums) {
  __shared__ int partial[kThreads];
  const int t = static_cast<int>(threadIdx.x + threadIdx.y * blockDim.x);
  const int threads = static_cast<int>(blockDim.x * blockDim.y);
  int acc = 0;
  for (int i = static_cast<int>(blockIdx.x) * threads + t; i < n;
       i += static_cast<int>(gridDim.x) * threads)
    acc += x[i];
  partial[t] = acc;
  __syncthreads();
  for (int half = threads / 2; half > 0; half /= 2) {
    if (t < half) partial[t] += partial[t + half];
    __syncthreads();
  }
  if (t == 0) sums[blockIdx.x] = partial[0];
}

TEST(KernelEmulation, SharedMemoryAndSyncthreadsGiveEachBlockItsSum) {
  std::vector<int> x(10007);
  std::iota(x.begin(), x.end(), -3000);
  for (const dim3 block : {dim3(256), dim3(16, 8), dim3(64)}) {
    const unsigned blocks = 5;
    std::vector<int> sums(blocks, -1);
    launch("block_sums_kernel", Config(blocks, block), block_sums_kernel<256>, x.data(),
           static_cast<int>(x.size()), sums.data());
    ASSERT_STREQ(cuda_emu::take_last_error(), "");
    // Block b sums the elements i with (i / threads) % blocks == b.
    const int threads = static_cast<int>(block.x * block.y);
    for (unsigned b = 0; b < blocks; ++b) {
      int want = 0;
      for (size_t i = 0; i < x.size(); ++i)
        if ((static_cast<int>(i) / threads) % static_cast<int>(blocks) == static_cast<int>(b))
          want += x[i];
      EXPECT_EQ(sums[b], want) << "block " << b << " of " << threads << " threads";
    }
  }
}

// Every lane gets the warp's sum by an xor butterfly; lanes past a partial warp's
// end give the caller its own value.
void warp_sum_kernel(const float* x, float* out) {
  const unsigned t = threadIdx.x;
  float v = x[t];
  for (int mask = 16; mask > 0; mask /= 2) v += __shfl_xor_sync(0xffffffffu, v, mask);
  out[t] = v;
}

TEST(KernelEmulation, AShuffleButterflyGivesEveryLaneItsWarpsSum) {
  std::vector<float> x(64), out(64, -1.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  launch("warp_sum_kernel", Config(1, 64), warp_sum_kernel, x.data(), out.data());
  ASSERT_STREQ(cuda_emu::take_last_error(), "");
  const float first = 31 * 32 / 2, second = (32 + 63) * 32 / 2;
  for (int i = 0; i < 64; ++i) EXPECT_EQ(out[i], i < 32 ? first : second) << "lane " << i;
}

// A shuffle of width 8: the butterfly over masks 4, 2, 1 sums each group of 8 lanes;
// then mask 8 reads the earlier group's lane (allowed) or, from a later group, gives
// the caller its own value (as __shfl_xor_sync does). 40 threads: the second warp is
// partial, its lanes past the end giving their own value too.
void group_sum_kernel(const float* x, float* sums, float* crossed) {
  const unsigned t = threadIdx.x;
  float v = x[t];
  for (int mask = 4; mask > 0; mask /= 2) v += __shfl_xor_sync(0xffffffffu, v, mask, 8);
  sums[t] = v;
  crossed[t] = __shfl_xor_sync(0xffffffffu, x[t], 8, 8);
}

TEST(KernelEmulation, AShuffleOfWidthEightStaysInItsGroupOrReadsAnEarlierOne) {
  constexpr int kThreads = 40;
  std::vector<float> x(kThreads), sums(kThreads, -1.0f), crossed(kThreads, -1.0f);
  for (int i = 0; i < kThreads; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i * i);
  launch("group_sum_kernel", Config(1, kThreads), group_sum_kernel, x.data(), sums.data(),
         crossed.data());
  ASSERT_STREQ(cuda_emu::take_last_error(), "");
  for (int i = 0; i < kThreads; ++i) {
    float want = 0;
    for (int j = i / 8 * 8; j < i / 8 * 8 + 8; ++j) want += x[static_cast<size_t>(j)];
    EXPECT_EQ(sums[static_cast<size_t>(i)], want) << "lane " << i;
    const int lane = i % 32, src = lane ^ 8;
    const bool own = src / 8 > lane / 8 || i - lane + src >= kThreads;
    EXPECT_EQ(crossed[static_cast<size_t>(i)], x[static_cast<size_t>(own ? i : i - lane + src)])
        << "lane " << i;
  }
}

// Threads waiting at different barriers: thread 0 at __syncthreads, the others at a
// shuffle that thread 0 never reaches.
void divergent_barrier_kernel(float* out) {
  if (threadIdx.x == 0) {
    __syncthreads();
  } else {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  }
}

// Each thread formats its index on its own stack.
void format_index_kernel(int* out) {
  char text[32];
  std::snprintf(text, sizeof text, "%u", threadIdx.x);
  out[threadIdx.x] = std::atoi(text);
}

TEST(KernelEmulation, ThreadsWaitingAtDifferentBarriersAreALaunchErrorNamingTheBlock) {
  std::vector<float> out(32);
  launch("divergent_barrier_kernel", Config(1, 32), divergent_barrier_kernel, out.data());
  const std::string err = cuda_emu::take_last_error();
  EXPECT_NE(err.find("divergent_barrier_kernel: block (0, 0, 0) deadlocked"), std::string::npos)
      << err;
  EXPECT_NE(err.find("1 thread(s) wait at __syncthreads and 31 at a warp shuffle"),
            std::string::npos)
      << err;
  EXPECT_STREQ(cuda_emu::take_last_error(), "") << "the error is taken once";
  // The abandoned threads' stacks serve the next launch (under ASan: without their
  // frames' redzones).
  std::vector<int> index(32, -1);
  launch("format_index_kernel", Config(1, 32), format_index_kernel, index.data());
  ASSERT_STREQ(cuda_emu::take_last_error(), "");
  for (int i = 0; i < 32; ++i) EXPECT_EQ(index[i], i);
}

// Threads that return count as arrived at a later __syncthreads (sm_70 and later).
void early_return_kernel(int* out) {
  if (threadIdx.x >= 8) return;
  int* mine = out + blockIdx.x * 8;
  mine[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  const int next = mine[(threadIdx.x + 1) % 8];
  __syncthreads();
  mine[threadIdx.x] += next;
}

TEST(KernelEmulation, ThreadsThatReturnDoNotHoldUpTheOthersBarrier) {
  std::vector<int> out(16, -1);
  launch("early_return_kernel", Config(2, 128), early_return_kernel, out.data());
  ASSERT_STREQ(cuda_emu::take_last_error(), "");
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out[i], i % 8 + (i + 1) % 8) << i;
}

void sync_in_block_one_kernel(int* out) {
  if (blockIdx.x == 1) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

TEST(KernelEmulation, AKernelThatWaitsOnlyInALaterBlockIsNamed) {
  std::vector<int> out(64, 0);
  launch("sync_in_block_one_kernel", Config(2, 32), sync_in_block_one_kernel, out.data());
  const std::string err = cuda_emu::take_last_error();
  EXPECT_NE(err.find("block (1, 0, 0) reached __syncthreads but block (0, 0, 0) never waited"),
            std::string::npos)
      << err;
}

void write_index_kernel(int* out) {
  out[blockIdx.x * blockDim.x + threadIdx.x] = static_cast<int>(blockIdx.x * 1000 + threadIdx.x);
}

TEST(KernelEmulation, BadConfigurationsAreLaunchErrorsAndRunNothing) {
  std::vector<int> out(4, -1);
  launch("write_index_kernel", Config(1, 2048), write_index_kernel, out.data());
  EXPECT_NE(std::string(cuda_emu::take_last_error())
                .find("write_index_kernel: invalid block (2048, 1, 1): 1 to 1024 threads"),
            std::string::npos);
  launch("write_index_kernel", Config(0, 4), write_index_kernel, out.data());
  EXPECT_NE(std::string(cuda_emu::take_last_error()).find("invalid grid (0, 1, 1)"),
            std::string::npos);
  launch("write_index_kernel", Config(1, 4, 1024), write_index_kernel, out.data());
  EXPECT_NE(std::string(cuda_emu::take_last_error()).find("dynamic shared memory"),
            std::string::npos);
  EXPECT_EQ(out, std::vector<int>(4, -1));
  launch("write_index_kernel", Config(2, 2), write_index_kernel, out.data());
  EXPECT_EQ(out, (std::vector<int>{0, 1, 1000, 1001}));
}

TEST(KernelEmulation, CheckLastErrorThrowsTheLaunchErrorNamingTheKernel) {
  std::vector<float> out(32);
  launch("divergent_barrier_kernel", Config(1, 32), divergent_barrier_kernel, out.data());
  try {
    cuda_api::check_last_error("divergent_barrier_kernel");
    FAIL() << "no error";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("launch of divergent_barrier_kernel failed"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(cuda_api::check_last_error("nothing"));
}

}  // namespace
}  // namespace ddp
#endif  // DDP_CUDA_EMULATION
