// Note [forward hooks] (runtime/nn/module.h) and Note [released storage]
// (runtime/tensor.h), the two pieces ZeRO-3 builds on: hooks run around a call
// through operator() and not around forward(), in registration order, a post
// hook may replace the output, removal works, Sequential calls its layers with
// their hooks, replicas carry none; a released storage frees its memory while
// its views stay, reading them is a named error, and reallocation makes every
// view usable again.
#include "runtime/memory/allocator.h"
#include "runtime/nn/layers.h"
#include "runtime/ops/ops.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ddp {
namespace {

std::shared_ptr<nn::Sequential> two_layers() {
  auto seq = std::make_shared<nn::Sequential>();
  Generator gen(5);
  seq->add(std::make_shared<nn::Linear>(3, 4, gen));
  seq->add(std::make_shared<nn::ReLU>());
  seq->add(std::make_shared<nn::Linear>(4, 2, gen));
  return seq;
}

TEST(ForwardHooks, RunAroundCallsNotAroundForward) {
  auto seq = two_layers();
  std::vector<std::string> log;
  const int id = seq->add_forward_hooks([&](nn::Module&) { log.push_back("pre"); },
                                        [&](nn::Module&, const Tensor& out) {
                                          log.push_back("post");
                                          return out;
                                        });
  const Tensor x = ones({2, 3});
  (void)seq->forward(x);
  EXPECT_TRUE(log.empty()) << "forward() ran hooks; only a call does (as torch's .forward())";
  (void)(*seq)(x);
  EXPECT_EQ(log, (std::vector<std::string>{"pre", "post"}));
  seq->remove_forward_hooks(id);
  (void)(*seq)(x);
  EXPECT_EQ(log.size(), 2u) << "a removed hook still ran";
}

TEST(ForwardHooks, PostHookReplacesTheOutputAndSequentialCallsLayers) {
  auto seq = two_layers();
  int layer_calls = 0;
  const auto layers = seq->named_modules();
  ASSERT_EQ(layers.size(), 4u) << "the Sequential and its three layers";
  EXPECT_EQ(layers[1].first, "0");
  layers[1].second->add_forward_hooks([&](nn::Module&) { ++layer_calls; }, {});
  seq->add_forward_hooks({}, [](nn::Module&, const Tensor& out) { return scale(out, 0.0f); });
  const Tensor out = (*seq)(ones({2, 3}));
  EXPECT_EQ(layer_calls, 1) << "Sequential did not call its layer through its hooks";
  for (float v : out.to_vector<float>())
    EXPECT_EQ(v, 0.0f) << "the post hook's output was not used";
  const auto replica = seq->replicate(seq->parameters(), {});
  (void)(*replica)(ones({2, 3}));
  EXPECT_EQ(layer_calls, 1) << "a replica carried the hooks";
}

TEST(ReleasedStorage, FreesMemoryKeepsViewsAndNamesTheMisuse) {
  Tensor t = full({1024, 64}, 2.0);
  const Tensor view = t.slice(10, 20);
  const uint64_t before = memory_allocated(Device::cpu());
  t.storage()->release();
  EXPECT_TRUE(t.storage()->released());
  EXPECT_LT(memory_allocated(Device::cpu()), before) << "release() kept the memory";
  EXPECT_EQ(view.storage(), t.storage()) << "the view lost its storage";
  try {
    (void)view.to_vector<float>();
    ADD_FAILURE() << "reading released memory did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shape [10, 64] is used while its memory is released"),
              std::string::npos)
        << e.what();
  }
  t.storage()->reallocate();
  EXPECT_FALSE(t.storage()->released());
  fill_(t, 3.0);
  for (float v : view.to_vector<float>()) ASSERT_EQ(v, 3.0f) << "the view does not see new data";
  Tensor blob = from_blob(t.data_ptr(), {4}, {});
  EXPECT_THROW(blob.storage()->release(), ValueError) << "from_blob memory is not ours to free";
}

}  // namespace
}  // namespace ddp
