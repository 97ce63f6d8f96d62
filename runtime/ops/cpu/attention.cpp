// CPU kernels of the packed causal self-attention (Note [packed attention] in
// ops/transformer_ops.h) and the sum of squares behind gradient-norm clipping.
#include "runtime/ops/kernels.h"

#include <algorithm>
#include <array>

namespace ddp::kernels::cpu {

void attention_forward(const Tensor&, int64_t, Tensor&, Tensor&) {
  DDP_ASSERT(false, "attention_forward: the CPU kernel is not written yet");
}

void attention_backward(const Tensor&, const Tensor&, const Tensor&, int64_t, Tensor&) {
  DDP_ASSERT(false, "attention_backward: the CPU kernel is not written yet");
}

// Blocks of 16 independent f32 lanes (so the loop vectorizes and no add waits for the
// previous one), each block's lanes folded into a double: a block is short enough for
// f32, and the double total keeps a 100M-element gradient exact to f32 precision.
void sum_squares(const Tensor& x, Tensor& out) {
  constexpr int64_t kLanes = 16, kBlock = 1024;
  const float* p = x.data<float>();
  const int64_t n = x.numel();
  double total = 0.0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = std::min(n, start + kBlock);
    std::array<float, kLanes> lanes{};
    int64_t i = start;
    for (; i + kLanes <= end; i += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += p[i + l] * p[i + l];
    double block = 0.0;
    for (; i < end; ++i) block += static_cast<double>(p[i]) * p[i];
    for (float lane : lanes) block += lane;
    total += block;
  }
  *out.data<float>() = static_cast<float>(total);
}

}  // namespace ddp::kernels::cpu
