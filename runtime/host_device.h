// Markers for code that nvcc compiles for both the host and the device: the
// per-element maths and the kernels' plans that a CPU unit test replays
// (runtime/rng/philox.h, runtime/ops/cuda/column_sum.h, dim_reduce.h). Plain C++
// where the compiler is not nvcc, so those headers build without CUDA. Defined
// once here: two headers defining the same macro differently fail to build
// together (-Werror), as the unit tests' unity build showed.
#pragma once

#if defined(__CUDACC__)
#define DDP_HOST_DEVICE __host__ __device__
#define DDP_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#define DDP_HOST_DEVICE
#define DDP_HOST_DEVICE_INLINE inline
#endif
