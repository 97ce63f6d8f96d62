// CudaGraph (runtime/cuda_graph.h) on a GPU: a replay equals the eager work, reads
// new data copied into its inputs, and a captured training step (forward, loss,
// backward, SGD with momentum) replays bit for bit as the eager step; a host read
// while capturing fails with CudaError and leaves the device and the allocator
// usable. The pool's rules are unit-tested on the CPU (unit.CapturePools.*). Without
// a GPU every test skips and says why.
#include "runtime/autograd/autograd.h"
#include "runtime/autograd/functions.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda_graph.h"
#include "runtime/error.h"
#include "runtime/memory/allocator.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "tests/gpu/require_gpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

namespace ddp {
namespace {

using gpu_test::kGpu;

Tensor forward(const Tensor& x, const Tensor& w) {
  const Tensor h = matmul(x, w);  // temporaries: allocated and freed while capturing
  return relu(add(h, scale(h, -0.5f)));
}

void expect_same_bits(const Tensor& a, const Tensor& b, const char* what) {
  const auto va = a.cpu().to_vector<float>(), vb = b.cpu().to_vector<float>();
  ASSERT_EQ(va.size(), vb.size()) << what;
  for (size_t i = 0; i < va.size(); ++i) ASSERT_EQ(va[i], vb[i]) << what << " element " << i;
}

TEST(CudaGraphGpu, AReplayRunsTheCapturedWorkOnNewInputs) {
  DDP_REQUIRE_REAL_CUDA("CUDA graphs");
  Tensor x = randn({64, 32}, 1, {.device = kGpu});
  const Tensor w = randn({32, 16}, 2, {.device = kGpu});
  forward(x, w);  // warm-up: the cuBLAS handle
  Tensor out;
  CudaGraph graph;
  graph.capture(kGpu, [&] { out = forward(x, w); });
  ASSERT_TRUE(graph.captured());
  graph.replay();
  expect_same_bits(out, forward(x, w), "first replay");
  copy_(x, randn({64, 32}, 3, {.device = kGpu}));
  graph.replay();
  expect_same_bits(out, forward(x, w), "replay after new input");
  EXPECT_FALSE(cuda_api::stream_is_capturing(0, graph.stream().handle()));
}

struct Mlp {
  Tensor w1, b1, w2, b2;
  explicit Mlp(uint64_t seed)
      : w1(scale(randn({64, 32}, seed, {.device = kGpu}), 0.2f)),
        b1(zeros({64}, {.device = kGpu})),
        w2(scale(randn({10, 64}, seed + 1, {.device = kGpu}), 0.2f)),
        b2(zeros({10}, {.device = kGpu})) {
    for (Tensor* p : {&w1, &b1, &w2, &b2}) set_requires_grad(*p, true);
  }
  std::vector<Tensor> params() const { return {w1, b1, w2, b2}; }
  Tensor loss(const Tensor& x, const Tensor& labels) const {
    return functional::cross_entropy(
        functional::linear(functional::relu(functional::linear(x, w1, b1)), w2, b2), labels);
  }
};

Tensor batch(int i) {
  return randn({128, 32}, 100 + i, {.device = kGpu});
}
Tensor labels(int i) {
  std::vector<int64_t> l(128);
  for (size_t j = 0; j < l.size(); ++j) l[j] = static_cast<int64_t>((j * 7 + i) % 10);
  return from_vector(l, {128}).to(kGpu);
}

// Note [captured optimizer steps]: the eager run takes a plain optimizer; the graphed
// one a capturable one whose prepare_step() runs before each replay, with a learning
// rate that changes every step (a schedule).
template <typename Make>
void check_captured_training(Make make) {
  constexpr int kSteps = 6;
  const auto lr_at = [](int i) { return 0.05f / static_cast<float>(1 + i); };
  Mlp eager(10), graphed(10);
  const std::unique_ptr<optim::Optimizer> eager_opt = make(eager.params());
  const std::unique_ptr<optim::Optimizer> graphed_opt = make(graphed.params());
  graphed_opt->set_capturable(true);
  std::vector<float> eager_losses;
  for (int i = 0; i < kSteps; ++i) {
    eager_opt->set_lr(lr_at(i));
    eager_opt->zero_grad(/*set_to_none=*/true);
    const Tensor loss = eager.loss(batch(i), labels(i));
    backward(loss);
    eager_opt->step();
    eager_losses.push_back(loss.cpu().item<float>());
  }

  // Step 0 eagerly (gradients and optimizer state made), then the step captured:
  // the old gradients are freed and new ones made while capturing (the pool's).
  Tensor x = batch(0), y = labels(0), loss;
  const auto forward_backward = [&] {
    graphed_opt->zero_grad(/*set_to_none=*/true);
    loss = graphed.loss(x, y);
    backward(loss);
  };
  graphed_opt->set_lr(lr_at(0));
  forward_backward();
  graphed_opt->step();
  EXPECT_EQ(loss.cpu().item<float>(), eager_losses[0]);
  CudaGraph graph;
  for (int i = 1; i < kSteps; ++i) {
    copy_(x, batch(i));
    copy_(y, labels(i));
    graphed_opt->set_lr(lr_at(i));
    graphed_opt->prepare_step();  // the host half, before the capture as before a replay
    if (!graph.captured()) {
      graph.capture(kGpu, [&] {
        forward_backward();
        graphed_opt->apply_step();
      });
    }
    graph.replay();
    EXPECT_EQ(loss.cpu().item<float>(), eager_losses[i]) << "step " << i;
  }
  EXPECT_EQ(graphed_opt->steps(), eager_opt->steps());
  const std::vector<Tensor> a = eager.params(), b = graphed.params();
  for (size_t p = 0; p < a.size(); ++p) expect_same_bits(a[p], b[p], "parameter");
}

TEST(CudaGraphGpu, ACapturedSgdStepReplaysBitForBitAsTheEagerStep) {
  DDP_REQUIRE_REAL_CUDA("CUDA graphs");
  check_captured_training([](const std::vector<Tensor>& ps) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::SGD>(ps, optim::SgdOptions{.lr = 0.05f, .momentum = 0.9f});
  });
}

TEST(CudaGraphGpu, ACapturedAdamWStepReplaysBitForBitAsTheEagerStep) {
  DDP_REQUIRE_REAL_CUDA("CUDA graphs");
  check_captured_training([](const std::vector<Tensor>& ps) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions{.lr = 0.05f});
  });
}

// Note [captured optimizer steps]: AdamW's device table over more tensors than one
// launch takes (40), empty ones among them, two weight decays and step counts that
// differ (parameter 5 has no gradient at the first step): a capturable AdamW, eager
// and then replayed, takes the plain one's steps bit for bit, state included.
TEST(CudaGraphGpu, ACapturableAdamWOverManyTensorsReplaysThePlainOne) {
  DDP_REQUIRE_REAL_CUDA("CUDA graphs");
  const auto make_params = [] {
    std::vector<Tensor> ps;
    for (int i = 0; i < 100; ++i) {
      const int64_t pick[] = {0, 1, 7, 8191, 8192, 8193, 30000};
      Tensor p = randn({pick[(i * 3) % 7]}, 500 + i, {.device = kGpu});
      set_requires_grad(p, true);
      ps.push_back(p);
    }
    return ps;
  };
  std::vector<Tensor> a = make_params(), b = make_params();
  const auto make = [](const std::vector<Tensor>& ps) {
    std::vector<optim::ParamGroup> groups(2);
    for (size_t i = 0; i < ps.size(); ++i) groups[i % 2].params.push_back(ps[i]);
    groups[0].weight_decay = 0.1f;
    return std::make_unique<optim::AdamW>(groups, optim::AdamWOptions{.lr = 0.01f});
  };
  const auto plain = make(a), capt = make(b);
  capt->set_capturable(true);
  const auto set_grads = [](std::vector<Tensor>& ps, int step) {
    for (size_t i = 0; i < ps.size(); ++i) {
      if (step == 0 && i == 5) continue;
      Tensor g = grad(ps[i]);
      const Tensor fresh = randn(ps[i].shape(), 9000 + 131 * step + i, {.device = kGpu});
      if (g.defined()) {
        copy_(g, fresh);  // in place: the captured update reads these tensors
      } else {
        set_grad(ps[i], fresh);
      }
    }
  };
  const auto states = [](const optim::Optimizer& o) {
    std::vector<Tensor> out;
    for (const auto& [name, t] : o.state()) out.push_back(t);
    return out;
  };
  CudaGraph graph;
  for (int step = 0; step < 5; ++step) {
    set_grads(a, step);
    set_grads(b, step);
    plain->set_lr(0.01f / static_cast<float>(1 + step));
    plain->step();
    capt->set_lr(0.01f / static_cast<float>(1 + step));
    if (step < 2) {
      capt->step();
    } else {
      capt->prepare_step();
      if (!graph.captured()) graph.capture(kGpu, [&] { capt->apply_step(); });
      graph.replay();
    }
    for (size_t i = 0; i < a.size(); ++i) expect_same_bits(a[i], b[i], "parameter");
    const std::vector<Tensor> sa = states(*plain), sb = states(*capt);
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < sa.size(); ++i) {
      if (sa[i].dtype() == DType::f32) {
        expect_same_bits(sa[i], sb[i], "state");
      } else {
        EXPECT_EQ(sa[i].to_vector<int64_t>(), sb[i].to_vector<int64_t>()) << "step counts";
      }
    }
  }
}

TEST(CudaGraphGpu, CapturingBeforeTheFirstUpdateIsNamed) {
  DDP_REQUIRE_REAL_CUDA("CUDA graphs");
  Mlp model(20);
  optim::SGD opt(model.params(), {.lr = 0.05f, .momentum = 0.9f});
  opt.set_capturable(true);
  const Tensor x = batch(0), y = labels(0);
  backward(model.loss(x, y));
  opt.prepare_step();
  CudaGraph graph;
  try {
    graph.capture(kGpu, [&] { opt.apply_step(); });
    ADD_FAILURE() << "a capture without SGD's momentum buffers";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("run one step before capturing"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(graph.captured());
}

// A host read inside a capture is refused by copy_ (naming the capture); a host wait
// breaks the capture in CUDA (CudaError). Either way the capture ends, its pool goes
// back, and the device, the stream and the allocator work as before.
TEST(CudaGraphGpu, AHostReadOrWaitWhileCapturingFailsAndLeavesTheDeviceUsable) {
  DDP_REQUIRE_REAL_CUDA("CUDA graphs");
  const Tensor x = randn({256}, 4, {.device = kGpu});
  sum(x).cpu();  // warm-up
  const uint64_t allocated = memory_allocated(kGpu);
  {
    CudaGraph graph;
    try {
      graph.capture(kGpu, [&] { (void)sum(x).cpu().item<float>(); });
      ADD_FAILURE() << "a copy to the host was captured";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("while a CUDA graph is being captured"),
                std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(graph.captured());
    EXPECT_THROW(graph.replay(), Error);
  }
  {
    CudaGraph graph;
    EXPECT_THROW(graph.capture(kGpu,
                               [&] {
                                 (void)sum(x);
                                 current_stream(kGpu).synchronize();
                               }),
                 CudaError);
    EXPECT_FALSE(graph.captured());
  }
  EXPECT_EQ(memory_allocated(kGpu), allocated) << "the failed captures' blocks stayed live";
  const float want = sum(x.cpu()).item<float>();
  EXPECT_NEAR(sum(x).cpu().item<float>(), want, 1e-4f * (1 + std::abs(want)));
}

}  // namespace
}  // namespace ddp
