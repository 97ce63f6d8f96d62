// Note [cpu kernel clones]: the AVX2 / AVX-512 copies of the CPU kernels compute
// the bits of the plain x86-64 one. This file is built for plain x86-64 and
// without FMA contraction, so each reference below, written in the kernel's own
// order of operations, gives the default copy's bits; the kernels run whichever
// copy this CPU selects (named in the output). A copy that fused a * b + c into an
// FMA, or reordered a sum, differs in the last bit on some element.
#include "runtime/ops/nn_ops.h"
#include "runtime/ops/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <vector>

namespace ddp {
namespace {

const char* selected_copy() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4 (AVX-512)";
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3 (AVX2, FMA)";
#endif
  return "default";
}

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// 1,003 elements: vector bodies and a remainder for every vector width.
constexpr int64_t kN = 1003;

TEST(CpuClones, SgdAndAxpyEqualTheScalarOrderBitForBit) {
  std::cout << "[ info ] CPU kernel copy on this machine: " << selected_copy() << "\n";
  const Tensor p0 = randn({kN}, 1), g = randn({kN}, 2), b0 = randn({kN}, 3);
  const std::vector<float> pv = p0.to_vector<float>(), gv = g.to_vector<float>(),
                           bv = b0.to_vector<float>();
  const kernels::SgdStep s{.lr = 0.037f,
                           .momentum = 0.9f,
                           .weight_decay = 0.013f,
                           .nesterov = true,
                           .first_step = false};
  Tensor p = p0.clone(), buf = b0.clone();
  sgd_update_(p, g, buf, s);
  std::vector<float> want_p = pv, want_b = bv;
  for (size_t i = 0; i < want_p.size(); ++i) {
    const float d = gv[i] + s.weight_decay * want_p[i];
    const float b = s.momentum * want_b[i] + d;
    want_b[i] = b;
    want_p[i] -= s.lr * (d + s.momentum * b);
  }
  EXPECT_EQ(bits(p.to_vector<float>()), bits(want_p)) << "sgd (nesterov) on " << selected_copy();
  EXPECT_EQ(bits(buf.to_vector<float>()), bits(want_b)) << "sgd momentum on " << selected_copy();

  Tensor y = p0.clone();
  axpy_(0.3f, g, y);
  std::vector<float> want_y = pv;
  for (size_t i = 0; i < want_y.size(); ++i) want_y[i] += 0.3f * gv[i];
  EXPECT_EQ(bits(y.to_vector<float>()), bits(want_y)) << "axpy on " << selected_copy();
}

TEST(CpuClones, AdamWEqualsTheScalarOrderBitForBit) {
  const Tensor p0 = randn({kN}, 4), g = randn({kN}, 5), m0 = randn({kN}, 6);
  const Tensor v0 = mul(randn({kN}, 7), randn({kN}, 7));  // squares: v >= 0
  const kernels::AdamWStep s{
      .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 3};
  Tensor p = p0.clone(), m = m0.clone(), v = v0.clone();
  adamw_update_(p, g, m, v, s);
  std::vector<float> pv = p0.to_vector<float>(), mv = m0.to_vector<float>(),
                     vv = v0.to_vector<float>();
  const std::vector<float> gv = g.to_vector<float>();
  const double t = static_cast<double>(s.step);
  const auto decay = static_cast<float>(1.0 - static_cast<double>(s.lr) * s.weight_decay);
  const auto step_size = static_cast<float>(s.lr / (1.0 - std::pow(double{s.beta1}, t)));
  const auto bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(double{s.beta2}, t)));
  const auto c1 = static_cast<float>(1.0 - s.beta1), c2 = static_cast<float>(1.0 - s.beta2);
  for (size_t i = 0; i < pv.size(); ++i) {
    const float mi = s.beta1 * mv[i] + c1 * gv[i];
    const float vi = s.beta2 * vv[i] + c2 * gv[i] * gv[i];
    mv[i] = mi;
    vv[i] = vi;
    pv[i] = pv[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + s.eps);
  }
  EXPECT_EQ(bits(p.to_vector<float>()), bits(pv)) << "adamw on " << selected_copy();
  EXPECT_EQ(bits(m.to_vector<float>()), bits(mv)) << "adamw exp_avg on " << selected_copy();
  EXPECT_EQ(bits(v.to_vector<float>()), bits(vv)) << "adamw exp_avg_sq on " << selected_copy();
}

}  // namespace
}  // namespace ddp
