// Note [shared parameters] (runtime/nn/module.h): a module or tensor registered
// twice is one parameter, as in torch: listed once, stepped once, replicated
// once; and the registration checks that catch a null or repeated name at once
// instead of at the first forward or checkpoint.
#include "runtime/autograd/functions.h"
#include "runtime/data/file_dataset.h"
#include "runtime/nn/layers.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "tests/unit/error_text.h"

#include <gtest/gtest.h>

namespace ddp {
namespace {

using test_util::error_text;

// fc(tanh(fc(x))): one Linear registered as "enc" and again as "dec".
class Tied : public nn::Cloneable<Tied> {
 public:
  explicit Tied(bool twice) {
    Generator gen(7);
    fc_ = register_module("enc", std::make_shared<nn::Linear>(4, 4, gen));
    if (twice) register_module("dec", fc_);
  }
  Tensor forward(const Tensor& x) override { return (*fc_)(functional::tanh((*fc_)(x))); }
  std::string name() const override { return "Tied"; }
  void rebind_members() override { fc_ = std::dynamic_pointer_cast<nn::Linear>(own_child("enc")); }

 private:
  std::shared_ptr<nn::Linear> fc_;
};

std::vector<float> sgd_losses(nn::Module& model, int steps) {
  optim::SGD opt(model.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  const Tensor x = from_vector<float>({0.5f, -1, 2, 0.25f, 1, 1, -0.5f, 0}, {2, 4});
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    const Tensor y = model(x);
    Tensor loss = functional::mean(functional::mul(y, y));
    backward(loss);
    opt.step();
    losses.push_back(loss.item<float>());
  }
  return losses;
}

TEST(SharedParameters, AModuleRegisteredTwiceIsListedAndSteppedOnce) {
  Tied once(false), twice(true);
  std::vector<std::string> names;
  for (const auto& [n, t] : twice.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"enc.weight", "enc.bias"}));
  EXPECT_EQ(twice.parameters().size(), 2u);
  EXPECT_EQ(twice.num_parameters(), once.num_parameters());
  // state_dict keeps both names of the weight, as torch's does.
  std::vector<std::string> keys;
  for (const auto& [n, t] : twice.state_dict()) keys.push_back(n);
  EXPECT_EQ(keys, (std::vector<std::string>{"enc.weight", "enc.bias", "dec.weight", "dec.bias"}));
  EXPECT_EQ(twice.named_modules().size(), 2u);  // the model and its one Linear
  // One momentum buffer and one update per step: the same losses as the model
  // that registers it once (twice, the update was doubled).
  EXPECT_EQ(sgd_losses(twice, 3), sgd_losses(once, 3));
}

TEST(SharedParameters, AReplicaKeepsTheTie) {
  Tied twice(true);
  std::vector<Tensor> params;
  for (const Tensor& p : twice.parameters()) params.push_back(functional::scale(p, 2.0f));
  const auto replica = twice.replicate(params, {});
  const auto replicated = replica->named_parameters();
  ASSERT_EQ(replicated.size(), 2u);
  // One Linear in the replica (under both names), holding the replaced weight.
  EXPECT_EQ(replica->named_modules().size(), 2u);
  EXPECT_EQ(&replicated[0].second.impl(), &params[0].impl());
  // Its forward goes through that Linear twice: fc'(tanh(fc'(x))) with fc' = 2 fc.
  const Tensor x = from_vector<float>({0.5f, -1, 2, 0.25f}, {1, 4});
  const Tensor w = params[0], b = params[1];
  const Tensor want = functional::linear(functional::tanh(functional::linear(x, w, b)), w, b);
  EXPECT_EQ((*replica)(x).to_vector<float>(), want.to_vector<float>());
}

TEST(SharedParameters, ATensorInTwoModulesIsOneParameter) {
  struct Two : nn::Module {
    Two() {
      Generator gen(3);
      a = register_module("a", std::make_shared<nn::Linear>(3, 3, gen));
      b = register_module("b", std::make_shared<nn::Linear>(3, 3, gen));
      shared = register_parameter("shared", a->weight);
    }
    Tensor forward(const Tensor& x) override { return (*b)((*a)(x)); }
    std::string name() const override { return "Two"; }
    std::shared_ptr<nn::Linear> a, b;
    Tensor shared;
  } two;
  std::vector<std::string> names;
  for (const auto& [n, t] : two.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"shared", "a.bias", "b.weight", "b.bias"}));
}

TEST(ModuleRegistration, NullRepeatedAndDottedNamesAreRefused) {
  struct Bad : nn::Module {
    Tensor forward(const Tensor& x) override { return x; }
    std::string name() const override { return "Bad"; }
    void add_null() { register_module("fc", std::shared_ptr<nn::Linear>()); }
    void add_twice() {
      register_parameter("w", ones({1}));
      register_buffer("w", ones({1}));
    }
    void add_dotted() { register_parameter("a.b", ones({1})); }
    void add_empty() { register_parameter("", ones({1})); }
  };
  Bad bad;
  EXPECT_NE(error_text([&] { bad.add_null(); }).find("Bad: register_module(\"fc\", nullptr)"),
            std::string::npos);
  EXPECT_NE(error_text([&] { bad.add_twice(); }).find("already has a parameter, buffer or module"),
            std::string::npos);
  EXPECT_NE(error_text([&] { bad.add_dotted(); }).find("parameter name 'a.b'"), std::string::npos);
  EXPECT_NE(error_text([&] { bad.add_empty(); }).find("parameter name ''"), std::string::npos);
}

TEST(OptimizerParameters, TheSameTensorTwiceIsRefused) {
  Tensor w = ones({2});
  set_requires_grad(w, true);
  EXPECT_NE(error_text([&] {
              optim::SGD({w, ones({1}), w}, {.lr = 0.1f});
            }).find("optimizer parameters 0 and 2 are the same tensor"),
            std::string::npos);
}

TEST(OptimizerParameters, NoParameterIsRefusedAsTorchDoes) {
  EXPECT_NE(error_text([] {
              optim::SGD({}, {.lr = 0.1f});
            }).find("SGD: got an empty parameter list: nothing to train"),
            std::string::npos);
  EXPECT_NE(error_text([] {
              optim::AdamW(std::vector<Tensor>{}, {});
            }).find("AdamW: got an empty parameter list"),
            std::string::npos);
  // An empty group beside one with parameters is fine, as in torch.
  Tensor w = ones({2});
  set_requires_grad(w, true);
  EXPECT_EQ(optim::AdamW({{{w}, 0.1f}, {{}, 0.0f}}, {}).params().size(), 1u);
}

TEST(SameTask, TrainAndTestSetsOfDifferentTasksAreNamed) {
  const Tensor x = ones({4, 3});
  const Dataset two = make_dataset(x, ones({4, 2}), "two");
  const Dataset three = make_dataset(x, ones({4, 3}), "three");
  EXPECT_NE(error_text([&] { check_same_task(two, three, "UserData 'mine'"); })
                .find("UserData 'mine': the training targets are [4, 2] (2 per row) and the test "
                      "targets [4, 3] (3 per row)"),
            std::string::npos);
  const Dataset classes =
      make_dataset(x, from_vector<int64_t>({0, 1, 2, 1}, {4}, {.dtype = DType::i64}), "c");
  EXPECT_NE(error_text([&] { check_same_task(two, classes, "d"); })
                .find("d: the training set is a regression (num_classes 0) and the test set a "
                      "classification"),
            std::string::npos);
  const Dataset wide = make_dataset(ones({4, 5}), ones({4, 2}), "wide");
  EXPECT_NE(error_text([&] {
              check_same_task(two, wide, "d");
            }).find("the training inputs are [4, 3] and the test inputs [4, 5]"),
            std::string::npos);
  Dataset more = classes;
  more.num_classes = 9;
  EXPECT_NE(error_text([&] {
              check_same_task(classes, more, "d");
            }).find("the test set has 9 classes and the training set 3"),
            std::string::npos);
  check_same_task(two, two, "d");  // the same task: no error
}

}  // namespace
}  // namespace ddp
