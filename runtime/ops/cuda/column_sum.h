// The partition of the column sums over rows on CUDA (layer_norm_backward's
// grad_weight and grad_bias), shared by the kernel in transformer.cu and the unit
// test that replays it on the CPU (tests/unit/column_sum_test.cpp). Plain C++ plus
// host/device markers: no CUDA headers, so the test compiles without nvcc.
//
// Note [column sums]: out[j] = sum over rows r of f(r, j) for a [rows, d] layout.
// Rows are cut into chunks of kChunkRows; a tile is (one chunk, kColThreads
// consecutive columns) and one block of kColThreads x kRowThreads threads runs it:
// thread (x, y) adds rows y, y + kRowThreads, ... of the chunk for column x, in row
// order, then a fixed tree over y (strides 4, 2, 1) combines the kRowThreads
// partials into partials[chunk, column]. A second pass adds each column's
// partials in chunk order. Everything accumulates in double. The partition depends
// only on (rows, d), never on the GPU or the grid size, and there are no atomics:
// the same input gives the same bits on every run and every GPU.
#pragma once

#include "runtime/host_device.h"

#include <cstdint>

namespace ddp::kernels::column_sum {

inline constexpr int kColThreads = 32;  // one warp along the columns: coalesced reads
inline constexpr int kRowThreads = 8;
inline constexpr int kBlockThreads = kColThreads * kRowThreads;
inline constexpr int64_t kRowsPerThread = 16;
inline constexpr int64_t kChunkRows = kRowThreads * kRowsPerThread;

struct Plan {
  int64_t chunks = 1;     // chunks of rows (at least 1, so no rows still writes zeros)
  int64_t col_tiles = 1;  // tiles of kColThreads columns
  DDP_HOST_DEVICE int64_t tiles() const { return chunks * col_tiles; }
};

DDP_HOST_DEVICE inline Plan make_plan(int64_t rows, int64_t d) {
  Plan p;
  p.chunks = rows == 0 ? 1 : (rows + kChunkRows - 1) / kChunkRows;
  p.col_tiles = (d + kColThreads - 1) / kColThreads;
  return p;
}

struct Tile {
  int64_t chunk, col0;
};
DDP_HOST_DEVICE inline Tile tile_at(const Plan& p, int64_t tile) {
  return {tile / p.col_tiles, (tile % p.col_tiles) * kColThreads};
}

// The rows thread y of a tile adds, in this order: first, first + step, ... < end.
struct RowSpan {
  int64_t first, end, step;
};
DDP_HOST_DEVICE inline RowSpan thread_rows(const Tile& t, int y, int64_t rows) {
  const int64_t first = t.chunk * kChunkRows;
  const int64_t end = first + kChunkRows < rows ? first + kChunkRows : rows;
  return {first + y, end, kRowThreads};
}

// Where partials[chunk, col] lives: [chunks, d].
DDP_HOST_DEVICE inline int64_t partial_index(int64_t chunk, int64_t col, int64_t d) {
  return chunk * d + col;
}

}  // namespace ddp::kernels::column_sum
