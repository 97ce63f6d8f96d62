// cub's DeviceRadixSort::SortPairs for the emulated CUDA device (Note [emulated CUDA
// device] in runtime/cuda/emu/kernel_emu.h): cmake/emulate_cuda.py puts this folder
// before the toolkit's on the include path of the emulated kernels. A stable sort of
// the keys' bits [begin_bit, end_bit), as cub's radix sort is stable.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

namespace cub {

struct DeviceRadixSort {
  template <typename Key, typename Value>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const Key* keys_in, Key* keys_out,
                               const Value* values_in, Value* values_out, int n, int begin_bit = 0,
                               int end_bit = sizeof(Key) * 8, cudaStream_t = nullptr) {
    if (temp == nullptr) {  // the size query
      temp_bytes = 1;
      return cudaSuccess;
    }
    const auto bits = [&](Key k) {
      using U = std::make_unsigned_t<Key>;
      const int width = end_bit - begin_bit;
      const U shifted = static_cast<U>(static_cast<U>(k) >> begin_bit);
      return width >= static_cast<int>(sizeof(U) * 8)
                 ? shifted
                 : static_cast<U>(shifted & ((U{1} << width) - 1));
    };
    std::vector<int> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return bits(keys_in[a]) < bits(keys_in[b]); });
    std::vector<Key> keys(static_cast<size_t>(n));
    std::vector<Value> values(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      keys[static_cast<size_t>(i)] = keys_in[order[static_cast<size_t>(i)]];
      values[static_cast<size_t>(i)] = values_in[order[static_cast<size_t>(i)]];
    }
    std::copy(keys.begin(), keys.end(), keys_out);
    std::copy(values.begin(), values.end(), values_out);
    return cudaSuccess;
  }
};

}  // namespace cub
