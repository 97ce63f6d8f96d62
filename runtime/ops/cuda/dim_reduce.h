// The partition of a reduction along one dimension on CUDA (sum_dim, argmax_dim),
// shared by the kernels in reduce.cu and the unit test that replays it on the
// CPU (tests/unit/dim_reduce_test.cpp). Plain C++ plus host/device markers: no
// CUDA headers, so the test compiles without nvcc.
//
// Note [dim reduce]: x is viewed as [outer, n, inner] and reduced over n. A tile
// is (one outer index, one chunk of at most `chunk_rows` rows of n, `tx`
// consecutive inner columns). Its tx * ty threads read along inner (coalesced)
// and down the rows (thread y takes rows y, y + ty, ... of the chunk, serially),
// then a fixed tree over y combines the ty partials. A block of 256 threads runs
// 256 / (tx * ty) tiles side by side, so short rows do not leave threads idle.
// When n needs more than one chunk, a pass writes [outer, chunks, inner] partials
// and the next pass reduces those the same way. The plan depends only on n and
// inner (never on the GPU or the grid size, which only decides how many tiles run
// at once), so every GPU computes the same sums in the same order (Note
// [deterministic sum] in reduce.cu). Sums accumulate in double, as on the CPU.
#pragma once

#include "runtime/host_device.h"

#include <cstdint>

namespace ddp::kernels::dim_reduce {

inline constexpr int kBlockThreads = 256;
inline constexpr int kMaxColumnThreads = 32;  // one warp across inner at most
inline constexpr int64_t kRowsPerThread = 16;

DDP_HOST_DEVICE inline int64_t pow2_at_least(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

struct Plan {
  int tx = 1;              // threads along inner (a power of two, at most kMaxColumnThreads)
  int ty = 1;              // threads along n in one tile (a power of two)
  int tz = 1;              // tiles per block: kBlockThreads / (tx * ty)
  int64_t chunk_rows = 1;  // rows of n one tile covers: ty * kRowsPerThread
  int64_t chunks = 1;      // tiles along n (at least 1, so an empty n still writes)
  int64_t col_tiles = 1;   // tiles along inner
  DDP_HOST_DEVICE int64_t tiles(int64_t outer) const { return outer * chunks * col_tiles; }
};

DDP_HOST_DEVICE inline Plan make_plan(int64_t n, int64_t inner) {
  Plan p;
  p.tx = static_cast<int>(pow2_at_least(inner < kMaxColumnThreads ? inner : kMaxColumnThreads));
  const int64_t max_ty = kBlockThreads / p.tx;
  const int64_t want_ty = pow2_at_least((n + kRowsPerThread - 1) / kRowsPerThread);
  p.ty = static_cast<int>(want_ty < max_ty ? want_ty : max_ty);
  p.tz = kBlockThreads / (p.tx * p.ty);
  p.chunk_rows = p.ty * kRowsPerThread;
  p.chunks = n == 0 ? 1 : (n + p.chunk_rows - 1) / p.chunk_rows;
  p.col_tiles = (inner + p.tx - 1) / p.tx;
  return p;
}

// Where thread t of a block sits: column x, row y within its tile, tile z of the block.
struct Slot {
  int x, y, z;
};
DDP_HOST_DEVICE inline Slot slot_of(const Plan& p, int t) {
  return {t % p.tx, (t / p.tx) % p.ty, t / (p.tx * p.ty)};
}

struct Tile {
  int64_t outer, chunk, col0;
};
DDP_HOST_DEVICE inline Tile tile_at(const Plan& p, int64_t tile) {
  const int64_t col_tile = tile % p.col_tiles;
  const int64_t rest = tile / p.col_tiles;
  return {rest / p.chunks, rest % p.chunks, col_tile * p.tx};
}

// Index of the output (or partial) of tile `t`'s column `col`: [outer, chunks, inner].
DDP_HOST_DEVICE inline int64_t out_index(const Plan& p, const Tile& t, int64_t col, int64_t inner) {
  return (t.outer * p.chunks + t.chunk) * inner + col;
}

// ---- reducers: identity, load, combine (in the fixed order above), finish -----------

struct Sum {
  using Acc = double;
  DDP_HOST_DEVICE static Acc identity() { return 0.0; }
  DDP_HOST_DEVICE static Acc load(const float* x, int64_t index, int64_t) { return x[index]; }
  DDP_HOST_DEVICE static Acc load(const Acc* x, int64_t index, int64_t) { return x[index]; }
  DDP_HOST_DEVICE static Acc combine(Acc a, Acc b) { return a + b; }
  DDP_HOST_DEVICE static float finish(Acc a) { return static_cast<float>(a); }
};

// The CPU's rule as a total order, so any combination order gives the CPU's answer:
// the first NaN is the maximum; among equal values the first index wins.
struct ArgmaxAcc {
  float value;
  int64_t index;  // -1: no element yet
};
struct Argmax {
  using Acc = ArgmaxAcc;
  DDP_HOST_DEVICE static Acc identity() { return {0.0f, -1}; }
  DDP_HOST_DEVICE static Acc load(const float* x, int64_t index, int64_t row) {
    return {x[index], row};
  }
  DDP_HOST_DEVICE static Acc load(const Acc* x, int64_t index, int64_t) { return x[index]; }
  DDP_HOST_DEVICE static bool beats(const Acc& a, const Acc& b) {
    const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
    if (a_nan != b_nan) return a_nan;
    if (!a_nan && a.value != b.value) return a.value > b.value;
    return a.index < b.index;
  }
  DDP_HOST_DEVICE static Acc combine(const Acc& a, const Acc& b) {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    return beats(b, a) ? b : a;
  }
  DDP_HOST_DEVICE static int64_t finish(const Acc& a) { return a.index < 0 ? 0 : a.index; }
};

// The serial part of one thread: its rows of tile `t`, column t.col0 + s.x, in row order.
template <typename R, typename In>
DDP_HOST_DEVICE typename R::Acc thread_partial(const In* x, const Plan& p, const Tile& t,
                                               const Slot& s, int64_t n, int64_t inner) {
  typename R::Acc acc = R::identity();
  const int64_t col = t.col0 + s.x;
  if (col >= inner) return acc;
  const int64_t first = t.chunk * p.chunk_rows;
  const int64_t end = first + p.chunk_rows < n ? first + p.chunk_rows : n;
  for (int64_t row = first + s.y; row < end; row += p.ty) {
    acc = R::combine(acc, R::load(x, (t.outer * n + row) * inner + col, row));
  }
  return acc;
}

}  // namespace ddp::kernels::dim_reduce
