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

const Device kGpu = Device::cuda(0);

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
  DDP_REQUIRE_CUDA();
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
  graph.capture(kGpu, [&] {
    forward_backward();
    graphed_opt->apply_step();
  });
  for (int i = 1; i < kSteps; ++i) {
    copy_(x, batch(i));
    copy_(y, labels(i));
    graphed_opt->set_lr(lr_at(i));
    graphed_opt->prepare_step();
    graph.replay();
    EXPECT_EQ(loss.cpu().item<float>(), eager_losses[i]) << "step " << i;
  }
  EXPECT_EQ(graphed_opt->steps(), eager_opt->steps());
  const std::vector<Tensor> a = eager.params(), b = graphed.params();
  for (size_t p = 0; p < a.size(); ++p) expect_same_bits(a[p], b[p], "parameter");
}

TEST(CudaGraphGpu, ACapturedSgdStepReplaysBitForBitAsTheEagerStep) {
  DDP_REQUIRE_CUDA();
  check_captured_training([](const std::vector<Tensor>& ps) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::SGD>(ps, optim::SgdOptions{.lr = 0.05f, .momentum = 0.9f});
  });
}

TEST(CudaGraphGpu, ACapturedAdamWStepReplaysBitForBitAsTheEagerStep) {
  DDP_REQUIRE_CUDA();
  check_captured_training([](const std::vector<Tensor>& ps) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions{.lr = 0.05f});
  });
}

TEST(CudaGraphGpu, CapturingBeforeTheFirstUpdateIsNamed) {
  DDP_REQUIRE_CUDA();
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

TEST(CudaGraphGpu, AHostReadWhileCapturingFailsAndLeavesTheDeviceUsable) {
  DDP_REQUIRE_CUDA();
  const Tensor x = randn({256}, 4, {.device = kGpu});
  sum(x).cpu();  // warm-up
  const uint64_t allocated = memory_allocated(kGpu);
  {
    CudaGraph graph;
    EXPECT_THROW(graph.capture(kGpu, [&] { (void)sum(x).cpu().item<float>(); }), CudaError);
    EXPECT_FALSE(graph.captured());
    EXPECT_THROW(graph.replay(), Error);
  }
  EXPECT_EQ(memory_allocated(kGpu), allocated) << "the failed capture's blocks stayed live";
  const float want = sum(x.cpu()).item<float>();
  EXPECT_NEAR(sum(x).cpu().item<float>(), want, 1e-4f * (1 + std::abs(want)));
}

}  // namespace
}  // namespace ddp
