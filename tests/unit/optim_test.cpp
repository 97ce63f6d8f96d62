#include "collectives/communicator.h"
#include "collectives/ddp/zero.h"
#include "runtime/autograd/functions.h"
#include "runtime/nn/layers.h"
#include "runtime/ops/ops.h"
#include "runtime/ops/transformer_ops.h"
#include "runtime/optim/optimizer.h"
#include "tests/unit/error_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>

namespace ddp {
namespace {

// A parameter with a fixed gradient per step, updated by the optimizer and by a
// scalar reference written from torch.optim's documented rules.
struct OptimCase {
  std::vector<float> param = {0.5f, -1.0f, 2.0f};
  std::vector<std::vector<float>> grads = {
      {0.1f, -0.2f, 0.3f}, {-0.5f, 0.4f, 0.0f}, {1.0f, 1.0f, -1.0f}};
};

using test_util::message_of;

std::vector<float> run(optim::Optimizer& opt, Tensor& p, const OptimCase& c) {
  for (const auto& g : c.grads) {
    set_grad(p, from_vector(g, {3}));
    opt.step();
  }
  return p.to_vector<float>();
}

TEST(Optim, SgdMatchesTorchRule) {
  const OptimCase c;
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
  const OptimCase c;
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

// Two groups update as two optimizers with their own weight decay would, and state()
// numbers the parameters group after group (torch's state_dict numbering).
TEST(Optim, AdamWGroupsDecayEachByItsOwnWeightDecay) {
  const OptimCase c;
  auto leaf = [&] {
    Tensor t = from_vector(c.param, {3});
    set_requires_grad(t, true);
    return t;
  };
  Tensor a = leaf(), b = leaf(), ref_a = leaf(), ref_b = leaf();
  optim::AdamW grouped({{{b}, 0.0f}, {{a}, 0.3f}}, {.lr = 0.01f, .weight_decay = 99.0f});
  optim::AdamW alone_a({ref_a}, {.lr = 0.01f, .weight_decay = 0.3f});
  optim::AdamW alone_b({ref_b}, {.lr = 0.01f, .weight_decay = 0.0f});
  for (const auto& g : c.grads) {
    for (Tensor* t : {&a, &b, &ref_a, &ref_b}) set_grad(*t, from_vector(g, {3}));
    grouped.step();
    alone_a.step();
    alone_b.step();
  }
  EXPECT_EQ(a.to_vector<float>(), ref_a.to_vector<float>());
  EXPECT_EQ(b.to_vector<float>(), ref_b.to_vector<float>());
  EXPECT_NE(a.to_vector<float>(), b.to_vector<float>());  // the decays differed
  // b is the first group's: parameter 0.
  const auto state = grouped.state();
  ASSERT_FALSE(state.empty());
  EXPECT_EQ(state[0].first, "0.exp_avg");
  EXPECT_EQ(state[0].second.to_vector<float>(), alone_b.state()[0].second.to_vector<float>());
  const std::string msg = message_of<ValueError>([&] {
    optim::AdamW bad({{{leaf()}, -1.0f}}, {});
  });
  EXPECT_NE(msg.find("weight_decay -1"), std::string::npos) << msg;
}

// A large norm (a factor far below 1) scales as a multiply: g * factor, as torch's
// mul_. An axpy by factor - 1 lost the factor to rounding (10% off at a norm of 5e6)
// and zeroed every gradient below a factor of about 3e-8.
TEST(Optim, ClipGradNormOfALargeNormScalesExactly) {
  for (const float big : {3e3f, 3e6f, 3e7f, 3e9f}) {
    SCOPED_TRACE(big);
    Tensor p = zeros({2});
    set_requires_grad(p, true);
    set_grad(p, from_vector<float>({big, big * 4 / 3}, {2}));
    const double norm = optim::clip_grad_norm_({p}, 1.0);
    const auto factor = static_cast<float>(1.0 / (norm + 1e-6));
    const std::vector<float> g = grad(p).to_vector<float>();
    EXPECT_EQ(g[0], big * factor);
    EXPECT_EQ(g[1], big * 4 / 3 * factor);
    EXPECT_NEAR(g[0], 0.6, 1e-6);
    EXPECT_NEAR(g[1], 0.8, 1e-6);
  }
}

// clip_grad_norm_ against the closed form: ||(3, 4), (12)|| = 13.
TEST(Optim, ClipGradNormScalesToMaxNormAsTorch) {
  auto param_with_grad = [](std::vector<float> g) {
    Tensor t = zeros({static_cast<int64_t>(g.size())});
    set_requires_grad(t, true);
    set_grad(t, from_vector(g, {static_cast<int64_t>(g.size())}));
    return t;
  };
  Tensor a = param_with_grad({3.0f, 4.0f}), b = param_with_grad({12.0f});
  Tensor no_grad = zeros({2});
  set_requires_grad(no_grad, true);
  EXPECT_NEAR(optim::grad_norm({a, b, no_grad}), 13.0, 1e-6);
  const double norm = optim::clip_grad_norm_({a, b, no_grad}, 6.5);
  EXPECT_NEAR(norm, 13.0, 1e-6);
  const double f = 6.5 / (13.0 + 1e-6);
  const auto ga = grad(a).to_vector<float>(), gb = grad(b).to_vector<float>();
  EXPECT_NEAR(ga[0], 3 * f, 1e-6);
  EXPECT_NEAR(ga[1], 4 * f, 1e-6);
  EXPECT_NEAR(gb[0], 12 * f, 1e-5);
  EXPECT_NEAR(optim::grad_norm({a, b}), 6.5, 1e-5);
  // Under the limit nothing changes.
  EXPECT_NEAR(optim::clip_grad_norm_({a, b}, 100.0), 6.5, 1e-5);
  EXPECT_EQ(grad(a).to_vector<float>(), ga);
  // A non-finite norm is returned and the gradients are left alone.
  Tensor bad = param_with_grad({1.0f, std::nanf("")});
  EXPECT_TRUE(std::isnan(optim::clip_grad_norm_({a, bad}, 1.0)));
  EXPECT_EQ(grad(a).to_vector<float>(), ga);
  const std::string msg = message_of<ValueError>([&] { optim::clip_grad_norm_({a}, 0.0); });
  EXPECT_NE(msg.find("max_norm 0"), std::string::npos) << msg;
}

// sum_squares against a double reference, across the kernel's block and lane edges.
TEST(Optim, SumSquaresMatchesDoubleReference) {
  for (int64_t n : {0, 1, 15, 16, 17, 1023, 1024, 1025, 100003}) {
    const Tensor x = randn({n}, static_cast<uint64_t>(n) + 7);
    double ref = 0;
    for (float v : x.to_vector<float>()) ref += static_cast<double>(v) * v;
    const double got = sum_squares(x).item<float>();
    EXPECT_NEAR(got, ref, 1e-6 * std::max(1.0, ref)) << n;
  }
}

TEST(Optim, StateRoundTripContinuesIdentically) {
  const OptimCase c;
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

// AdamW's state of a parameter is its two moments and its step together; each partial
// or foreign form is named, and nothing is loaded. torch's float step loads.
TEST(Optim, AdamWLoadStateNamesPartialStateAndTakesTorchsStep) {
  Tensor p = zeros({3});
  set_requires_grad(p, true);
  optim::AdamW opt({p}, {.lr = 0.001f});
  const auto moments = [](nn::NamedTensors extra) {
    nn::NamedTensors s{{"0.exp_avg", zeros({3})}, {"0.exp_avg_sq", zeros({3})}};
    for (auto& e : extra) s.push_back(std::move(e));
    return s;
  };
  std::string msg = test_util::message_of<ValueError>([&] {
    opt.load_state({{"0.exp_avg", zeros({3})}}, 0);
  });
  EXPECT_NE(msg.find("optimizer state of parameter 0 (shape [3]) lacks 0.exp_avg_sq, 0.step"),
            std::string::npos)
      << msg;
  msg = test_util::message_of<ValueError>([&] {
    opt.load_state({{"0.step", full({1}, 5.0, {.dtype = DType::i64})}}, 5);
  });
  EXPECT_NE(msg.find("lacks 0.exp_avg, 0.exp_avg_sq"), std::string::npos) << msg;
  msg = test_util::message_of<ValueError>([&] {
    opt.load_state(moments({{"0.step", full({1}, 2.0, {.dtype = DType::i64})},
                            {"7.step", full({1}, 2.0, {.dtype = DType::i64})}}),
                   2);
  });
  EXPECT_NE(msg.find("unexpected entries: 7.step"), std::string::npos) << msg;
  msg = test_util::message_of<ValueError>([&] {
    opt.load_state(moments({{"0.step", full({}, 2.5)}}), 2);
  });
  EXPECT_NE(msg.find("optimizer state 0.step: step count 2.5 is not a whole number"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(opt.state().empty()) << "a refused load changed the state";
  // torch keeps step as a float scalar: the same update as an i64 step.
  opt.load_state(moments({{"0.step", full({}, 5.0)}}), 5);
  const nn::NamedTensors loaded = opt.state();
  ASSERT_EQ(loaded.size(), 3u);
  EXPECT_EQ(loaded[2].first, "0.step");
  EXPECT_EQ(loaded[2].second.item<int64_t>(), 5);
}

// ZeRO's AdamW state follows the same rule as AdamW's: moments without their step are
// named (they resumed at step 1's bias correction), torch's float step loads.
TEST(Optim, ZeroAdamWLoadStateNeedsTheStepsWithTheMoments) {
  Tensor p = zeros({3});
  set_requires_grad(p, true);
  ZeroOptimizer zero(
      std::make_unique<optim::AdamW>(std::vector<Tensor>{p}, optim::AdamWOptions{.lr = 0.001f}),
      make_local_communicator());
  const nn::NamedTensors moments{{"0.exp_avg", zeros({3})}, {"0.exp_avg_sq", zeros({3})}};
  const std::string msg = test_util::message_of<ValueError>([&] { zero.load_state(moments, 2); });
  EXPECT_NE(msg.find("optimizer state has no '0.step' while it has parameter 0's exp_avg and "
                     "exp_avg_sq"),
            std::string::npos)
      << msg;
  nn::NamedTensors with_step = moments;
  with_step.emplace_back("0.step", full({}, 2.0));
  zero.load_state(with_step, 2);
  zero.gather_state();
  bool seen = false;
  for (const auto& [name, t] : zero.state()) {
    if (name != "0.step") continue;
    seen = true;
    EXPECT_EQ(t.item<int64_t>(), 2);
  }
  EXPECT_TRUE(seen) << "the gathered state has no 0.step";
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
  EXPECT_THROW(optim::LrSchedule::parse_kind("exponential"), ValueError);
  optim::LrSchedule linear = cosine;
  linear.kind = optim::LrSchedule::parse_kind("linear");
  linear.min_lr = 0.2f;
  EXPECT_FLOAT_EQ(linear.lr_at(4), 0.5f);     // the warmup is cosine's
  EXPECT_NEAR(linear.lr_at(35), 0.8f, 1e-6);  // a quarter of the way: 1 - 0.8 x 0.25
  EXPECT_NEAR(linear.lr_at(110), 0.2f, 1e-6);
  EXPECT_NEAR(linear.lr_at(999), 0.2f, 1e-6);
}

// Parity with PyTorch 1.13: torch.optim.lr_scheduler.OneCycleLR(SGD(lr=0.1),
// max_lr=0.1, total_steps=T, cycle_momentum=False), the lr of each optimizer step
// (param_groups[0]["lr"] before step i), printed with 9 significant digits.
TEST(Optim, OneCycleMatchesPyTorch) {
  const std::vector<std::pair<int64_t, std::vector<double>>> torch_lrs = {
      {20, {0.004,        0.0131671843, 0.0371671843, 0.0668328157,  0.0908328157,
            0.1,          0.0987464006, 0.0950484632, 0.0890916178,  0.0811745654,
            0.0716943002, 0.0611262022, 0.0500002,    0.0388741978,  0.0283060998,
            0.0188258346, 0.0109087822, 0.0049519368, 0.00125399938, 4e-07}},
      {7, {0.004, 0.0980556627, 0.0919044376, 0.0672683836, 0.0357738776, 0.00992967919, 4e-07}},
  };
  for (const auto& [total, lrs] : torch_lrs) {
    const optim::LrSchedule s{
        .kind = optim::LrSchedule::Kind::onecycle, .base_lr = 0.1f, .total_steps = total};
    for (size_t i = 0; i < lrs.size(); ++i) {
      EXPECT_NEAR(s.lr_at(static_cast<int64_t>(i)), lrs[i], 1e-7 + 1e-6 * lrs[i])
          << "total " << total << " step " << i;
    }
  }
}

// --warmup-steps 1: the rise ends at step 0, which is at the peak; the run used to
// train at lr NaN (0/0) and stop at its first step.
TEST(Optim, OneCycleWithAOneStepRiseStartsAtItsPeak) {
  const optim::LrSchedule s{.kind = optim::LrSchedule::Kind::onecycle,
                            .base_lr = 0.1f,
                            .warmup_steps = 1,
                            .total_steps = 5};
  EXPECT_FLOAT_EQ(s.lr_at(0), 0.1f);
  for (int64_t step = 1; step < 5; ++step) {
    EXPECT_TRUE(std::isfinite(s.lr_at(step))) << "step " << step;
    EXPECT_LT(s.lr_at(step), s.lr_at(step - 1)) << "step " << step;
  }
  EXPECT_NEAR(s.lr_at(4), 0.1 / 25 / 1e4, 1e-9);
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

// Note [captured optimizer steps]: a capturable optimizer takes the same steps, bit for
// bit, as the plain one, and its kernels read the numbers prepare_step() uploaded,
// not the host's values at apply_step() (what a graph's replay would have baked).
namespace captured {

std::vector<Tensor> params(uint64_t seed) {
  std::vector<Tensor> ps;
  for (const Shape& s : {Shape{7, 5}, Shape{5}, Shape{0}, Shape{300}}) {
    Tensor p = randn(s, seed++);
    set_requires_grad(p, true);
    ps.push_back(p);
  }
  return ps;
}

void set_grads(std::vector<Tensor>& ps, int step) {
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i == 1 && step == 2) {
      set_grad(ps[i], Tensor());  // no gradient this step: skipped, as torch does
      continue;
    }
    set_grad(ps[i], randn(ps[i].shape(), 1000 + 10 * step + i));
  }
}

void expect_same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                      const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].dtype(), b[i].dtype()) << what << " " << i;
    const Tensor x = a[i].cpu(), y = b[i].cpu();
    ASSERT_EQ(x.numel(), y.numel()) << what << " " << i;
    if (x.nbytes() == 0) continue;  // an empty tensor has no data pointer
    ASSERT_EQ(std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()), 0)
        << what << " " << i << ": the bits differ";
  }
}

std::vector<Tensor> state_tensors(const optim::Optimizer& opt) {
  std::vector<Tensor> out;
  for (const auto& [name, t] : opt.state()) out.push_back(t);  // the .step counts too
  return out;
}

// Five steps of `plain` and of the capturable `capt` from the same parameters, the lr
// changing every step; every odd step as a replay would run it (the host's lr changed
// after the upload), and from step 3 on `capt` continues from the plain one's state.
template <typename Make>
void check_capturable(Make make) {
  std::vector<Tensor> a = params(1), b = params(1);
  auto plain = make(a);
  auto capt = make(b);
  capt->set_capturable(true);
  EXPECT_TRUE(capt->capturable());
  const float lrs[] = {0.1f, 0.05f, 0.02f, 0.2f, 0.01f};
  for (int step = 0; step < 5; ++step) {
    if (step == 3) {  // a resume: a new capturable one from the plain one's state
      capt = make(b);
      capt->set_capturable(true);
      capt->load_state(plain->state(), plain->steps());
    }
    set_grads(a, step);
    set_grads(b, step);
    plain->set_lr(lrs[step]);
    plain->step();
    if (step % 2 == 0) {
      capt->set_lr(lrs[step]);
      capt->step();
    } else {  // as a replay: the host's lr changes after the upload and is not used
      capt->set_lr(lrs[step]);
      capt->prepare_step();
      capt->set_lr(123.0f);
      capt->apply_step();
    }
    expect_same_bits(a, b, "parameters");
    expect_same_bits(state_tensors(*plain), state_tensors(*capt), "state");
    EXPECT_EQ(capt->steps(), plain->steps());
  }
}
}  // namespace captured

TEST(Optim, CapturableSgdStepsAsThePlainOne) {
  captured::check_capturable([](const std::vector<Tensor>& ps) {
    return std::make_unique<optim::SGD>(
        ps,
        optim::SgdOptions{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-2f, .nesterov = true});
  });
  captured::check_capturable([](const std::vector<Tensor>& ps) {
    return std::make_unique<optim::SGD>(ps, optim::SgdOptions{.lr = 0.1f});
  });
  captured::check_capturable([](const std::vector<Tensor>& ps) {
    return std::make_unique<optim::SGD>(ps, optim::SgdOptions{.lr = 0.1f, .momentum = 0.5f});
  });
}

TEST(Optim, CapturableAdamWStepsAsThePlainOne) {
  captured::check_capturable([](const std::vector<Tensor>& ps) {
    return std::make_unique<optim::AdamW>(
        std::vector<optim::ParamGroup>{{.params = {ps[0], ps[2]}, .weight_decay = 0.1f},
                                       {.params = {ps[1], ps[3]}, .weight_decay = 0.0f}},
        optim::AdamWOptions{.lr = 0.1f, .beta1 = 0.8f, .beta2 = 0.95f});
  });
}

TEST(Optim, CapturableHalvesNeedTheModeAndEachOther) {
  std::vector<Tensor> ps = captured::params(3);
  captured::set_grads(ps, 0);
  optim::AdamW opt(ps, {});
  EXPECT_NE(message_of<ValueError>([&] { opt.prepare_step(); }).find("set_capturable(true)"),
            std::string::npos);
  EXPECT_NE(message_of<ValueError>([&] { opt.apply_step(); }).find("set_capturable(true)"),
            std::string::npos);
  std::vector<std::unique_ptr<optim::Optimizer>> capturable;
  capturable.push_back(std::make_unique<optim::AdamW>(ps, optim::AdamWOptions{}));
  capturable.push_back(std::make_unique<optim::SGD>(ps, optim::SgdOptions{.lr = 0.1f}));
  for (auto& o : capturable) {
    o->set_capturable(true);
    SCOPED_TRACE(o->name());
    EXPECT_NE(message_of<ValueError>([&] {
                o->apply_step();
              }).find("apply_step() without a prepare_step() before it"),
              std::string::npos);
    o->prepare_step();
    o->apply_step();
    EXPECT_NE(message_of<ValueError>([&] {
                o->apply_step();
              }).find("apply_step() without a prepare_step() before it"),
              std::string::npos)
        << "one prepare_step, two updates";
    o->prepare_step();
    set_grad(ps[1], Tensor());  // a gradient gone between the halves
    EXPECT_NE(message_of<ValueError>([&] {
                o->apply_step();
              }).find("parameter 1 had a gradient at prepare_step() and has none now"),
              std::string::npos);
    o->prepare_step();
    set_grad(ps[1], randn(ps[1].shape(), 5));  // one that appeared
    EXPECT_NE(message_of<ValueError>([&] {
                o->apply_step();
              }).find("parameter 1 had no gradient at prepare_step() and has one now"),
              std::string::npos);
  }
  EXPECT_NE(message_of<ValueError>([&] {
              optim::SGD plain(ps, {.lr = 0.1f});
              plain.set_capturable(true);
              plain.set_capturable(false);
              plain.prepare_step();
            }).find("set_capturable(true)"),
            std::string::npos);
}

}  // namespace
}  // namespace ddp
