// Note [one-pass reduction]: comm::reduce_buffers, the host reduction of the shm,
// gloo and mpi backends, gives bit for bit what a loop over the sources in
// order gives (16-bit floats accumulated in f32, the avg scale applied last),
// for every dtype, op and source count, across block boundaries and vector
// tails, with dst aliasing a source as the shm backend calls it.
#include "collectives/reduce_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace ddp::comm {
namespace {

// The element as the reference accumulates it, and back.
template <typename T>
auto widen(T v) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return bf16_to_float(v.bits);
  } else if constexpr (std::is_same_v<T, Half>) {
    float f = 0;
    f16_to_floats(&v.bits, &f, 1);
    return f;
  } else {
    return v;
  }
}

template <typename T, typename V>
T narrow(V v) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return T{float_to_bf16(v)};
  } else if constexpr (std::is_same_v<T, Half>) {
    T h{};
    floats_to_f16(&v, &h.bits, 1);
    return h;
  } else {
    return v;
  }
}

template <typename T>
T sample(std::mt19937& rng, int64_t i) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(std::uniform_int_distribution<int>(-1000, 1000)(rng));
  } else {
    if (i % 97 == 5) return narrow<T>(-0.0f);
    if (i % 101 == 7) return narrow<T>(std::nanf(""));
    return narrow<T>(std::normal_distribution<float>(0.0f, 3.0f)(rng));
  }
}

template <typename T>
std::vector<T> reference(const std::vector<std::vector<T>>& srcs, ReduceOp op, double scale) {
  std::vector<T> out(srcs[0].size());
  for (size_t i = 0; i < out.size(); ++i) {
    auto acc = widen(srcs[0][i]);
    for (size_t k = 1; k < srcs.size(); ++k) {
      const auto v = widen(srcs[k][i]);
      if (op == ReduceOp::max) {
        acc = std::max(acc, v);
      } else if (op == ReduceOp::min) {
        acc = std::min(acc, v);
      } else {
        acc = acc + v;
      }
    }
    if (op == ReduceOp::avg)
      acc = static_cast<decltype(acc)>(acc * static_cast<decltype(acc)>(scale));
    out[i] = narrow<T>(acc);
  }
  return out;
}

template <typename T>
void check_dtype(DType dtype) {
  std::mt19937 rng(7);
  std::vector<ReduceOp> ops = {ReduceOp::sum, ReduceOp::max, ReduceOp::min};
  if (!std::is_integral_v<T>) ops.push_back(ReduceOp::avg);
  for (ReduceOp op : ops) {
    for (int n = 1; n <= 5; ++n) {
      for (int64_t count : {0, 1, 15, 17, 1023, 1024, 1025, 5003}) {
        std::vector<std::vector<T>> srcs(static_cast<size_t>(n),
                                         std::vector<T>(static_cast<size_t>(count)));
        for (auto& s : srcs) {
          for (int64_t i = 0; i < count; ++i) s[static_cast<size_t>(i)] = sample<T>(rng, i);
        }
        const double scale = 1.0 / n;
        const std::vector<T> want = reference(srcs, op, scale);
        // dst aliases source `into` (the shm backend's own slice), or is apart (-1).
        for (int into : {-1, 0, n - 1}) {
          std::vector<std::vector<T>> work = srcs;
          std::vector<T> apart(static_cast<size_t>(count));
          std::vector<const void*> ptrs;
          for (const auto& s : work) ptrs.push_back(s.data());
          T* dst = into < 0 ? apart.data() : work[static_cast<size_t>(into)].data();
          reduce_buffers(dst, ptrs.data(), n, count, dtype, op, scale);
          const bool same =
              count == 0 || std::memcmp(dst, want.data(), sizeof(T) * want.size()) == 0;
          EXPECT_TRUE(same) << dtype_name(dtype) << " " << reduce_op_name(op) << " of " << n
                            << " sources, " << count << " elements, dst aliasing source " << into;
        }
      }
    }
  }
}

TEST(ReduceKernels, EqualTheLoopOverSourcesBitForBit) {
  check_dtype<float>(DType::f32);
  check_dtype<BFloat16>(DType::bf16);
  check_dtype<Half>(DType::f16);
  check_dtype<int32_t>(DType::i32);
  check_dtype<int64_t>(DType::i64);
}

}  // namespace
}  // namespace ddp::comm
