// The multi-tensor ops (runtime/ops/multi_tensor.h) on the CPU against the
// per-tensor ops and closed forms: the sum of squares of a list, the clip factor
// (torch's min(1, max / (norm + 1e-6)), none for a non-finite norm), the in-place
// scale, clip_grad_norm_on_device against clip_grad_norm_, AdamW over a list
// against one update per tensor, and AdamW taking the clip factor into its step (Note
// [clipping in the step]). tests/gpu/multi_tensor_gpu_test.cpp holds the CUDA kernels
// to these.
#include "runtime/ops/multi_tensor.h"

#include "runtime/autograd/autograd.h"
#include "runtime/ops/nn_ops.h"
#include "runtime/ops/ops.h"
#include "runtime/ops/transformer_ops.h"
#include "runtime/optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace ddp {
namespace {

std::vector<Tensor> some_tensors() {
  return {randn({3, 5}, 1), zeros({0}), randn({1}, 2), scale(randn({70, 3}, 3), 4.0f)};
}

TEST(MultiTensor, SumOfSquaresIsTheSumOverEveryTensor) {
  const std::vector<Tensor> xs = some_tensors();
  double want = 0.0;
  for (const Tensor& x : xs) {
    for (float v : x.to_vector<float>()) want += static_cast<double>(v) * v;
  }
  EXPECT_NEAR(sum_squares_all(xs).item<float>(), want, 1e-6 * want);
  std::string message;
  try {
    sum_squares_all({});
  } catch (const ValueError& e) {
    message = e.what();  // copied while the exception lives
  }
  EXPECT_NE(message.find("at least one tensor"), std::string::npos) << message;
}

TEST(MultiTensor, ClipFactorIsTorchsAndOneForANonFiniteNorm) {
  const ClipResult small = clip_factor(full({}, 0.25), 1.0);  // norm 0.5
  EXPECT_FLOAT_EQ(small.norm.item<float>(), 0.5f);
  EXPECT_FLOAT_EQ(small.factor.item<float>(), 1.0f);
  const ClipResult big = clip_factor(full({}, 16.0), 2.0);  // norm 4
  EXPECT_FLOAT_EQ(big.norm.item<float>(), 4.0f);
  EXPECT_FLOAT_EQ(big.factor.item<float>(), static_cast<float>(2.0 / (4.0 + 1e-6)));
  const ClipResult inf = clip_factor(full({}, std::numeric_limits<double>::infinity()), 1.0);
  EXPECT_TRUE(std::isinf(inf.norm.item<float>()));
  EXPECT_FLOAT_EQ(inf.factor.item<float>(), 1.0f);
  const ClipResult nan = clip_factor(full({}, std::nan("")), 1.0);
  EXPECT_TRUE(std::isnan(nan.norm.item<float>()));
  EXPECT_FLOAT_EQ(nan.factor.item<float>(), 1.0f);
}

TEST(MultiTensor, ScaleByMultipliesEveryTensorInPlace) {
  std::vector<Tensor> xs = some_tensors();
  std::vector<std::vector<float>> before;
  for (const Tensor& x : xs) before.push_back(x.to_vector<float>());
  scale_by_(xs, full({}, -0.5));
  for (size_t t = 0; t < xs.size(); ++t) {
    const auto after = xs[t].to_vector<float>();
    for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i], before[t][i] * -0.5f);
  }
}

TEST(MultiTensor, ClipOnTheDeviceMatchesClipGradNorm) {
  for (const double max_norm : {0.5, 1e6}) {  // clipped, and a norm under the limit
    std::vector<Tensor> a, b;
    for (const Tensor& g : some_tensors()) {
      Tensor pa = zeros(g.shape()), pb = zeros(g.shape());
      set_requires_grad(pa, true);
      set_requires_grad(pb, true);
      set_grad(pa, g.clone());
      set_grad(pb, g.clone());
      a.push_back(pa);
      b.push_back(pb);
    }
    const double want = optim::clip_grad_norm_(a, max_norm);
    const Tensor got = optim::clip_grad_norm_on_device(b, max_norm);
    // clip_grad_norm_ adds the tensors' f32 sums of squares in f32; the list op adds
    // every square in double: the norms agree to a few f32 roundings.
    EXPECT_NEAR(got.item<float>(), want, 1e-5 * want);
    for (size_t t = 0; t < a.size(); ++t) {
      const auto ga = grad(a[t]).to_vector<float>(), gb = grad(b[t]).to_vector<float>();
      for (size_t i = 0; i < ga.size(); ++i) EXPECT_NEAR(gb[i], ga[i], 1e-5 * std::fabs(ga[i]));
    }
    if (max_norm > 1e5) {  // under the limit: untouched
      for (size_t t = 0; t < a.size(); ++t) {
        EXPECT_EQ(grad(b[t]).to_vector<float>(), grad(a[t]).to_vector<float>());
      }
    }
  }
}

TEST(MultiTensor, AdamWOverAListIsAnUpdatePerTensor) {
  std::vector<Tensor> p1, p2, g, m1, m2, v1, v2;
  std::vector<kernels::AdamWStep> steps;
  uint64_t seed = 10;
  for (const Shape& shape : std::vector<Shape>{{4, 3}, {7}, {0}, {2, 2, 2}}) {
    const Tensor p = randn(shape, seed++), m = randn(shape, seed++), v = rand(shape, seed++);
    p1.push_back(p.clone());
    p2.push_back(p.clone());
    m1.push_back(m.clone());
    m2.push_back(m.clone());
    v1.push_back(v.clone());
    v2.push_back(v.clone());
    g.push_back(randn(shape, seed++));
    steps.push_back({.lr = 0.01f,
                     .weight_decay = 0.1f * static_cast<float>(steps.size()),
                     .step = static_cast<int64_t>(steps.size()) + 1});
  }
  adamw_update_all_(p2, g, m2, v2, steps);
  for (size_t i = 0; i < p1.size(); ++i) {
    adamw_update_(p1[i], g[i], m1[i], v1[i], steps[i]);
    EXPECT_EQ(p1[i].to_vector<float>(), p2[i].to_vector<float>()) << "tensor " << i;
    EXPECT_EQ(m1[i].to_vector<float>(), m2[i].to_vector<float>()) << "tensor " << i;
    EXPECT_EQ(v1[i].to_vector<float>(), v2[i].to_vector<float>()) << "tensor " << i;
  }
  std::vector<kernels::AdamWStep> bad = steps;
  bad[1].step = 0;
  EXPECT_THROW(adamw_update_all_(p2, g, m2, v2, bad), ValueError);
}

// Parameters shaped as some_tensors(), each with a gradient of its own (seeded).
std::vector<Tensor> params_with_grads(uint64_t seed) {
  std::vector<Tensor> ps;
  for (const Tensor& x : some_tensors()) {
    Tensor p = randn(x.shape(), seed++);
    set_requires_grad(p, true);
    set_grad(p, randn(x.shape(), seed++));
    ps.push_back(p);
  }
  return ps;
}

std::vector<std::vector<float>> values(const std::vector<Tensor>& xs) {
  std::vector<std::vector<float>> v;
  for (const Tensor& x : xs) v.push_back(x.to_vector<float>());
  return v;
}
std::vector<Tensor> grads_of(const std::vector<Tensor>& ps) {
  std::vector<Tensor> g;
  for (const Tensor& p : ps) g.push_back(grad(p));
  return g;
}

// Note [clipping in the step]: clip then step, the factor applied by the scale pass
// (a) or by AdamW as it reads the gradients (b), plain and capturable: the same
// parameters bit for bit, over three steps (each clipped: max_norm 0.5 < every norm);
// b's gradients keep their values.
TEST(MultiTensor, AdamWTakesTheClipFactorIntoItsStepWithTheSameBits) {
  for (const bool capturable : {false, true}) {
    std::vector<Tensor> a = params_with_grads(50), b = params_with_grads(50);
    optim::AdamW opt_a(a, {.lr = 0.1f}), opt_b(b, {.lr = 0.1f});
    opt_a.set_capturable(capturable);
    opt_b.set_capturable(capturable);
    for (int step = 0; step < 3; ++step) {
      if (step > 0) {  // this step's gradients, the same for both
        const std::vector<Tensor> fresh = params_with_grads(100 + 10 * step);
        for (size_t i = 0; i < a.size(); ++i) {
          set_grad(a[i], grad(fresh[i]).clone());
          set_grad(b[i], grad(fresh[i]).clone());
        }
      }
      const auto grads_before = values(grads_of(b));
      const float norm_a = optim::clip_grad_norm_on_device(a, 0.5).item<float>();
      const float norm_b = optim::clip_grad_norm_on_device(b, 0.5, &opt_b).item<float>();
      EXPECT_EQ(norm_a, norm_b);
      EXPECT_NE(values(grads_of(a)), grads_before) << "a's gradients were not clipped";
      EXPECT_EQ(values(grads_of(b)), grads_before) << "b's gradients were scaled in memory";
      opt_a.step();
      opt_b.step();
      ASSERT_EQ(values(a), values(b)) << "step " << step << ", capturable " << capturable;
    }
  }
}

// What takes the factor and what does not; a second factor before the step names the fix.
TEST(MultiTensor, TheClipFactorGoesToTheStepOnlyForTheOptimizersOwnParameters) {
  const std::vector<Tensor> ps = params_with_grads(90);
  optim::AdamW adamw(ps, {});
  // A subset of the optimizer's parameters: scaled in memory, AdamW not given the factor.
  const std::vector<Tensor> some(ps.begin(), ps.begin() + 2);
  const auto before = values(grads_of(some));
  optim::clip_grad_norm_on_device(some, 1e-3, &adamw);
  EXPECT_NE(values(grads_of(some)), before);
  // The same parameters in another order: taken; a second one before the step: refused.
  const std::vector<Tensor> reversed(ps.rbegin(), ps.rend());
  optim::clip_grad_norm_on_device(reversed, 1e-3, &adamw);
  std::string message;
  try {
    optim::clip_grad_norm_on_device(ps, 1e-3, &adamw);
  } catch (const ValueError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("waiting for the next step already; call step() between"),
            std::string::npos)
      << message;
  adamw.zero_grad();  // drops the factor with the gradients it was for
  EXPECT_NO_THROW(optim::clip_grad_norm_on_device(ps, 1e-3, &adamw));
  // SGD cannot: it scales the gradients as before.
  const std::vector<Tensor> qs = params_with_grads(90);
  optim::SGD sgd(qs, {});
  const auto sgd_before = values(grads_of(qs));
  optim::clip_grad_norm_on_device(qs, 1e-3, &sgd);
  EXPECT_NE(values(grads_of(qs)), sgd_before);
}

}  // namespace
}  // namespace ddp
