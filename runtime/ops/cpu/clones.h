// DDP_CPU_CLONES: the CPU's elementwise kernels compiled three times, dispatched
// once per process by the CPU they run on.
#pragma once

// Note [cpu kernel clones]
// ddp builds for plain x86-64 (SSE2: 4 floats a vector), so that one binary runs
// on every x86 machine, and GCC vectorizes the CPU's loops (ReLU, pooling, the
// optimizers, GELU, LayerNorm, softmax, ...) for that. DDP_CPU_CLONES puts a
// function through GCC's target_clones: an x86-64-v4 copy (AVX-512), an x86-64-v3
// copy (AVX2, FMA) and the default, chosen by the dynamic loader (an ifunc) from
// the CPU's features; what those functions inline is compiled for the same ISA.
// oneDNN and OpenBLAS pick their own kernels at run time already.
//
// The copies compute the same bits: without -ffast-math GCC vectorizes only what
// keeps IEEE results (elementwise lanes; it does not reorder a float sum), and the
// project builds with -ffp-contract=off (CMakeLists.txt) so that the AVX2 and
// AVX-512 copies do not fuse a * b + c into one FMA, which rounds once instead of
// twice. Ranks on different CPUs (mpirun across machines) therefore update their
// parameters identically, as the tests on one machine assume.
//
// Off for other compilers and architectures, and in sanitizer builds (ifunc
// resolvers run before the sanitizer's runtime is set up); DDP_NO_CPU_CLONES
// turns it off by hand.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) && !defined(DDP_NO_CPU_CLONES)
#define DDP_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DDP_CPU_CLONES
#endif

// A helper of a DDP_CPU_CLONES function, inlined into each copy so that it is
// compiled for that copy's ISA too (a call would reach the plain x86-64 code).
#define DDP_CPU_INLINE [[gnu::always_inline]] inline
