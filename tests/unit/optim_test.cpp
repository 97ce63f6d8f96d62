#include "runtime/autograd/functions.h"
#include "runtime/nn/layers.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

namespace ddp {
namespace {

// A parameter with a fixed gradient per step, updated by the optimizer and by a
// scalar reference written from torch.optim's documented rules.
struct Case {
  std::vector<float> param = {0.5f, -1.0f, 2.0f};
  std::vector<std::vector<float>> grads = {
      {0.1f, -0.2f, 0.3f}, {-0.5f, 0.4f, 0.0f}, {1.0f, 1.0f, -1.0f}};
};

std::vector<float> run(optim::Optimizer& opt, Tensor& p, const Case& c) {
  for (const auto& g : c.grads) {
    set_grad(p, from_vector(g, {3}));
    opt.step();
  }
  return p.to_vector<float>();
}

TEST(Optim, SgdMatchesTorchRule) {
  const Case c;
  for (float momentum : {0.0f, 0.9f}) {
    for (bool nesterov : {false, true}) {
      if (nesterov && momentum == 0.0f) continue;
      for (float wd : {0.0f, 0.01f}) {
        Tensor p = from_vector(c.param, {3});
        set_requires_grad(p, true);
        optim::SGD opt(
            {p}, {.lr = 0.1f, .momentum = momentum, .weight_decay = wd, .nesterov = nesterov});
        const auto got = run(opt, p, c);
        std::vector<double> ref(c.param.begin(), c.param.end()), buf(3, 0.0);
        for (size_t step = 0; step < c.grads.size(); ++step) {
          for (size_t i = 0; i < 3; ++i) {
            double g = c.grads[step][i] + wd * ref[i];
            if (momentum != 0.0f) {
              buf[i] = step == 0 ? g : momentum * buf[i] + g;
              g = nesterov ? g + momentum * buf[i] : buf[i];
            }
            ref[i] -= 0.1 * g;
          }
        }
        for (size_t i = 0; i < 3; ++i) {
          EXPECT_NEAR(got[i], ref[i], 1e-6) << "momentum " << momentum << " nesterov " << nesterov
                                            << " wd " << wd << " element " << i;
        }
        EXPECT_EQ(opt.steps(), 3);
      }
    }
  }
}

TEST(Optim, AdamWMatchesTorchRule) {
  const Case c;
  Tensor p = from_vector(c.param, {3});
  set_requires_grad(p, true);
  optim::AdamW opt({p}, {.lr = 0.01f, .weight_decay = 0.1f});
  const auto got = run(opt, p, c);
  std::vector<double> ref(c.param.begin(), c.param.end()), m(3, 0), v(3, 0);
  for (size_t step = 1; step <= c.grads.size(); ++step) {
    for (size_t i = 0; i < 3; ++i) {
      const double g = c.grads[step - 1][i];
      ref[i] *= 1 - 0.01 * 0.1;
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      const double mhat = m[i] / (1 - std::pow(0.9, step)),
                   vhat = v[i] / (1 - std::pow(0.999, step));
      ref[i] -= 0.01 * mhat / (std::sqrt(vhat) + 1e-8);
    }
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(got[i], ref[i], 1e-6) << i;
}

TEST(Optim, StateRoundTripContinuesIdentically) {
  const Case c;
  for (int which = 0; which < 2; ++which) {
    auto make = [which](Tensor& p) -> std::unique_ptr<optim::Optimizer> {
      if (which == 0)
        return std::make_unique<optim::SGD>(std::vector<Tensor>{p},
                                            optim::SgdOptions{.lr = 0.1f, .momentum = 0.9f});
      return std::make_unique<optim::AdamW>(std::vector<Tensor>{p},
                                            optim::AdamWOptions{.lr = 0.01f});
    };
    Tensor a = from_vector(c.param, {3});
    set_requires_grad(a, true);
    auto opt_a = make(a);
    const auto full_run = run(*opt_a, a, c);
    // Two steps, save, restore into a fresh optimizer, last step.
    Tensor b = from_vector(c.param, {3});
    set_requires_grad(b, true);
    auto opt_b = make(b);
    for (size_t s = 0; s < 2; ++s) {
      set_grad(b, from_vector(c.grads[s], {3}));
      opt_b->step();
    }
    const auto saved = opt_b->state();
    auto opt_c = make(b);
    opt_c->load_state(saved, opt_b->steps());
    set_grad(b, from_vector(c.grads[2], {3}));
    opt_c->step();
    EXPECT_EQ(b.to_vector<float>(), full_run) << opt_c->name();
    EXPECT_EQ(opt_c->steps(), 3);
  }
}

TEST(Optim, LoadStateRejectsForeignState) {
  Tensor p = zeros({3});
  set_requires_grad(p, true);
  optim::SGD opt({p}, {.lr = 0.1f, .momentum = 0.9f});
  EXPECT_THROW(opt.load_state({{"0.momentum_buffer", zeros({4})}}, 1), ValueError);
  EXPECT_THROW(opt.load_state({{"7.momentum_buffer", zeros({3})}}, 1), ValueError);
  EXPECT_THROW(optim::SGD({p}, {.lr = -1.0f}), ValueError);
  EXPECT_THROW(optim::SGD({p}, {.lr = 0.1f, .nesterov = true}), ValueError);
}

TEST(Optim, LrSchedules) {
  optim::LrSchedule constant{.kind = optim::LrSchedule::Kind::constant, .base_lr = 0.1f};
  EXPECT_FLOAT_EQ(constant.lr_at(1000), 0.1f);
  optim::LrSchedule step{
      .kind = optim::LrSchedule::Kind::step, .base_lr = 0.1f, .step_size = 10, .gamma = 0.5f};
  EXPECT_FLOAT_EQ(step.lr_at(9), 0.1f);
  EXPECT_FLOAT_EQ(step.lr_at(10), 0.05f);
  EXPECT_FLOAT_EQ(step.lr_at(25), 0.025f);
  optim::LrSchedule cosine{.kind = optim::LrSchedule::Kind::cosine,
                           .base_lr = 1.0f,
                           .warmup_steps = 10,
                           .total_steps = 110,
                           .min_lr = 0.0f};
  EXPECT_FLOAT_EQ(cosine.lr_at(0), 0.1f);
  EXPECT_FLOAT_EQ(cosine.lr_at(9), 1.0f);
  EXPECT_NEAR(cosine.lr_at(60), 0.5f, 1e-6);
  EXPECT_NEAR(cosine.lr_at(110), 0.0f, 1e-6);
  EXPECT_NEAR(cosine.lr_at(500), 0.0f, 1e-6);
  EXPECT_THROW(optim::LrSchedule::parse_kind("linear"), ValueError);
}

TEST(Optim, TrainingAnMlpLowersTheLoss) {
  Generator gen(1);
  nn::Sequential model;
  model.add(std::make_shared<nn::Linear>(4, 16, gen));
  model.add(std::make_shared<nn::ReLU>());
  model.add(std::make_shared<nn::Linear>(16, 2, gen));
  optim::SGD opt(model.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  // Label = whether the first feature is positive.
  const Tensor x = randn({64, 4}, 2);
  std::vector<int64_t> y;
  for (float v : x.to_vector<float>()) (void)v;
  const auto xv = x.to_vector<float>();
  for (int i = 0; i < 64; ++i) y.push_back(xv[static_cast<size_t>(i * 4)] > 0 ? 1 : 0);
  const Tensor labels = from_vector(y, {64});
  float first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    opt.zero_grad();
    Tensor loss = functional::cross_entropy(model(x), labels);
    backward(loss);
    opt.step();
    (step == 0 ? first : last) = loss.item<float>();
  }
  EXPECT_LT(last, 0.2f * first);
}

}  // namespace
}  // namespace ddp
