// The vectorized elementwise map of the CUDA kernels: out[i] = f(in0[i], in1[i], ...)
// with every array read and written in 16-byte vectors. Shared by the kernel in
// launch.cuh (map_elements) and the unit test that replays it on the CPU
// (tests/unit/vec_map_test.cpp). Plain C++ plus host/device markers: no CUDA
// headers, so the test compiles without nvcc.
//
// Note [vectorized elementwise]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A memory-bound kernel moves bytes at the rate of the bytes it keeps in flight
// (Little's law: bandwidth x latency). A Hopper GPU needs several MB in flight
// (H200: 4.8 TB/s x ~0.7 us), and holds about 132 x 2048 resident threads; one
// 2-byte load per thread at a time (a bf16 grid-stride loop: the compiler cannot
// move the next element's load above this element's store, which may alias it)
// keeps ~0.5 MB in flight: a fraction of the bandwidth. So each thread here loads
// a whole vector of every input (16 bytes of the narrowest type, as Pack) before it
// computes, then stores a vector: ~16-32 bytes per array in flight per thread (16-byte
// accesses and several independent loads in flight before the first use: NVIDIA's
// CUDA C++ Best Practices Guide on coalescing and memory-level parallelism; llm.c's
// Packed128 and PyTorch's vectorized elementwise kernels do the same).
//
// The partition: with V elements per vector, vector k = thread, thread + threads,
// ... covers elements [kV, kV + V) of the first floor(n / V) V; the last n mod V
// elements are the tail, element vectors*V + thread (one each, for the first
// threads). Each element is computed exactly once, by the same per-element
// function as before, so the values are the scalar kernel's bits. A vector is one
// access where every array's address is aligned to V elements (the caching
// allocator's blocks are 512-byte aligned; a view may not be: map_whole()), else its
// V elements are loaded and stored one by one (load_at, store_at below): the same
// partition and values, only slower.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define DDP_VEC_HD __host__ __device__ __forceinline__
#else
#define DDP_VEC_HD inline
#endif
#if defined(__CUDA_ARCH__)  // the device pass (the host compiler does not know it)
#define DDP_VEC_UNROLL _Pragma("unroll")
#else
#define DDP_VEC_UNROLL
#endif

namespace ddp::kernels::cuda::vec {

inline constexpr int kVectorBytes = 16;

// V elements of T, aligned as one access of V * sizeof(T) bytes.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Elements per vector for these element types: a 16-byte vector of the narrowest
// (the wider arrays move 2 or 4 vectors per thread).
template <typename... T>
constexpr int widest_map() {
  static_assert(((sizeof(T) <= kVectorBytes) && ...), "an element wider than a vector");
  size_t narrowest = kVectorBytes;
  ((narrowest = sizeof(T) < narrowest ? sizeof(T) : narrowest), ...);
  return static_cast<int>(kVectorBytes / narrowest);
}

// Whether p can be read or written V elements at a time.
template <int V, typename T>
DDP_VEC_HD bool aligned_for(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * V) == 0;
}

// Whether every array is aligned for vectors of V (Note [vectorized elementwise]).
template <int V, typename Out, typename... In>
DDP_VEC_HD bool map_whole(const Out* out, const In*... in) {
  return aligned_for<V>(out) && (aligned_for<V>(in) && ...);
}

// The V elements at p: one access when `whole` (p aligned for them), else V.
template <int V, typename T>
DDP_VEC_HD Pack<T, V> load_at(const T* p, bool whole) {
  if (whole) return *reinterpret_cast<const Pack<T, V>*>(p);
  Pack<T, V> r;
  DDP_VEC_UNROLL
  for (int e = 0; e < V; ++e) r.v[e] = p[e];
  return r;
}
template <int V, typename T>
DDP_VEC_HD void store_at(T* p, const Pack<T, V>& v, bool whole) {
  if (whole) {
    *reinterpret_cast<Pack<T, V>*>(p) = v;
    return;
  }
  DDP_VEC_UNROLL
  for (int e = 0; e < V; ++e) p[e] = v.v[e];
}

// The per-element function over whole packs: all inputs are in registers by now.
template <int V, typename Out, typename F, typename... In>
DDP_VEC_HD Pack<Out, V> apply_pack(const F& f, const Pack<In, V>&... p) {
  Pack<Out, V> o;
  DDP_VEC_UNROLL
  for (int j = 0; j < V; ++j) o.v[j] = f(p.v[j]...);
  return o;
}

// One thread's share of the map (`thread` of `threads`), in the partition above;
// whole: map_whole of the arrays. The kernel calls it with its global index and the
// grid's size; the CPU test calls it for every thread of a grid.
template <int V, typename F, typename Out, typename... In>
DDP_VEC_HD void map_thread(int64_t thread, int64_t threads, int64_t n, bool whole, const F& f,
                           Out* out, const In*... in) {
  const int64_t vectors = n / V;
  for (int64_t k = thread; k < vectors; k += threads) {
    // The loads are the arguments: every vector is read before f runs.
    store_at<V>(out + k * V, apply_pack<V, Out>(f, load_at<V>(in + k * V, whole)...), whole);
  }
  for (int64_t i = vectors * V + thread; i < n; i += threads) out[i] = f(in[i]...);
}

// Note [vectorized rows]: a row kernel (one block per row) over a row of `len`
// elements that starts `first` elements into its tensor (r * d for row r of a
// [rows, d] tensor) cuts it by element index: a head (the elements before the next
// multiple of V, at most V - 1), whole vectors of V, and a tail (at most V - 1).
// Thread t takes head element t, vectors t, t + threads, ..., then tail element t,
// always in that order. The cut depends only on (first, len), never on where the
// tensor lies in memory, so a row reduction over it gives the same bits whatever
// the layout (a view, DDP's bucket of gradients) and run to run. Where the tensor's
// base is aligned for V elements (`whole`, checked once per launch) a vector is one
// 16-byte access; elsewhere its V elements are loaded one by one: the same values
// in the same order, only slower. Every array a kernel reads or writes through one
// row's cut must share the tensor's indexing (all [rows, d], or all one chunk).
struct RowSplit {
  int64_t head, vectors, tail;
};
template <int V>
DDP_VEC_HD RowSplit split_row(int64_t first, int64_t len) {
  const int64_t into = first % V;
  int64_t head = into == 0 ? 0 : V - into;
  if (head > len) head = len;
  const int64_t vectors = (len - head) / V;
  return {head, vectors, len - head - vectors * V};
}

// Thread `thread` of `threads` over the row at `row` (its tensor's element `first`),
// cut as above: element(j) for each of its head and tail elements, vector(j0, pack)
// for each of its vectors (pack: the row's elements j0 .. j0 + V - 1, loaded before
// vector runs), in the order head, vectors, tail. `whole`: the tensor's base is
// aligned for V (so is row + j0 for every vector).
template <int V, typename T, typename Element, typename Vector>
DDP_VEC_HD void row_thread(const T* row, int64_t first, int64_t len, bool whole, int64_t thread,
                           int64_t threads, Element&& element, Vector&& vector) {
  const RowSplit split = split_row<V>(first, len);
  for (int64_t j = thread; j < split.head; j += threads) element(j);
  for (int64_t k = thread; k < split.vectors; k += threads) {
    const int64_t j0 = split.head + k * V;
    const Pack<T, V> pack = load_at<V>(row + j0, whole);
    vector(j0, pack);
  }
  const int64_t tail0 = split.head + split.vectors * V;
  for (int64_t j = thread; j < split.tail; j += threads) element(tail0 + j);
}

// Threads a launch needs for one sweep: one per vector, and one per tail element.
inline int64_t map_threads(int64_t n, int width) {
  const int64_t vectors = n / width, tail = n % width;
  return vectors > tail ? vectors : tail;
}

}  // namespace ddp::kernels::cuda::vec
