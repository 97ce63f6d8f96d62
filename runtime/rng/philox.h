// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11), shared by the CPU and CUDA kernels so both give the same stream.
//
// Note [rng stream]: element i of a tensor filled with (seed, offset) takes word
// i % 4 of philox(counter = offset + i / 4, key = seed), the 64-bit counter in
// words 0 (low) and 1 (high). Uniform: (word >> 8) * 2^-24 in [0, 1). Normal:
// Box-Muller on word pairs (0,1) and (2,3) of the same counter. A tensor of n
// elements uses ceil(n / 4) counters, so the next fill should start at
// offset + philox_counters(n).
#pragma once

#include "runtime/host_device.h"

#include <cmath>
#include <cstdint>

namespace ddp::rng {

struct Philox4 {
  uint32_t v[4];
};

DDP_HOST_DEVICE_INLINE uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

DDP_HOST_DEVICE_INLINE Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo(kM0, ctr.v[0], &hi0);
    const uint32_t lo1 = mulhilo(kM1, ctr.v[2], &hi1);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// The four words for counter index `c` of stream `seed`.
DDP_HOST_DEVICE_INLINE Philox4 philox_block(uint64_t seed, uint64_t c) {
  return philox4x32_10(Philox4{{static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0u, 0u}},
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

DDP_HOST_DEVICE_INLINE float uniform_from_word(uint32_t w) {
  return static_cast<float>(w >> 8) * (1.0f / 16777216.0f);
}

// Box-Muller on two words; u1 in (0, 1] so log() is finite.
DDP_HOST_DEVICE_INLINE void normal_pair(uint32_t w1, uint32_t w2, float* n1, float* n2) {
  const float u1 = static_cast<float>((w1 >> 8) + 1u) * (1.0f / 16777216.0f);
  const float u2 = static_cast<float>(w2 >> 8) * (1.0f / 16777216.0f);
  const float r = sqrtf(-2.0f * logf(u1));
  const float theta = 6.2831853071795864769f * u2;
  *n1 = r * cosf(theta);
  *n2 = r * sinf(theta);
}

DDP_HOST_DEVICE_INLINE uint64_t philox_counters(uint64_t numel) {
  return (numel + 3) / 4;
}

}  // namespace ddp::rng
