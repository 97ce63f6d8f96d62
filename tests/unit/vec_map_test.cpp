// The vectorized elementwise map of the CUDA kernels (Note [vectorized elementwise] in
// runtime/ops/cuda/vec_map.h), replayed on the CPU: map_kernel's thread body called
// for every thread of a grid. Every element must be computed exactly once, from its
// own inputs, nothing outside [0, n) written, whatever n, vector width and grid size;
// and the width falls back to 1 where an address does not allow whole vectors.
#include "runtime/ops/cuda/vec_map.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace ddp::kernels::cuda::vec {
namespace {

// Buffers with room for canaries around an aligned [0, n) span, so a stray write
// before or after the span shows.
template <typename T>
struct Guarded {
  static constexpr int64_t kPad = 64;  // elements each side (a multiple of every V here)
  std::vector<T> storage;
  int64_t n;
  Guarded(int64_t n_, T canary) : storage(static_cast<size_t>(n_ + 2 * kPad + 64), canary), n(n_) {}
  // The span, aligned for a 64-byte Pack (the widest used below) plus `shift` elements.
  T* span(int64_t shift = 0) {
    auto base = reinterpret_cast<uintptr_t>(storage.data() + kPad);
    const uintptr_t aligned = (base + 63) / 64 * 64;
    return reinterpret_cast<T*>(aligned) + shift;
  }
};

// Counts how often each element's function ran; the input's value is the element's
// index, so a thread that computed the wrong element shows as a wrong output.
struct Visit {
  int* visits;
  int64_t operator()(int64_t i) const {
    ++visits[i];
    return 3 * i + 1;
  }
};

// shift 0: aligned arrays, whole vectors; 1: both a element off, element by element.
template <int V>
void replay(int64_t n, int64_t threads, int64_t shift = 0) {
  Guarded<int64_t> in(n, -1), out(n, -7);
  int64_t* x = in.span(shift);
  int64_t* y = out.span(shift);
  for (int64_t i = 0; i < n; ++i) x[i] = i;
  std::vector<int> visits(static_cast<size_t>(n) + 1, 0);
  const bool whole = map_whole<V>(y, static_cast<const int64_t*>(x));
  ASSERT_EQ(whole, shift == 0 || V == 1);
  for (int64_t t = 0; t < threads; ++t) {
    map_thread<V>(t, threads, n, whole, Visit{visits.data()}, y, static_cast<const int64_t*>(x));
  }
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(visits[static_cast<size_t>(i)], 1)
        << "element " << i << ", n " << n << ", V " << V << ", " << threads << " threads";
    ASSERT_EQ(y[i], 3 * i + 1) << "element " << i << ", n " << n << ", V " << V;
  }
  for (auto it = out.storage.begin(); it != out.storage.end(); ++it) {
    const int64_t at = &*it - y;
    if (at < 0 || at >= n) {
      ASSERT_EQ(*it, -7) << "written outside [0, " << n << "): " << at;
    }
  }
}

TEST(VecMap, EveryElementOnceWhateverTheLengthWidthAndGrid) {
  for (const int64_t n : {0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 1000, 4099}) {
    for (const int64_t threads : {1, 3, 8, 32, 256, 1000}) {
      for (const int64_t shift : {0, 1}) {
        replay<1>(n, threads, shift);
        replay<2>(n, threads, shift);
        replay<4>(n, threads, shift);
        replay<8>(n, threads, shift);
      }
    }
  }
}

// The launch's thread count (one per vector, one per tail element) covers everything
// in one sweep, with no idle thread, when the grid is not capped.
TEST(VecMap, TheLaunchesThreadsCoverTheTailInOneSweep) {
  for (const int64_t n : {1, 7, 8, 9, 15, 17, 1000}) {
    for (const int width : {1, 2, 4, 8}) {
      const int64_t threads = map_threads(n, width);
      const int64_t vectors = n / width, tail = n % width;
      EXPECT_GE(threads, vectors) << "a vector left for a second sweep; n " << n;
      EXPECT_GE(threads, tail) << "a tail element left for a second sweep; n " << n;
      EXPECT_TRUE(threads - 1 < vectors || threads - 1 < tail) << "an idle thread; n " << n;
    }
  }
}

// Mixed element types, as the residual add (f32 + bf16 -> f32): a 16-byte vector of the
// narrowest type, so the f32 arrays move 32 bytes a thread.
struct AddHalfToFloat {
  float operator()(float a, uint16_t b) const { return a + static_cast<float>(b); }
};

TEST(VecMap, MixedTypesTakeTheNarrowestTypesVector) {
  EXPECT_EQ((widest_map<float>()), 4);
  EXPECT_EQ((widest_map<uint16_t>()), 8);
  EXPECT_EQ((widest_map<float, uint16_t>()), 8);
  EXPECT_EQ((widest_map<float, uint16_t, float>()), 8);
  EXPECT_EQ((widest_map<int64_t>()), 2);
  EXPECT_EQ((widest_map<float, int64_t>()), 4);
  EXPECT_EQ((widest_map<float, uint8_t>()), 16);
  EXPECT_EQ((widest_map<double>()), 2);
  for (const int64_t n : {0, 5, 8, 13, 100}) {
    Guarded<float> a(n, 0.0f), out(n, -1.0f);
    Guarded<uint16_t> b(n, 0);
    float* pa = a.span();
    uint16_t* pb = b.span();
    float* po = out.span();
    for (int64_t i = 0; i < n; ++i) {
      pa[i] = 0.5f * static_cast<float>(i);
      pb[i] = static_cast<uint16_t>(1000 + i);
    }
    constexpr int kV = widest_map<float, uint16_t>();
    ASSERT_TRUE(map_whole<kV>(po, static_cast<const float*>(pa), static_cast<const uint16_t*>(pb)));
    for (int64_t t = 0; t < 5; ++t) {
      map_thread<kV>(t, 5, n, true, AddHalfToFloat{}, po, static_cast<const float*>(pa),
                     static_cast<const uint16_t*>(pb));
    }
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(po[i], 0.5f * static_cast<float>(i) + static_cast<float>(1000 + i)) << i;
    }
  }
}

// In place, as axpy (y = y + alpha x): each thread reads its vector before it writes it.
struct Axpy {
  float alpha;
  float operator()(float x, float y) const { return y + alpha * x; }
};

TEST(VecMap, InPlaceReadsEachVectorBeforeWritingIt) {
  const int64_t n = 37;
  Guarded<float> x(n, 0.0f), y(n, 0.0f);
  float* px = x.span();
  float* py = y.span();
  for (int64_t i = 0; i < n; ++i) {
    px[i] = static_cast<float>(i);
    py[i] = 100.0f;
  }
  for (int64_t t = 0; t < 4; ++t) {
    map_thread<4>(t, 4, n, true, Axpy{2.0f}, py, static_cast<const float*>(px),
                  static_cast<const float*>(py));
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(py[i], 100.0f + 2.0f * static_cast<float>(i)) << i;
}

// No inputs, as fill.
struct Value {
  int32_t v;
  int32_t operator()() const { return v; }
};

TEST(VecMap, NoInputsFillsEveryElement) {
  for (const int64_t n : {1, 3, 4, 5, 99}) {
    Guarded<int32_t> out(n, -1);
    int32_t* p = out.span();
    for (int64_t t = 0; t < 2; ++t) map_thread<4>(t, 2, n, true, Value{42}, p);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(p[i], 42) << i;
    ASSERT_EQ(p[-1], -1);
    ASSERT_EQ(p[n], -1);
  }
}

// A view that starts mid-vector (any array of the call) is read and written element by
// element (the same partition: EveryElementOnce... replays it).
TEST(VecMap, AnAddressThatIsNotAVectorsGoesElementByElement) {
  Guarded<float> a(64, 0.0f), out(64, 0.0f);
  Guarded<uint16_t> b(64, 0);
  const float* pa = a.span();
  const uint16_t* pb = b.span();
  float* po = out.span();
  EXPECT_TRUE(map_whole<8>(po, pa, pb));
  EXPECT_FALSE(map_whole<8>(po + 4, pa + 4, pb + 4)) << "f32 arrays need 32 bytes for 8";
  EXPECT_TRUE(map_whole<4>(po + 4, pa + 4));
  EXPECT_FALSE(map_whole<8>(po, pa, pb + 1)) << "the bf16 input alone is off";
  EXPECT_TRUE(map_whole<8>(po, pa + 8, pb + 8));
  EXPECT_FALSE(map_whole<8>(po + 1, pa, pb)) << "the output alone is off";
  EXPECT_FALSE(map_whole<2>(reinterpret_cast<int64_t*>(po) + 1));
}

// Note [vectorized rows]: a row kernel's block over rows of every length and every
// start within a vector, as the classifier's kernels walk GPT-2's 50257-column rows.
// Each element is handed over exactly once (alone or inside the vector that holds
// it, with its own value), each thread goes head, vectors, tail, and with `whole`
// every vector starts on an aligned address. The cut is the same whether the
// tensor's base is aligned (whole vectors) or not (element by element): what each
// thread sees, in what order, is recorded and compared.
template <int V>
std::vector<std::vector<int64_t>> replay_rows(const uint16_t* base, int64_t first, int64_t len,
                                              bool whole, int64_t threads) {
  const uint16_t* row = base + first;
  const RowSplit split = split_row<V>(first, len);
  EXPECT_EQ(split.head + split.vectors * V + split.tail, len);
  EXPECT_LT(split.head, V);
  EXPECT_LT(split.tail, V);
  EXPECT_EQ((first + split.head) % V == 0 || split.vectors == 0, true);
  std::vector<int> seen(static_cast<size_t>(len), 0);
  std::vector<std::vector<int64_t>> order(static_cast<size_t>(threads));
  for (int64_t t = 0; t < threads; ++t) {
    int phase = 0;  // 0 head, 1 vectors, 2 tail
    int64_t last = -1;
    auto& mine = order[static_cast<size_t>(t)];
    row_thread<V>(
        row, first, len, whole, t, threads,
        [&](int64_t j) {
          ASSERT_TRUE(j >= 0 && j < len) << j;
          ++seen[static_cast<size_t>(j)];
          const int now = j < split.head ? 0 : 2;
          ASSERT_GE(now, phase) << "thread " << t << " went back to the head";
          ASSERT_GT(j, last) << "thread " << t << " out of order";
          phase = now;
          last = j;
          mine.push_back(j);
        },
        [&](int64_t j0, const Pack<uint16_t, V>& pack) {
          ASSERT_GE(1, phase) << "a vector after the tail";
          ASSERT_GT(j0, last) << "thread " << t << " out of order";
          if (whole) {
            ASSERT_TRUE(aligned_for<V>(row + j0)) << "a whole vector off its address";
          }
          phase = 1;
          for (int e = 0; e < V; ++e) {
            ASSERT_LT(j0 + e, len);
            ++seen[static_cast<size_t>(j0 + e)];
            ASSERT_EQ(pack.v[e], row[j0 + e]) << "the vector's element " << e;
            mine.push_back(j0 + e);
          }
          last = j0 + V - 1;
        });
  }
  for (int64_t j = 0; j < len; ++j) {
    EXPECT_EQ(seen[static_cast<size_t>(j)], 1) << "column " << j << " of " << len << ", row start "
                                               << first << ", " << threads << " threads";
  }
  return order;
}

template <int V>
void replay_rows_everywhere(int64_t threads) {
  std::vector<uint16_t> storage(8192);
  for (size_t i = 0; i < storage.size(); ++i) storage[i] = static_cast<uint16_t>(i * 7 + 3);
  const auto* aligned =
      reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) / 64 * 64);
  for (const int64_t len : {0, 1, 2, 5, 7, 8, 9, 15, 16, 17, 100, 257, 1000, 2053}) {
    for (int64_t first = 0; first < 2 * V + 1; ++first) {
      SCOPED_TRACE(testing::Message() << "V " << V << ", len " << len << ", first " << first);
      const auto on_vectors = replay_rows<V>(aligned, first, len, true, threads);
      // The same tensor one element further in memory (or a view that starts there).
      const auto off_vectors = replay_rows<V>(aligned + 1, first, len, false, threads);
      ASSERT_EQ(on_vectors, off_vectors) << "the cut depends on the address";
    }
  }
}

TEST(VecMap, RowsAreCutByIndexIntoHeadVectorsAndTailWhateverTheAddress) {
  for (const int64_t threads : {1, 3, 32, 256}) {
    replay_rows_everywhere<1>(threads);
    replay_rows_everywhere<4>(threads);
    replay_rows_everywhere<8>(threads);
  }
}

// load_at and store_at: the same values whole or element by element.
TEST(VecMap, LoadAndStoreGiveTheSameValuesWholeOrNot) {
  alignas(64) float a[16];
  alignas(64) float b[16] = {};
  alignas(64) float c[16] = {};
  for (int i = 0; i < 16; ++i) a[i] = static_cast<float>(i) + 0.5f;
  const Pack<float, 4> whole = load_at<4>(a + 4, true);
  const Pack<float, 4> apart = load_at<4>(a + 5, false);
  for (int e = 0; e < 4; ++e) {
    EXPECT_EQ(whole.v[e], a[4 + e]);
    EXPECT_EQ(apart.v[e], a[5 + e]);
  }
  store_at<4>(b + 8, whole, true);
  store_at<4>(c + 3, whole, false);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(b[i], i >= 8 && i < 12 ? a[i - 4] : 0.0f) << i;
    EXPECT_EQ(c[i], i >= 3 && i < 7 ? a[i + 1] : 0.0f) << i;
  }
}

}  // namespace
}  // namespace ddp::kernels::cuda::vec
