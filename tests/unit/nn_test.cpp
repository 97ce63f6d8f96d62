#include "runtime/nn/layers.h"
#include "runtime/ops/ops.h"
#include "tests/unit/error_text.h"

#include <gtest/gtest.h>

#include "runtime/fmt.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

namespace ddp {
namespace {

std::shared_ptr<nn::Sequential> mlp(uint64_t seed) {
  Generator gen(seed);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Flatten>());
  model->add(std::make_shared<nn::Linear>(12, 5, gen));
  model->add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::Linear>(5, 3, gen));
  return model;
}

TEST(Module, NamesFollowPyTorchStateDict) {
  auto model = mlp(1);
  std::vector<std::string> names;
  for (auto& [name, t] : model->state_dict()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"1.weight", "1.bias", "3.weight", "3.bias"}));
  EXPECT_EQ(model->num_parameters(), 12 * 5 + 5 + 5 * 3 + 3);
  EXPECT_EQ(
      model->str(),
      "Sequential(\n  (0): Flatten()\n  (1): Linear(in_features=12, out_features=5, bias=True)\n"
      "  (2): ReLU()\n  (3): Linear(in_features=5, out_features=3, bias=True)\n)");
}

// Keras' model.summary() form: a row per leaf (and per module with parameters of its
// own), each row's count the closed form of its shapes, then the totals.
TEST(Module, SummaryListsLayersCountsAndTotals) {
  auto model = mlp(1);
  const std::string s = model->summary();
  EXPECT_NE(s.find("0      Flatten           0\n"), std::string::npos) << s;
  EXPECT_NE(s.find("1      Linear           65  weight [5, 12], bias [5]\n"), std::string::npos)
      << s;
  EXPECT_NE(s.find("3      Linear           18  weight [3, 5], bias [3]\n"), std::string::npos)
      << s;
  EXPECT_NE(s.find("total: 83 parameters (0.3 KiB), 0 buffers"), std::string::npos) << s;
  nn::Sequential big;
  Generator gen(2);
  big.add(std::make_shared<nn::Linear>(1000, 1000, gen));
  EXPECT_NE(big.summary().find("total: 1,001,000 parameters (3910.2 KiB)"), std::string::npos)
      << big.summary();
}

TEST(Module, DefaultInitBoundsAndSeeds) {
  auto a = mlp(7), b = mlp(7), c = mlp(8);
  const auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  EXPECT_EQ(pa[0].to_vector<float>(), pb[0].to_vector<float>()) << "same seed, same model";
  EXPECT_NE(pa[0].to_vector<float>(), pc[0].to_vector<float>());
  const double bound = 1.0 / std::sqrt(12.0);
  double sum_sq = 0;
  const auto w = pa[0].to_vector<float>();
  for (float v : w) {
    ASSERT_LE(std::fabs(v), bound + 1e-7);
    sum_sq += v * v;
  }
  // U(-b, b) has variance b^2 / 3.
  EXPECT_NEAR(sum_sq / w.size(), bound * bound / 3, bound * bound / 6);
  EXPECT_NE(pa[0].to_vector<float>()[0], pa[1].to_vector<float>()[0]) << "bias drawn after weight";
}

TEST(Module, StateDictRoundTrip) {
  auto a = mlp(1), b = mlp(2);
  Tensor kept = b->parameters()[0];
  b->load_state_dict(a->state_dict());
  for (size_t i = 0; i < a->parameters().size(); ++i) {
    EXPECT_EQ(a->parameters()[i].to_vector<float>(), b->parameters()[i].to_vector<float>());
  }
  EXPECT_TRUE(kept.is_same(b->parameters()[0])) << "loading copies into the existing tensors";
}

TEST(Module, LoadStateDictListsEveryProblem) {
  auto model = mlp(1);
  nn::NamedTensors state = model->state_dict();
  state.erase(state.begin() + 1);              // drop 1.bias
  state[0].second = zeros({5, 11});            // wrong shape for 1.weight
  state.emplace_back("9.weight", zeros({1}));  // unexpected
  try {
    model->load_state_dict(state);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("Missing key(s): 1.bias"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Unexpected key(s): 9.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("size mismatch for 1.weight: copying a param with shape [5, 11]"),
              std::string::npos)
        << msg;
  }
}

// strict=false (torch's strict=False, as for a pretrained body under a new head): what
// is there is loaded, missing and unexpected keys are returned; a wrong shape still throws.
TEST(Module, LoadStateDictNotStrictLoadsWhatIsThereAndReturnsTheRest) {
  auto model = mlp(1);
  auto source = mlp(2);
  nn::NamedTensors state = source->state_dict();
  const std::string dropped = state[1].first;
  state.erase(state.begin() + 1);
  state.emplace_back("9.weight", zeros({1}));
  const std::vector<float> before = model->state_dict()[1].second.to_vector<float>();
  const nn::Module::IncompatibleKeys keys = model->load_state_dict(state, /*strict=*/false);
  EXPECT_EQ(keys.missing, std::vector<std::string>{dropped});
  EXPECT_EQ(keys.unexpected, std::vector<std::string>{"9.weight"});
  const nn::NamedTensors loaded = model->state_dict();
  EXPECT_EQ(loaded[0].second.to_vector<float>(), state[0].second.to_vector<float>());
  EXPECT_EQ(loaded[1].second.to_vector<float>(), before) << "a missing entry was changed";
  state[0].second = zeros({5, 11});
  EXPECT_THROW(model->load_state_dict(state, /*strict=*/false), ValueError);
}

// Only the dtype differs, or the tensor is undefined: said so, naming the key.
TEST(Module, LoadStateDictNamesADtypeMismatchAndAnUndefinedTensor) {
  auto model = mlp(1);
  nn::NamedTensors state = model->state_dict();
  const std::vector<int64_t> shape = state[0].second.shape();
  state[0].second = zeros(shape, {.dtype = DType::i64});
  state[1].second = Tensor();
  try {
    model->load_state_dict(state);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(fmt::format("dtype mismatch for {}: copying a param of dtype i64 from "
                                   "checkpoint, the dtype in current model is f32",
                                   state[0].first)),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(state[1].first + ": an undefined tensor"), std::string::npos) << msg;
  }
}

TEST(Module, TrainEvalPropagatesAndZeroGrad) {
  auto model = mlp(1);
  model->eval();
  EXPECT_FALSE(model->is_training());
  model->train();
  Tensor loss = functional::cross_entropy((*model)(randn({4, 3, 4}, 3)),
                                          from_vector<int64_t>({0, 1, 2, 1}, {4}));
  backward(loss);
  for (const Tensor& p : model->parameters()) ASSERT_TRUE(grad(p).defined());
  model->zero_grad();
  for (const Tensor& p : model->parameters()) {
    for (float g : grad(p).to_vector<float>()) ASSERT_EQ(g, 0.0f);
  }
  model->zero_grad(true);
  for (const Tensor& p : model->parameters()) EXPECT_FALSE(grad(p).defined());
}

TEST(Module, ConvNetShapes) {
  Generator gen(3);
  nn::Sequential net;
  net.add(std::make_shared<nn::Conv2d>(1, 4, 3, gen, functional::Conv2dOptions{1, 1}));
  net.add(std::make_shared<nn::ReLU>());
  net.add(std::make_shared<nn::MaxPool2d>(2));
  net.add(std::make_shared<nn::Flatten>());
  net.add(std::make_shared<nn::Dropout>(0.5f, 1));
  net.add(std::make_shared<nn::Linear>(4 * 14 * 14, 10, gen));
  const Tensor y = net(randn({2, 1, 28, 28}, 4));
  EXPECT_EQ(y.shape(), (Shape{2, 10}));
  EXPECT_EQ(net.state_dict()[0].first, "0.weight");
  EXPECT_EQ(net.state_dict()[0].second.shape(), (Shape{4, 1, 3, 3}));
}

// Note [relu before max pooling]: Sequential runs ReLU then MaxPool2d as the pool
// then the ReLU. Output, input gradient and weight gradients equal the layers run
// one by one in the written order, bit for bit, also with NaNs and ties (integer
// values) in the input; odd image sizes leave a row and column out of every window.
TEST(Module, ReluBeforeMaxPoolRunsReorderedWithTheSameResults) {
  for (const bool special : {false, true}) {
    SCOPED_TRACE(special ? "NaNs and ties" : "random");
    Generator gen(5);
    const std::vector<std::shared_ptr<nn::Module>> layers = {
        std::make_shared<nn::Conv2d>(2, 3, 3, gen, functional::Conv2dOptions{1, 1}),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
        std::make_shared<nn::Flatten>()};
    nn::Sequential net;
    for (const auto& layer : layers) net.add(layer);
    std::vector<float> xv = randn({2, 2, 9, 7}, 6).to_vector<float>();
    if (special) {
      for (float& v : xv) v = std::round(2.0f * v);  // ties in most windows
      xv[5] = NAN;
      xv[40] = NAN;
    }
    const auto run = [&](bool written_order) {
      net.zero_grad(true);
      Tensor x = from_vector(xv, {2, 2, 9, 7});
      set_requires_grad(x, true);
      Tensor y;
      if (written_order) {
        Tensor h = x;
        for (const auto& layer : layers) h = layer->forward(h);
        y = h;
      } else {
        y = net(x);
      }
      const Tensor upstream = randn(y.shape(), 7);
      backward(functional::sum(functional::mul(y, upstream)));
      std::vector<std::vector<float>> out = {y.to_vector<float>(), grad(x).to_vector<float>()};
      for (const Tensor& p : net.parameters()) out.push_back(grad(p).to_vector<float>());
      return out;
    };
    const auto want = run(true), got = run(false);
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_EQ(got[k].size(), want[k].size());
      for (size_t j = 0; j < want[k].size(); ++j) {
        // NaN equals NaN here; every other value bit for bit (std::memcmp-like).
        const bool both_nan = std::isnan(got[k][j]) && std::isnan(want[k][j]);
        ASSERT_TRUE(both_nan ||
                    std::bit_cast<uint32_t>(got[k][j]) == std::bit_cast<uint32_t>(want[k][j]))
            << "result " << k << " (0 output, 1 input gradient, then parameters) element " << j
            << ": " << got[k][j] << " vs " << want[k][j];
      }
    }
  }
}

// The reorder is for the library's own ReLU and MaxPool2d only: a subclass of ReLU may
// compute something else, and a hook must see the tensor of the written order.
TEST(Module, ReluBeforeMaxPoolKeepsTheWrittenOrderForASubclassOrAHook) {
  struct NegatedRelu : nn::ReLU {
    Tensor forward(const Tensor& x) override {
      return functional::scale(functional::relu(x), -1.0f);
    }
  };
  const Tensor x = from_vector<float>({1, 2, 3, 4}, {1, 1, 2, 2});
  {
    nn::Sequential net;
    net.add(std::make_shared<NegatedRelu>()).add(std::make_shared<nn::MaxPool2d>(2));
    EXPECT_EQ(net(x).to_vector<float>(), std::vector<float>{-1.0f}) << "max(-relu(x))";
  }
  nn::Sequential net;
  auto relu = std::make_shared<nn::ReLU>();
  net.add(relu).add(std::make_shared<nn::MaxPool2d>(2));
  Shape seen;
  relu->add_forward_hooks({}, [&](nn::Module&, const Tensor& out) {
    seen = out.shape();
    return out;
  });
  EXPECT_EQ(net(x).to_vector<float>(), std::vector<float>{4.0f});
  EXPECT_EQ(seen, (Shape{1, 1, 2, 2})) << "the ReLU's hook saw the pooled map";
}

// Mistakes a user of the layers makes, each named with its fix.
TEST(Module, UsageMistakesAreNamedWithTheirFix) {
  Generator gen(3);
  nn::Linear fc(3, 4, gen);
  std::string msg = test_util::message_of<ValueError>([&] { (void)fc(zeros({2, 5, 3})); });
  EXPECT_NE(msg.find("linear: input [2, 5, 3] has 3 dimension(s); linear takes [N, in_features]"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("reshape it to [-1, 3]"), std::string::npos) << msg;
  msg = test_util::message_of<ValueError>([&] { (void)fc(zeros({2, 5})); });
  EXPECT_NE(msg.find("linear: input [2, 5] does not match weight [4, 3] (expected input [N, 3])"),
            std::string::npos)
      << msg;
  struct Counter : nn::Module {
    Counter() { register_parameter("count", zeros({1}, {.dtype = DType::i64})); }
    Tensor forward(const Tensor& x) override { return x; }
    std::string name() const override { return "Counter"; }
  };
  msg = test_util::message_of<ValueError>([] { Counter c; });
  EXPECT_NE(msg.find("Counter: register_parameter(\"count\"): a parameter of dtype i64 cannot "
                     "require gradients"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("register_buffer"), std::string::npos) << msg;
  Tensor w = zeros({3});
  set_requires_grad(w, true);
  msg = test_util::message_of<ValueError>([&] { set_grad(w, zeros({3}, {.dtype = DType::bf16})); });
  EXPECT_NE(msg.find("set_grad: gradient of dtype bf16 for a tensor of dtype f32 (shape [3])"),
            std::string::npos)
      << msg;
  EXPECT_FALSE(grad(w).defined());
}

}  // namespace
}  // namespace ddp
