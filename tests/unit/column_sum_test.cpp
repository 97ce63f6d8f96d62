// The partition of layer_norm_backward's weight and bias sums on CUDA (Note [column
// sums] in runtime/ops/cuda/column_sum.h), replayed on the CPU: each block's threads
// as a loop, the same tree over y, the same second pass. Every (row, column) must be
// visited exactly once, every partial written once and read by the second pass, and
// the results must match a float64 sum whatever the grid size.
#include "runtime/ops/cuda/column_sum.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace ddp::kernels::column_sum {
namespace {

struct Replay {
  std::vector<double> out;    // [d]
  std::vector<int> visits;    // [rows, d]: how often a thread read each element
  std::vector<int> partials;  // [chunks, d]: how often each partial was written
};

// layer_norm_column_partials_kernel and ColumnFinishFn (transformer.cu) with `blocks`
// blocks, summing x [rows, d].
Replay replay(const std::vector<double>& x, int64_t rows, int64_t d, int64_t blocks) {
  const Plan plan = make_plan(rows, d);
  Replay r{std::vector<double>(static_cast<size_t>(d)),
           std::vector<int>(static_cast<size_t>(rows * d)),
           std::vector<int>(static_cast<size_t>(plan.chunks * d))};
  std::vector<double> partial(static_cast<size_t>(plan.chunks * d), std::nan(""));
  std::array<double, kBlockThreads> shared{};
  for (int64_t block = 0; block < blocks; ++block) {
    for (int64_t tile = block; tile < plan.tiles(); tile += blocks) {
      const Tile at = tile_at(plan, tile);
      for (int t = 0; t < kBlockThreads; ++t) {
        const int tx = t % kColThreads, ty = t / kColThreads;
        const int64_t col = at.col0 + tx;
        double acc = 0.0;
        if (col < d) {
          const RowSpan span = thread_rows(at, ty, rows);
          for (int64_t row = span.first; row < span.end; row += span.step) {
            acc += x[static_cast<size_t>(row * d + col)];
            ++r.visits[static_cast<size_t>(row * d + col)];
          }
        }
        shared[static_cast<size_t>(t)] = acc;
      }
      for (int stride = kRowThreads / 2; stride > 0; stride /= 2) {
        for (int t = 0; t < kBlockThreads; ++t) {
          if (t / kColThreads < stride) {
            shared[static_cast<size_t>(t)] += shared[static_cast<size_t>(t + stride * kColThreads)];
          }
        }
      }
      for (int tx = 0; tx < kColThreads; ++tx) {
        const int64_t col = at.col0 + tx;
        if (col >= d) continue;
        const auto i = static_cast<size_t>(partial_index(at.chunk, col, d));
        partial[i] = shared[static_cast<size_t>(tx)];
        ++r.partials[i];
      }
    }
  }
  for (int64_t col = 0; col < d; ++col) {
    double sum = 0.0;
    for (int64_t c = 0; c < plan.chunks; ++c)
      sum += partial[static_cast<size_t>(partial_index(c, col, d))];
    r.out[static_cast<size_t>(col)] = sum;
  }
  return r;
}

std::vector<double> random_values(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> x(static_cast<size_t>(n));
  for (double& v : x) v = dist(gen);
  return x;
}

struct Case {
  int64_t rows, d;
};
// gpt-mini's LayerNorms see B*T = 1024 rows of 384; gpt2's up to 16k rows of 768.
const Case kCases[] = {{0, 5},    {1, 1},     {5, 7},      {127, 31},   {128, 32},
                       {129, 33}, {1000, 65}, {1024, 384}, {16384, 768}};

TEST(ColumnSum, VisitsEveryElementOnceAndMatchesAFloat64Sum) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "[" << c.rows << ", " << c.d << "]");
    const std::vector<double> x = random_values(c.rows * c.d, 3);
    const Replay r = replay(x, c.rows, c.d, 4096);
    for (size_t i = 0; i < r.visits.size(); ++i) ASSERT_EQ(r.visits[i], 1) << "element " << i;
    for (size_t i = 0; i < r.partials.size(); ++i) ASSERT_EQ(r.partials[i], 1) << "partial " << i;
    for (int64_t col = 0; col < c.d; ++col) {
      double ref = 0.0, abs_sum = 0.0;
      for (int64_t row = 0; row < c.rows; ++row) {
        ref += x[static_cast<size_t>(row * c.d + col)];
        abs_sum += std::fabs(x[static_cast<size_t>(row * c.d + col)]);
      }
      ASSERT_NEAR(r.out[static_cast<size_t>(col)], ref, 1e-12 * abs_sum + 1e-300)
          << "column " << col;
    }
  }
}

TEST(ColumnSum, ResultDoesNotDependOnTheGridSize) {
  const int64_t rows = 3000, d = 70;
  const std::vector<double> x = random_values(rows * d, 4);
  const std::vector<double> one = replay(x, rows, d, 1).out;
  for (int64_t blocks : {2, 7, 4096}) {
    EXPECT_EQ(replay(x, rows, d, blocks).out, one) << blocks << " blocks";
  }
}

}  // namespace
}  // namespace ddp::kernels::column_sum
