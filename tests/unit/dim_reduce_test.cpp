// The partition of sum_dim/argmax_dim on CUDA (Note [dim reduce] in
// runtime/ops/cuda/dim_reduce.h), replayed on the CPU: each block's threads as
// a loop, the same tree over y, the same passes. Every input element must be
// counted exactly once, partials must land where the next pass reads them, and
// the results must match a float64 sum and the CPU argmax, for shapes that take
// one pass, several passes, narrow and wide inner dimensions.
#include "runtime/ops/cuda/dim_reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

namespace ddp::kernels::dim_reduce {
namespace {

struct Shape {
  int64_t outer, n, inner;
};

// One pass of dim_reduce_kernel with `blocks` blocks (any count gives the same result).
template <typename R, typename In, typename Out>
std::vector<Out> replay_pass(const std::vector<In>& x, const Shape& s, const Plan& plan,
                             int64_t blocks) {
  std::vector<Out> out(static_cast<size_t>(s.outer * plan.chunks * s.inner));
  std::vector<bool> written(out.size(), false);
  const int64_t tiles = plan.tiles(s.outer);
  std::vector<typename R::Acc> partial(kBlockThreads);
  for (int64_t block = 0; block < blocks; ++block) {
    for (int64_t base = block * plan.tz; base < tiles; base += blocks * plan.tz) {
      for (int t = 0; t < kBlockThreads; ++t) {
        const Slot slot = slot_of(plan, t);
        const int64_t tile = base + slot.z;
        partial[static_cast<size_t>(t)] =
            tile < tiles
                ? thread_partial<R>(x.data(), plan, tile_at(plan, tile), slot, s.n, s.inner)
                : R::identity();
      }
      for (int stride = plan.ty / 2; stride > 0; stride /= 2) {
        for (int t = 0; t < kBlockThreads; ++t) {
          if (slot_of(plan, t).y < stride) {
            partial[static_cast<size_t>(t)] =
                R::combine(partial[static_cast<size_t>(t)],
                           partial[static_cast<size_t>(t + stride * plan.tx)]);
          }
        }
      }
      for (int t = 0; t < kBlockThreads; ++t) {
        const Slot slot = slot_of(plan, t);
        const int64_t tile = base + slot.z;
        if (tile >= tiles || slot.y != 0) continue;
        const Tile at = tile_at(plan, tile);
        const int64_t col = at.col0 + slot.x;
        if (col >= s.inner) continue;
        const auto i = static_cast<size_t>(out_index(plan, at, col, s.inner));
        EXPECT_FALSE(written[i]) << "output " << i << " written twice";
        written[i] = true;
        if constexpr (std::is_same_v<Out, typename R::Acc>) {
          out[i] = partial[static_cast<size_t>(t)];
        } else {
          out[i] = R::finish(partial[static_cast<size_t>(t)]);
        }
      }
    }
  }
  for (size_t i = 0; i < written.size(); ++i) EXPECT_TRUE(written[i]) << "output " << i;
  return out;
}

// reduce_dim's pass loop; `passes` gets the number of passes.
template <typename R, typename Out>
std::vector<Out> replay(const std::vector<float>& x, Shape s, int64_t blocks, int* passes) {
  std::vector<typename R::Acc> partials;
  bool first = true;
  for (*passes = 1;; ++*passes) {
    const Plan plan = make_plan(s.n, s.inner);
    if (plan.chunks == 1) {
      return first ? replay_pass<R, float, Out>(x, s, plan, blocks)
                   : replay_pass<R, typename R::Acc, Out>(partials, s, plan, blocks);
    }
    partials = first ? replay_pass<R, float, typename R::Acc>(x, s, plan, blocks)
                     : replay_pass<R, typename R::Acc, typename R::Acc>(partials, s, plan, blocks);
    first = false;
    s.n = plan.chunks;
  }
}

std::vector<float> random_values(const Shape& s, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(s.outer * s.n * s.inner));
  for (float& v : x) v = dist(gen);
  return x;
}

const Shape kShapes[] = {{5, 7, 9},      {1, 1, 1},     {4096, 3, 1},  {3, 4096, 1},
                         {1, 4096, 3},   {64, 4096, 2}, {2, 300, 33},  {7, 1, 100},
                         {1, 100000, 1}, {3, 17, 64},   {2, 70001, 5}, {1000, 10, 1}};

TEST(DimReduce, SumsEveryElementOnceInEveryPass) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "[" << s.outer << ", " << s.n << ", " << s.inner << "]");
    const std::vector<float> x = random_values(s, 7);
    int passes = 0;
    const std::vector<float> got = replay<Sum, float>(x, s, 3, &passes);
    for (int64_t o = 0; o < s.outer; ++o) {
      for (int64_t i = 0; i < s.inner; ++i) {
        double ref = 0.0, abs_sum = 0.0;
        for (int64_t j = 0; j < s.n; ++j) {
          const double v = x[static_cast<size_t>((o * s.n + j) * s.inner + i)];
          ref += v;
          abs_sum += std::fabs(v);
        }
        const double err = std::fabs(got[static_cast<size_t>(o * s.inner + i)] - ref);
        // Double accumulation: only the final rounding to float remains.
        ASSERT_LE(err, 1e-6 * abs_sum + 1e-30) << "output (" << o << ", " << i << ")";
      }
    }
    if (s.n > 16 * 256) {
      EXPECT_GT(passes, 1) << "a long dim must be split across blocks";
    }
  }
}

TEST(DimReduce, ResultDoesNotDependOnTheGridSize) {
  const Shape s{3, 70001, 5};
  const std::vector<float> x = random_values(s, 8);
  int passes = 0;
  const std::vector<float> one = replay<Sum, float>(x, s, 1, &passes);
  for (int64_t blocks : {2, 7, 4096}) {
    const std::vector<float> other = replay<Sum, float>(x, s, blocks, &passes);
    EXPECT_EQ(other, one) << blocks << " blocks";
  }
}

TEST(DimReduce, ArgmaxMatchesTheCpuRule) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "[" << s.outer << ", " << s.n << ", " << s.inner << "]");
    std::vector<float> x = random_values(s, 9);
    // Ties (the first index wins), -0 equal to 0, and NaNs (the first NaN wins).
    for (size_t k = 0; k < x.size(); ++k) {
      if (k % 13 == 0) x[k] = 3.5f;
      if (k % 29 == 0) x[k] = std::numeric_limits<float>::quiet_NaN();
      if (k % 31 == 0) x[k] = -0.0f;
    }
    int passes = 0;
    const std::vector<int64_t> got = replay<Argmax, int64_t>(x, s, 5, &passes);
    for (int64_t o = 0; o < s.outer; ++o) {
      for (int64_t i = 0; i < s.inner; ++i) {
        // The CPU kernel (runtime/ops/cpu/reduce.cpp).
        int64_t best = 0;
        float best_value = x[static_cast<size_t>(o * s.n * s.inner + i)];
        for (int64_t j = 1; j < s.n; ++j) {
          const float v = x[static_cast<size_t>((o * s.n + j) * s.inner + i)];
          if (v > best_value || (std::isnan(v) && !std::isnan(best_value))) {
            best = j;
            best_value = v;
          }
        }
        ASSERT_EQ(got[static_cast<size_t>(o * s.inner + i)], best)
            << "output (" << o << ", " << i << ")";
      }
    }
  }
}

TEST(DimReduce, PlanFillsTheBlockAndDependsOnlyOnTheShape) {
  for (int64_t n : {0, 1, 2, 15, 16, 17, 100, 4096, 4097, 1000000}) {
    for (int64_t inner : {1, 2, 3, 31, 32, 33, 1000}) {
      const Plan p = make_plan(n, inner);
      EXPECT_EQ(p.tx * p.ty * p.tz, kBlockThreads) << n << " x " << inner;
      EXPECT_GE(p.chunks * p.chunk_rows, n);
      EXPECT_GE(p.chunks, 1);
      EXPECT_GE(p.col_tiles * p.tx, inner);
      EXPECT_LE(p.tx, kMaxColumnThreads);
    }
  }
  // Short rows share a block; a long row gets all 256 threads.
  EXPECT_EQ(make_plan(10, 1).tz, 256);
  EXPECT_EQ(make_plan(4096, 1).ty, 256);
  EXPECT_EQ(make_plan(4096, 1).chunks, 1);
  EXPECT_EQ(make_plan(4097, 1).chunks, 2);
}

TEST(DimReduce, EmptyDimSumsToZero) {
  const Shape s{2, 0, 3};
  int passes = 0;
  const std::vector<float> got = replay<Sum, float>({}, s, 1, &passes);
  EXPECT_EQ(got, std::vector<float>(6, 0.0f));
}

}  // namespace
}  // namespace ddp::kernels::dim_reduce
