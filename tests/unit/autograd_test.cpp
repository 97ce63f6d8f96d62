// Gradients of every differentiable op and layer against central finite
// differences of the forward, accumulated in double.
#include "runtime/autograd/functions.h"
#include "runtime/memory/allocator.h"
#include "runtime/nn/layers.h"
#include "runtime/ops/cpu/onednn.h"
#include "runtime/ops/multi_tensor.h"
#include "runtime/ops/nn_ops.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "runtime/profile.h"
#include "tests/unit/gradcheck.h"
#include "tests/unit/pending_gradients.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <vector>

namespace ddp {
namespace {

namespace F = functional;

// DDP_VIRTUAL_CPU_DEVICES=2 for one test's scope (Note [virtual cpu devices]): unset
// again even when the test throws, so that no later test sees two CPU devices.
struct TwoCpuDevices {
  TwoCpuDevices() { setenv("DDP_VIRTUAL_CPU_DEVICES", "2", 1); }
  ~TwoCpuDevices() { unsetenv("DDP_VIRTUAL_CPU_DEVICES"); }
  TwoCpuDevices(const TwoCpuDevices&) = delete;
  TwoCpuDevices& operator=(const TwoCpuDevices&) = delete;
};
using test_util::gradcheck;

// Random values at least `gap` away from zero: finite differences across the kink
// of relu or a max would measure neither side.
Tensor away_from_zero(const Shape& shape, uint64_t seed, float gap = 0.05f) {
  auto v = randn(shape, seed).to_vector<float>();
  for (float& x : v) x += x >= 0 ? gap : -gap;
  return from_vector(v, shape);
}

Tensor leaf(Tensor t) {
  set_requires_grad(t, true);
  return t;
}

using test_util::PendingGradients;

// Note [accumulating into a pending gradient]: a node that hands the same tensor to
// two inputs (AddBackward) never makes the engine skip an add; a gradient is skipped
// only when it is the one handed to that node for that input.
TEST(Autograd, PendingGradientsNeverDropAGradient) {
  for (const bool on : {false, true}) {
    SCOPED_TRACE(on ? "handing out" : "off");
    const PendingGradients switch_(on);
    Tensor x = from_vector(std::vector<float>{1.0f, -2.0f}, {2});
    const Tensor z = from_vector(std::vector<float>{3.0f, 4.0f}, {2});
    set_requires_grad(x, true);
    backward(F::sum(F::add(x, x)));
    EXPECT_EQ(grad(x).to_vector<float>(), (std::vector<float>{2.0f, 2.0f}));
    set_grad(x, Tensor());
    backward(F::sum(F::add(x, F::add(x, z))));
    EXPECT_EQ(grad(x).to_vector<float>(), (std::vector<float>{2.0f, 2.0f}));
    set_grad(x, Tensor());
    backward(F::sum(F::add(x, F::sub(x, z))));
    EXPECT_EQ(grad(x).to_vector<float>(), (std::vector<float>{2.0f, 2.0f}));
  }
}

// A residual and a LayerNorm of it, also used once more after: the LayerNorm adds into
// the waiting gradient (one add fewer) and every gradient keeps its bits.
TEST(Autograd, PendingGradientsKeepTheBitsOfTheAdds) {
  std::vector<std::vector<float>> grads;
  std::vector<int64_t> adds;
  for (const bool on : {false, true}) {
    const PendingGradients switch_(on);
    Tensor x = randn({3, 8}, 1), w = randn({8}, 2), b = randn({8}, 3);
    for (Tensor* t : {&x, &w, &b}) set_requires_grad(*t, true);
    const Tensor r = randn({3, 8}, 4), q = randn({3, 8}, 5);
    const Tensor h = F::scale(x, 1.5f);
    const Tensor out = F::add(F::add(h, F::mul(F::layer_norm(h, w, b), r)), h);
    const Tensor loss = F::sum(F::mul(out, q));
    profile::start();
    backward(loss);
    int64_t binary = 0;
    for (const profile::OpTime& t : profile::stop().by_op()) {
      if (t.op == "binary") binary += t.calls;
    }
    adds.push_back(binary);
    std::vector<float> all;
    for (const Tensor* t : {&x, &w, &b}) {
      const auto v = grad(*t).to_vector<float>();
      all.insert(all.end(), v.begin(), v.end());
    }
    grads.push_back(std::move(all));
  }
  EXPECT_EQ(adds[0] - adds[1], 1) << "adds off " << adds[0] << ", on " << adds[1];
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(grads[0][i]), std::bit_cast<uint32_t>(grads[1][i]))
        << "element " << i;
  }
}

// Note [classifier gradient in place]: when nothing but the loss's backward holds the
// 16-bit logits, the gradient is written over them: the same bits as a backward that
// allocates it, one tensor fewer; a caller that keeps its logits keeps them unchanged.
// (The f32 path always writes over its own probabilities: Autograd.CrossEntropy's
// finite differences check it.)
TEST(Autograd, CrossEntropyWritesItsGradientOverLogitsNobodyKeeps) {
  const int64_t n = 64, c = 1000;
  const Tensor labels = from_vector(std::vector<int64_t>(static_cast<size_t>(n), 7), {n});
  struct Run {
    std::vector<float> grad;
    uint64_t allocations = 0;  // tensors the backward made
  };
  const auto run = [&](bool keep_logits) {
    Tensor x = randn({n, c}, 11);
    set_requires_grad(x, true);
    Tensor logits = F::cast(F::scale(x, 2.0f), DType::bf16);
    const std::vector<float> before = cast(logits, DType::f32).to_vector<float>();
    const Tensor loss = F::cross_entropy(logits, labels);
    if (!keep_logits) logits = Tensor();
    const uint64_t allocations = memory_stats(Device::cpu()).num_allocs;
    backward(loss);
    Run r{grad(x).to_vector<float>(), memory_stats(Device::cpu()).num_allocs - allocations};
    if (keep_logits) {
      EXPECT_EQ(cast(logits, DType::f32).to_vector<float>(), before)
          << "the caller's logits were overwritten";
    }
    return r;
  };
  const Run kept = run(true), dropped = run(false);
  EXPECT_EQ(dropped.grad, kept.grad);
  EXPECT_EQ(dropped.allocations + 1, kept.allocations)
      << "the backward of dropped logits allocated their gradient";
}

// The ops themselves: `overwrite` gives the same values in the input's memory, as a
// tensor of its own (no autograd state of the input's).
TEST(Autograd, CrossEntropyBackwardOverwriteGivesTheSameValuesInPlace) {
  const int64_t n = 6, c = 50;
  const Tensor labels = from_vector<int64_t>({0, 3, 49, 7, 7, 12}, {n});
  const Tensor g = full({}, 0.5);
  for (const DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor logits = cast(randn({n, c}, 13), dtype);
    const CrossEntropyResult r = softmax_cross_entropy(logits, labels);
    const Tensor saved = dtype == DType::f32 ? r.probs : logits;
    const auto backward_of = [&](const Tensor& t, bool overwrite) {
      return dtype == DType::f32
                 ? softmax_cross_entropy_backward(t, labels, g, overwrite)
                 : softmax_cross_entropy_backward_from_logits(t, r.lse, labels, g, overwrite);
    };
    const Tensor apart = backward_of(saved, false);
    EXPECT_NE(apart.data_ptr(), saved.data_ptr());
    const Tensor copy = saved.clone();
    const Tensor over = backward_of(copy, true);
    EXPECT_EQ(over.data_ptr(), copy.data_ptr());
    EXPECT_FALSE(over.is_same(copy)) << "the result is the input's own tensor";
    EXPECT_EQ(cast(over, DType::f32).to_vector<float>(),
              cast(apart, DType::f32).to_vector<float>());
  }
}

TEST(Autograd, ElementwiseOps) {
  gradcheck([](auto& in) { return F::add(in[0], in[1]); }, {randn({3, 4}, 1), randn({3, 4}, 2)});
  gradcheck([](auto& in) { return F::sub(in[0], in[1]); }, {randn({3, 4}, 1), randn({3, 4}, 2)});
  gradcheck([](auto& in) { return F::mul(in[0], in[1]); }, {randn({3, 4}, 1), randn({3, 4}, 2)});
  gradcheck([](auto& in) { return F::scale(in[0], -2.5f); }, {randn({5}, 3)});
  gradcheck([](auto& in) { return F::relu(in[0]); }, {away_from_zero({4, 5}, 4)}, 1e-2, 3e-3);
}

TEST(Autograd, MatmulLinearAndReductions) {
  gradcheck([](auto& in) { return F::matmul(in[0], in[1]); }, {randn({4, 6}, 5), randn({6, 3}, 6)});
  gradcheck([](auto& in) { return F::linear(in[0], in[1], in[2]); },
            {randn({5, 7}, 7), randn({3, 7}, 8), randn({3}, 9)});
  gradcheck([](auto& in) { return F::reshape(F::sum(in[0]), {1}); }, {randn({2, 3}, 10)});
  gradcheck([](auto& in) { return F::reshape(F::mean(in[0]), {1}); }, {randn({2, 3}, 11)});
  gradcheck([](auto& in) { return F::flatten(in[0]); }, {randn({2, 3, 2}, 12)});
}

// The sum's backward spreads its upstream gradient, whatever it is, to every element
// (it used to read it on the host with item(); now a device-side broadcast).
TEST(Autograd, SumSpreadsItsUpstreamGradient) {
  Tensor x = leaf(randn({2, 3}, 30));
  backward(F::sum(x), full({}, -2.5));
  for (float g : grad(x).to_vector<float>()) EXPECT_EQ(g, -2.5f);
  Tensor y = leaf(randn({4}, 31));
  backward(F::scale(F::sum(y), 3.0f));
  for (float g : grad(y).to_vector<float>()) EXPECT_EQ(g, 3.0f);
  Tensor z = leaf(randn({5}, 32));
  backward(F::mean(z), from_vector<float>({2.0f}, {1}));
  for (float g : grad(z).to_vector<float>()) EXPECT_FLOAT_EQ(g, 2.0f / 5.0f);
}

TEST(Autograd, CrossEntropy) {
  const Tensor labels = from_vector<int64_t>({2, 0, 1, 2}, {4});
  gradcheck([labels](auto& in) { return F::reshape(F::cross_entropy(in[0], labels), {1}); },
            {randn({4, 3}, 13)}, 1e-2, 3e-3);
}

TEST(Autograd, Conv2dWithStrideAndPadding) {
  for (auto [stride, pad] : {std::pair<int64_t, int64_t>{1, 1}, {2, 0}, {2, 1}}) {
    gradcheck(
        [stride, pad](auto& in) {
          return F::conv2d(in[0], in[1], in[2], {stride, pad});
        },
        {randn({2, 3, 6, 5}, 14), randn({4, 3, 3, 3}, 15), randn({4}, 16)}, 1e-2, 3e-3);
    // Without a bias (a conv followed by a norm layer): its own backward path.
    gradcheck(
        [stride, pad](auto& in) {
          return F::conv2d(in[0], in[1], Tensor(), {stride, pad});
        },
        {randn({2, 3, 6, 5}, 17), randn({4, 3, 3, 3}, 18)}, 1e-2, 3e-3);
  }
}

// unit.conv2d_without_onednn runs the Conv2d tests with DDP_ONEDNN=0: they must
// then take the per-image path (Note [conv per image]), not oneDNN's.
TEST(Autograd, Conv2dPathFollowsDdpOnednn) {
  const char* env = std::getenv("DDP_ONEDNN");
  if (env != nullptr && std::string(env) == "0") {
    EXPECT_FALSE(ddp::onednn_convolutions());
  } else if (env == nullptr && kernels::cpu::onednn::available()) {
    EXPECT_TRUE(ddp::onednn_convolutions());
  }
}

// Note [virtual cpu devices]: a convolution on cpu:1 runs there, forward and backward,
// on either CPU path (unit.conv2d_without_onednn runs this with DDP_ONEDNN=0, where the
// per-image path made its helper tensors on cpu and refused the mix), and gives cpu's
// values; so does an input without channels (oneDNN's path adds the bias alone).
TEST(Autograd, Conv2dOnAVirtualCpuDevice) {
  const TwoCpuDevices two;
  const Device cpu1{DeviceType::cpu, 1};
  for (const int64_t c : {int64_t{3}, int64_t{0}}) {
    const Tensor x = randn({2, c, 5, 5}, 60), w = randn({4, c, 3, 3}, 61), b = randn({4}, 62);
    Tensor x1 = leaf(x.to(cpu1)), w1 = leaf(w.to(cpu1)), b1 = leaf(b.to(cpu1));
    const Tensor y1 = F::conv2d(x1, w1, b1, {.stride = 1, .padding = 1});
    EXPECT_EQ(y1.device(), cpu1);
    backward(F::sum(y1));
    for (const Tensor* g : {&x1, &w1, &b1}) EXPECT_EQ(grad(*g).device(), cpu1);
    Tensor x0 = leaf(x), w0 = leaf(w), b0 = leaf(b);
    const Tensor y0 = F::conv2d(x0, w0, b0, {.stride = 1, .padding = 1});
    backward(F::sum(y0));
    EXPECT_EQ(y1.to_vector<float>(), y0.to_vector<float>());
    EXPECT_EQ(grad(w1).to_vector<float>(), grad(w0).to_vector<float>());
    EXPECT_EQ(grad(b1).to_vector<float>(), grad(b0).to_vector<float>());
  }
}

// Note [conv per image]: the forward against the definition, in double, for odd
// sizes, strides, padding, with and without bias; an empty batch has zero gradients.
TEST(Autograd, Conv2dForwardIsTheDirectConvolution) {
  const int64_t n = 3, c = 2, h = 7, w = 5, c_out = 4, kk = 3;
  const Tensor x = randn({n, c, h, w}, 41), weight = randn({c_out, c, kk, kk}, 42);
  const Tensor bias = randn({c_out}, 43);
  const auto xv = x.to_vector<float>(), wv = weight.to_vector<float>(),
             bv = bias.to_vector<float>();
  for (auto [stride, pad] : {std::pair<int64_t, int64_t>{1, 1}, {2, 0}, {2, 1}, {1, 0}}) {
    for (bool with_bias : {true, false}) {
      const Tensor y = F::conv2d(x, weight, with_bias ? bias : Tensor(), {stride, pad});
      const int64_t oh = (h + 2 * pad - kk) / stride + 1, ow = (w + 2 * pad - kk) / stride + 1;
      ASSERT_EQ(y.shape(), (Shape{n, c_out, oh, ow}));
      const auto yv = y.to_vector<float>();
      for (int64_t b = 0; b < n; ++b)
        for (int64_t o = 0; o < c_out; ++o)
          for (int64_t i = 0; i < oh; ++i)
            for (int64_t j = 0; j < ow; ++j) {
              double ref = with_bias ? bv[static_cast<size_t>(o)] : 0.0;
              for (int64_t ci = 0; ci < c; ++ci)
                for (int64_t u = 0; u < kk; ++u)
                  for (int64_t v = 0; v < kk; ++v) {
                    const int64_t r = i * stride - pad + u, q = j * stride - pad + v;
                    if (r < 0 || r >= h || q < 0 || q >= w) continue;
                    ref += static_cast<double>(
                               xv[static_cast<size_t>(((b * c + ci) * h + r) * w + q)]) *
                           wv[static_cast<size_t>(((o * c + ci) * kk + u) * kk + v)];
                  }
              const float got = yv[static_cast<size_t>(((b * c_out + o) * oh + i) * ow + j)];
              ASSERT_NEAR(got, ref, 1e-5 * (1.0 + std::fabs(ref)))
                  << "stride " << stride << " pad " << pad << " bias " << with_bias << " at (" << b
                  << ", " << o << ", " << i << ", " << j << ")";
            }
    }
  }
  Tensor empty_x = leaf(randn({0, c, h, w}, 44));
  Tensor wl = leaf(randn({c_out, c, kk, kk}, 45)), bl = leaf(randn({c_out}, 46));
  backward(F::sum(F::conv2d(empty_x, wl, bl, {1, 1})));
  for (float g : grad(wl).to_vector<float>()) EXPECT_EQ(g, 0.0f);
  for (float g : grad(bl).to_vector<float>()) EXPECT_EQ(g, 0.0f);
}

// A convolution with no output channels gives [N, 0, H', W'] and zero gradients, as
// torch's; the im2col paths (DDP_ONEDNN=0 on the CPU, and CUDA) divided by C_out
// (SIGFPE). unit.conv2d_without_onednn runs this without oneDNN.
TEST(Autograd, Conv2dWithoutOutputChannels) {
  Tensor x = leaf(randn({2, 3, 5, 5}, 63)), w = leaf(zeros({0, 3, 3, 3})), b = leaf(zeros({0}));
  const Tensor y = F::conv2d(x, w, b);
  EXPECT_EQ(y.shape(), (Shape{2, 0, 3, 3}));
  backward(F::sum(y));
  EXPECT_EQ(grad(x).to_vector<float>(), std::vector<float>(2 * 3 * 5 * 5, 0.0f));
  EXPECT_EQ(grad(w).shape(), w.shape());
  EXPECT_EQ(grad(b).shape(), b.shape());
}

TEST(Autograd, MaxPool) {
  gradcheck([](auto& in) { return F::max_pool2d(in[0], 2); }, {randn({2, 3, 6, 6}, 17)}, 1e-3,
            5e-3);
  gradcheck([](auto& in) { return F::max_pool2d(in[0], 3, 2); }, {randn({1, 2, 7, 7}, 18)}, 1e-3,
            5e-3);
}

TEST(Autograd, DropoutUsesItsMaskBothWays) {
  Generator gen(5);
  Tensor x = leaf(randn({1000}, 19));
  Tensor y = F::dropout(x, 0.25f, true, gen);
  backward(F::sum(y));
  const auto xv = x.to_vector<float>(), yv = y.to_vector<float>(), g = grad(x).to_vector<float>();
  int kept = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    if (yv[i] != 0.0f) {
      ++kept;
      EXPECT_NEAR(yv[i], xv[i] / 0.75f, 1e-6);
      EXPECT_NEAR(g[i], 1.0f / 0.75f, 1e-6);
    } else {
      EXPECT_EQ(g[i], 0.0f);
    }
  }
  EXPECT_NEAR(kept, 750, 5 * std::sqrt(1000 * 0.25 * 0.75));
  EXPECT_TRUE(F::dropout(x, 0.25f, false, gen).is_same(x)) << "eval mode is the identity";
}

TEST(Autograd, GradientsAccumulateAcrossBackwards) {
  Tensor w = leaf(randn({3}, 20));
  backward(F::sum(F::scale(w, 2.0f)));
  backward(F::sum(F::scale(w, 2.0f)));
  for (float g : grad(w).to_vector<float>()) EXPECT_EQ(g, 4.0f);
}

TEST(Autograd, SharedParameterSumsBothUsesAndHookFiresOnce) {
  Tensor w = leaf(randn({4}, 21));
  int calls = 0;
  register_post_accumulate_grad_hook(w, [&](Tensor& p) {
    ++calls;
    EXPECT_TRUE(grad(p).defined());
  });
  backward(F::sum(F::add(F::scale(w, 3.0f), F::mul(w, w))));
  EXPECT_EQ(calls, 1);
  const auto wv = w.to_vector<float>(), g = grad(w).to_vector<float>();
  for (size_t i = 0; i < wv.size(); ++i) EXPECT_NEAR(g[i], 3.0f + 2.0f * wv[i], 1e-5);
}

TEST(Autograd, LastLayerGradientsAreCompleteFirst) {
  Generator gen(1);
  nn::Sequential model;
  model.add(std::make_shared<nn::Linear>(8, 8, gen));
  model.add(std::make_shared<nn::ReLU>());
  model.add(std::make_shared<nn::Linear>(8, 8, gen));
  model.add(std::make_shared<nn::ReLU>());
  model.add(std::make_shared<nn::Linear>(8, 3, gen));
  std::vector<std::string> order;
  for (auto& [name, p] : model.named_parameters()) {
    Tensor param = p;
    register_post_accumulate_grad_hook(param,
                                       [&order, name = name](Tensor&) { order.push_back(name); });
  }
  for (int iteration = 0; iteration < 2; ++iteration) {
    order.clear();
    Tensor loss =
        F::cross_entropy(model(randn({5, 8}, 2)), from_vector<int64_t>({0, 1, 2, 0, 1}, {5}));
    backward(loss);
    ASSERT_EQ(order.size(), 6u) << "each hook fires exactly once per backward";
    EXPECT_TRUE(order[0].starts_with("4.") && order[1].starts_with("4.")) << order[0];
    EXPECT_TRUE(order[2].starts_with("2.") && order[3].starts_with("2.")) << order[2];
    EXPECT_TRUE(order[4].starts_with("0.") && order[5].starts_with("0.")) << order[4];
  }
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor w = leaf(randn({3}, 22));
  NoGradGuard guard;
  Tensor y = F::scale(w, 2.0f);
  EXPECT_FALSE(requires_grad(y));
  EXPECT_THROW(backward(F::sum(y)), ValueError);
}

TEST(Autograd, SecondBackwardThroughFreedGraphIsAnError) {
  Tensor w = leaf(randn({3}, 23));
  Tensor loss = F::sum(F::mul(w, w));
  backward(loss);
  try {
    backward(loss);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("backward through the graph a second time"),
              std::string::npos)
        << e.what();
  }
}

TEST(Autograd, NonScalarRootNeedsAGradient) {
  Tensor w = leaf(randn({3}, 24));
  EXPECT_THROW(backward(F::scale(w, 2.0f)), ValueError);
  backward(F::scale(w, 2.0f), ones({3}));
  for (float g : grad(w).to_vector<float>()) EXPECT_EQ(g, 2.0f);
  Tensor i = from_vector<int64_t>({1}, {1});
  EXPECT_THROW(set_requires_grad(i, true), ValueError);
}

// torch refuses a gradient for backward of another shape ("Mismatch in shape") or on
// another device ("invalid gradient at index 0 - expected device"), and casts one of
// another dtype. Before, the device mismatch put a cpu:1 .grad on a cpu parameter and
// the shape mismatch surfaced as an InternalError ("a bug in ddp").
TEST(Autograd, GradRootMustMatchItsTensor) {
  Tensor w = leaf(randn({2}, 25));
  {
    const TwoCpuDevices two;
    const Device cpu1{DeviceType::cpu, 1};
    try {
      backward(F::scale(w, 2.0f), ones({2}, {.device = cpu1}));
      ADD_FAILURE() << "a gradient on cpu:1 for a root on cpu was taken";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("grad_root is on cpu:1"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(grad(w).defined());
    try {
      backward(F::scale(w, 2.0f), ones({3}));
      ADD_FAILURE() << "a gradient of shape [3] for a root of shape [2] was taken";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("grad_root has shape [3]"), std::string::npos)
          << e.what();
    }
  }
  backward(F::scale(w, 2.0f), ones({2}, {.dtype = DType::bf16}));
  EXPECT_EQ(grad(w).dtype(), DType::f32);
  EXPECT_EQ(grad(w).device(), w.device());
  for (float g : grad(w).to_vector<float>()) EXPECT_EQ(g, 2.0f);
  // A one-element gradient of another shape ([] for [1, 1], [1] for []) is taken
  // as the root's shape, as a scalar loss's gradient is.
  Tensor m = leaf(randn({1, 1}, 26));
  backward(F::scale(m, 3.0f), full({}, 2.0));
  EXPECT_EQ(grad(m).shape(), (Shape{1, 1}));
  EXPECT_EQ(grad(m).to_vector<float>(), std::vector<float>{6.0f});
  Tensor s0 = leaf(full({}, 1.5));
  backward(s0, ones({1}));
  EXPECT_EQ(grad(s0).shape(), Shape{});
}

// Note [version counter]: every in-place op bumps its tensor's version, shared by the
// views of its memory; a new tensor or a clone starts at 0.
TEST(VersionCounter, InPlaceOpsBumpTheVersionOfEveryView) {
  Tensor t = zeros({4});
  EXPECT_EQ(t.version(), 0u);
  Tensor view = t.slice(1, 3);
  fill_(view, 1.0);
  EXPECT_EQ(t.version(), 1u);
  copy_(t, ones({4}));
  EXPECT_EQ(view.version(), 2u);
  axpy_(2.0f, ones({4}), t);
  EXPECT_EQ(t.version(), 3u);
  Tensor out = zeros({2, 2});
  matmul_out(ones({2, 2}), ones({2, 2}), out);
  EXPECT_EQ(out.version(), 1u);
  scale_by_({t}, full({1}, 0.5));
  EXPECT_EQ(t.version(), 4u);
  EXPECT_EQ(t.clone().version(), 0u);
  EXPECT_EQ(F::add(t, t).version(), 0u);
}

// torch's "one of the variables needed for gradient computation has been modified by
// an inplace operation": a tensor an op keeps for its backward, changed in place
// before that backward, is an error naming the op and the tensor, not a gradient
// from the new values (before: grad(x) = 2, the changed w, silently).
TEST(VersionCounter, ASavedTensorChangedInPlaceIsAnErrorAtBackward) {
  Tensor x = leaf(full({3}, 1.0)), w = leaf(full({3}, 4.0));
  Tensor loss = F::sum(F::mul(x, w));
  {
    NoGradGuard no_grad;  // an in-place write to a leaf, as an optimizer step
    fill_(w, 2.0);
  }
  try {
    backward(loss);
    FAIL() << "the backward ran on a changed tensor; grad(x) = "
           << grad(x).to_vector<float>().front();
  } catch (const ValueError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("MulBackward: a tensor its backward needs (f32 [3])"), std::string::npos)
        << what;
    EXPECT_NE(what.find("modified by an in-place operation"), std::string::npos) << what;
    EXPECT_NE(what.find("at version 1, the forward saw version 0"), std::string::npos) << what;
  }
  // A view of it changes it too.
  Tensor a = leaf(full({4}, 1.0)), b = full({4}, 3.0);
  Tensor loss2 = F::sum(F::mul(a, b));
  Tensor part = b.slice(0, 1);
  fill_(part, 0.0);
  EXPECT_THROW(backward(loss2), ValueError);
}

// The optimizer's step between a forward and its backward (the GAN mistake torch
// names): the linear layer's weight, which x's gradient needs, has changed.
TEST(VersionCounter, AnOptimizerStepBeforeTheBackwardOfAnEarlierForwardIsAnError) {
  Tensor w = leaf(randn({2, 3}, 40)), x = leaf(randn({4, 3}, 41));
  optim::AdamW opt({w}, {.lr = 0.1f});
  Tensor early = F::sum(F::linear(x, w, Tensor()));
  backward(F::sum(F::linear(x, w, Tensor())));
  opt.step();
  try {
    backward(early);
    FAIL() << "a backward through the weight before the step ran";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("LinearBackward: a tensor its backward needs (f32 [2, 3]"),
              std::string::npos)
        << e.what();
  }
  // The usual order (forward, backward, step, forward, backward) is untouched.
  for (int i = 0; i < 3; ++i) {
    backward(F::sum(F::linear(x, w, Tensor())));
    opt.step();
  }
}

// What no backward reads may change: add keeps nothing, so changing its input
// after the forward is fine (as in torch), and its gradient is the same.
TEST(VersionCounter, ChangingWhatNoBackwardKeepsIsFine) {
  Tensor a = leaf(full({3}, 1.0)), b = full({3}, 2.0);
  Tensor loss = F::sum(F::add(a, b));
  {
    NoGradGuard no_grad;  // an in-place write to a leaf, as an optimizer step
    fill_(a, 5.0);
  }
  copy_(b, full({3}, 7.0));
  backward(loss);
  for (float g : grad(a).to_vector<float>()) EXPECT_EQ(g, 1.0f);
  // A first layer's weight: its input needs no gradient, so its backward reads only
  // the input (torch saves only that too), and the weight's gradient is g^T x.
  Tensor w1 = leaf(randn({2, 3}, 42));
  const Tensor x1 = randn({4, 3}, 43);
  Tensor first = F::sum(F::linear(x1, w1, Tensor()));
  {
    NoGradGuard no_grad;  // an in-place write to a leaf, as an optimizer step
    fill_(w1, 9.0);
  }
  backward(first);
  const std::vector<float> xs = x1.to_vector<float>(), gw = grad(w1).to_vector<float>();
  for (int64_t o = 0; o < 2; ++o) {
    for (int64_t i = 0; i < 3; ++i) {
      float col = 0;
      for (int64_t r = 0; r < 4; ++r) col += xs[static_cast<size_t>(r * 3 + i)];
      EXPECT_NEAR(gw[static_cast<size_t>(o * 3 + i)], col, 1e-5f);
    }
  }
  // A clone changed instead of the saved tensor.
  Tensor w = leaf(full({3}, 4.0));
  Tensor y = F::sum(F::mul(a, w));
  Tensor copy = w.clone();
  fill_(copy, 0.0);
  backward(y);
  for (float g : grad(w).to_vector<float>()) EXPECT_EQ(g, 5.0f);
}

}  // namespace
}  // namespace ddp
