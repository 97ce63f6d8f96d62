// DataParallel on CPU replicas (how CI exercises the mode): chunk sizes, scatter
// and gather with their gradients, module replication, the replica threads, the
// errors, and the golden equivalence: DataParallel over 2 and 3 replicas equals one
// device on the same batch (parameters after k SGD-momentum steps, 1e-5 relative).
#include "collectives/data_parallel/data_parallel.h"
#include "collectives/data_parallel/replicate.h"
#include "collectives/data_parallel/scatter_gather.h"
#include "runtime/nn/layers.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <set>
#include <thread>

namespace ddp {
namespace {

using data_parallel::chunk_sizes;
using data_parallel::gather;
using data_parallel::scatter;

const std::vector<Device> kCpu2 = {Device::cpu(), Device::cpu()};
const std::vector<Device> kCpu3 = {Device::cpu(), Device::cpu(), Device::cpu()};

// Expects the message of `fn`'s exception of type E to contain `needle`.
template <typename E, typename Fn>
void expect_throw_with(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one containing: " << needle;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// |a - b| <= rtol * (|b| + max |b|) per element: relative to the tensor's scale, so
// elements near zero are not held to a relative bound they cannot meet.
void expect_close(const Tensor& a, const Tensor& b, double rtol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const auto va = a.to_vector<float>(), vb = b.to_vector<float>();
  double scale = 0.0;
  for (float v : vb) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < va.size(); ++i) {
    ASSERT_NEAR(va[i], vb[i], rtol * (std::fabs(vb[i]) + scale))
        << what << ", element " << i << " of " << va.size();
  }
}

std::shared_ptr<nn::Sequential> dp_mlp(uint64_t seed) {
  Generator gen(seed);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Flatten>());
  model->add(std::make_shared<nn::Linear>(12, 16, gen));
  model->add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::Linear>(16, 4, gen));
  return model;
}

std::shared_ptr<nn::Sequential> dp_cnn(uint64_t seed) {
  Generator gen(seed);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Conv2d>(1, 3, 3, gen, functional::Conv2dOptions{1, 1}));
  model->add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::MaxPool2d>(2));
  model->add(std::make_shared<nn::Flatten>());
  model->add(std::make_shared<nn::Linear>(3 * 2 * 2, 4, gen));
  return model;
}

// ---- chunk sizes, scatter, gather ----

TEST(DataParallelScatter, ChunkSizesAreBalanced) {
  EXPECT_EQ(chunk_sizes(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(chunk_sizes(6, 3), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(chunk_sizes(7, 2), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(chunk_sizes(5, 1), (std::vector<int64_t>{5}));
  EXPECT_EQ(chunk_sizes(2, 3), (std::vector<int64_t>{1, 1})) << "fewer replicas run";
  EXPECT_EQ(chunk_sizes(0, 3), (std::vector<int64_t>{0}));
  EXPECT_THROW(chunk_sizes(4, 0), ValueError);
}

TEST(DataParallelScatter, UnevenChunksOfIntegerLabels) {
  const Tensor labels = arange(7, {.dtype = DType::i64});
  const auto chunks = scatter(labels, kCpu3);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(chunks[1].to_vector<int64_t>(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(chunks[2].to_vector<int64_t>(), (std::vector<int64_t>{5, 6}));
  for (const Tensor& c : chunks) {
    EXPECT_EQ(c.dtype(), DType::i64);
    EXPECT_EQ(c.storage(), labels.storage()) << "a chunk on the input's device is a view";
  }
}

TEST(DataParallelScatter, BatchSmallerThanReplicasUsesFewerReplicas) {
  const Tensor x = from_vector<float>({1, 2, 3, 4}, {2, 2});
  const auto chunks = scatter(x, kCpu3);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_EQ(chunks[1].to_vector<float>(), (std::vector<float>{3, 4}));
  expect_throw_with<ValueError>([] { scatter(from_vector<float>({1}, {}), kCpu2); },
                                "must have a batch dimension");
}

TEST(DataParallelScatter, GatherConcatenatesUnevenOutputs) {
  const Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  const Tensor b = from_vector<float>({7, 8}, {1, 2});
  const Tensor out = gather({a, b}, Device::cpu());
  EXPECT_EQ(out.shape(), (Shape{4, 2}));
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  expect_throw_with<ValueError>(
      [&] {
        gather({a, from_vector<float>({1, 2, 3}, {1, 3})}, Device::cpu());
      },
      "replica 1 returned [1, 3] (f32) but replica 0 returned [3, 2]");
  expect_throw_with<ValueError>([] { gather({from_vector<float>({1}, {})}, Device::cpu()); },
                                "0-dimensional");
}

TEST(DataParallelScatter, GradientsFlowBackThroughGatherAndScatter) {
  // y = gather(chunk_i * (i + 1)); d sum(y) / dx: row r gets (index of its chunk) + 1.
  Tensor x = randn({5, 3}, 1);
  set_requires_grad(x, true);
  const auto chunks = scatter(x, kCpu3);  // rows 2, 2, 1
  std::vector<Tensor> outs;
  for (size_t i = 0; i < chunks.size(); ++i) {
    outs.push_back(functional::scale(chunks[i], static_cast<float>(i + 1)));
  }
  backward(functional::sum(gather(outs, Device::cpu())));
  const std::vector<float> row_factor = {1, 1, 2, 2, 3};
  const auto g = grad(x).to_vector<float>();
  ASSERT_EQ(g.size(), 15u);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(g[i], row_factor[i / 3]) << "element " << i;
}

// ---- replication ----

TEST(DataParallelReplicate, ReplicaUsesTheGivenTensors) {
  auto model = dp_mlp(1);
  std::vector<Tensor> params;
  for (const Tensor& p : model->parameters()) params.push_back(zeros(p.shape()));
  params.back() = from_vector<float>({1, 2, 3, 4}, {4});  // the last bias
  const auto replica = model->replicate(params, {});
  const Tensor y = (*replica)(randn({2, 12}, 2));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4}))
      << "Linear::weight/bias must be re-pointed to the replica's parameters";
  EXPECT_NE(model->parameters()[0].to_vector<float>(), params[0].to_vector<float>())
      << "the original is unchanged";
  EXPECT_EQ(replica->str(), model->str());
  expect_throw_with<ValueError>([&] { model->replicate({}, {}); },
                                "got 0 parameters and 0 buffers for a module with 4 and 0");
}

TEST(DataParallelReplicate, ModuleWithoutCloneableSaysHowToFix) {
  struct Plain : nn::Module {
    Tensor forward(const Tensor& x) override { return x; }
    std::string name() const override { return "Plain"; }
  };
  Plain plain;
  expect_throw_with<ValueError>([&] { plain.replicate({}, {}); },
                                "derive it from nn::Cloneable<Plain>");
}

TEST(DataParallelReplicate, CoalescedCopyKeepsValuesOrderAndDtypes) {
  const std::vector<Tensor> tensors = {from_vector<float>({1, 2, 3, 4}, {2, 2}),
                                       from_vector<int64_t>({5, 6}, {2}),
                                       from_vector<float>({7}, {1})};
  const auto copies = data_parallel::copy_coalesced(tensors, Device::cpu());
  ASSERT_EQ(copies.size(), 3u);
  EXPECT_EQ(copies[0].to_vector<float>(), tensors[0].to_vector<float>());
  EXPECT_EQ(copies[0].shape(), (Shape{2, 2}));
  EXPECT_EQ(copies[1].to_vector<int64_t>(), tensors[1].to_vector<int64_t>());
  EXPECT_EQ(copies[2].to_vector<float>(), tensors[2].to_vector<float>());
  EXPECT_EQ(copies[0].storage(), copies[2].storage()) << "one buffer per dtype";
  EXPECT_NE(copies[0].storage(), tensors[0].storage()) << "a copy, not a view";
}

TEST(DataParallelReplicate, ReplicaGradientsSumIntoTheOriginal) {
  // Replica r multiplies by its weight; d/dw sum_r sum(w_r * x) = sum of every x.
  auto model = std::make_shared<nn::Sequential>();
  Generator gen(3);
  model->add(std::make_shared<nn::Linear>(2, 1, gen, /*bias=*/false));
  const auto replicas = data_parallel::replicate(*model, kCpu3);
  ASSERT_EQ(replicas.size(), 3u);
  Tensor total;
  for (size_t r = 0; r < replicas.size(); ++r) {
    const Tensor x = full({1, 2}, static_cast<double>(r + 1));
    const Tensor y = functional::sum((*replicas[r])(x));
    total = total.defined() ? functional::add(total, y) : y;
  }
  backward(total);
  EXPECT_EQ(grad(model->parameters()[0]).to_vector<float>(), (std::vector<float>{6, 6}));
  EXPECT_FALSE(is_leaf(replicas[1]->parameters()[0])) << "replica parameters are not leaves";
}

// ---- threads ----

TEST(DataParallelThreads, EachReplicaHasItsOwnThreadEveryCall) {
  data_parallel::ReplicaThreads threads(3);
  std::vector<std::thread::id> first(3), second(3);
  auto jobs_into = [](std::vector<std::thread::id>& ids) {
    std::vector<std::function<void()>> jobs;
    for (size_t i = 0; i < ids.size(); ++i) {
      jobs.emplace_back([&ids, i] { ids[i] = std::this_thread::get_id(); });
    }
    return jobs;
  };
  threads.run(jobs_into(first), kCpu3);
  threads.run(jobs_into(second), kCpu3);
  EXPECT_EQ(first[0], std::this_thread::get_id()) << "job 0 runs on the caller";
  EXPECT_EQ(std::set<std::thread::id>(first.begin(), first.end()).size(), 3u);
  EXPECT_EQ(first, second) << "the same thread per replica every call";
  std::vector<std::thread::id> two(2);
  threads.run(jobs_into(two), kCpu3);  // fewer jobs than threads
  EXPECT_EQ(two[1], first[1]);
}

TEST(DataParallelThreads, ReplicaErrorKeepsItsTypeAndNamesTheReplica) {
  data_parallel::ReplicaThreads threads(2);
  std::vector<std::function<void()>> jobs = {[] {}, [] { throw DeviceError("out of luck"); }};
  expect_throw_with<DeviceError>([&] { threads.run(jobs, kCpu2); },
                                 "replica 1 on cpu: out of luck");
  threads.run({[] {}, [] {}}, kCpu2);  // still usable after a failure
}

// Records the grad mode each replica's forward ran with.
class GradModeProbe : public nn::Cloneable<GradModeProbe> {
 public:
  explicit GradModeProbe(std::shared_ptr<std::vector<int>> seen) : seen_(std::move(seen)) {
    register_parameter("w", ones({1}));
  }
  Tensor forward(const Tensor& x) override {
    std::lock_guard<std::mutex> lock(*mutex_);
    seen_->push_back(grad_mode_enabled() ? 1 : 0);
    return x;
  }
  std::string name() const override { return "GradModeProbe"; }

 private:
  std::shared_ptr<std::vector<int>> seen_;
  std::shared_ptr<std::mutex> mutex_ = std::make_shared<std::mutex>();
};

TEST(DataParallelThreads, ReplicasRunWithTheCallersGradMode) {
  auto seen = std::make_shared<std::vector<int>>();
  DataParallel dp(std::make_shared<GradModeProbe>(seen), kCpu3);
  dp(zeros({3, 1}));
  EXPECT_EQ(*seen, (std::vector<int>{1, 1, 1}));
  seen->clear();
  {
    NoGradGuard no_grad;
    dp(zeros({3, 1}));
  }
  EXPECT_EQ(*seen, (std::vector<int>{0, 0, 0})) << "worker threads start with grad mode on";
}

// ---- DataParallel ----

TEST(DataParallel, DeviceErrors) {
  expect_throw_with<ValueError>(
      [] {
        DataParallel(dp_mlp(1), {Device::cpu(), Device::cuda(0)});
      },
      "devices must all be of one type");
  expect_throw_with<DeviceError>(
      [] {
        DataParallel(dp_mlp(1), {Device::cuda(99), Device::cuda(99)});
      },
      "cuda:99 is not available");
  if (device_count(DeviceType::cuda) == 0) {
    expect_throw_with<DeviceError>([] { DataParallel(dp_mlp(1)); }, "no CUDA device is available");
  }
  expect_throw_with<ValueError>([] { DataParallel(nullptr, kCpu2); }, "module is null");
}

TEST(DataParallel, ParsesDeviceLists) {
  EXPECT_EQ(parse_device_list("cpu,cpu"), kCpu2);
  EXPECT_EQ(parse_device_list("cuda:0, cuda:1"),
            (std::vector<Device>{Device::cuda(0), Device::cuda(1)}));
  expect_throw_with<ValueError>([] { parse_device_list("cpu,,cpu"); }, "empty entry");
  EXPECT_THROW(parse_device_list("gpu"), ValueError);
}

TEST(DataParallel, ErrorInAReplicaNamesIt) {
  DataParallel dp(dp_mlp(1), kCpu2);
  expect_throw_with<ValueError>([&] { dp(randn({4, 5}, 1)); }, "replica 0 on cpu: linear: input");
}

TEST(DataParallel, ForwardMatchesOneDeviceAndUsesFewerReplicasForSmallBatches) {
  auto model = dp_mlp(1);
  DataParallel dp(model, kCpu3);
  const Tensor x = randn({7, 12}, 5);
  const Tensor y = dp(x);
  EXPECT_EQ(dp.last_stats().replicas, 3u);
  expect_close(y, (*model)(x), 1e-6, "forward of 7 rows over 3 replicas");
  dp(randn({2, 12}, 6));
  EXPECT_EQ(dp.last_stats().replicas, 2u);
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(requires_grad(dp(x)));
  }
}

TEST(DataParallel, DropoutReplicasDrawDistinctMasks) {
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Dropout>(0.5f, 3));
  DataParallel dp(model, kCpu2);
  const Tensor x = ones({2, 256});
  const auto a = dp(x).to_vector<float>(), b = dp(x).to_vector<float>();
  const std::vector<float> a0(a.begin(), a.begin() + 256), a1(a.begin() + 256, a.end());
  EXPECT_NE(a0, a1) << "the two replicas drew the same mask";
  EXPECT_NE(a, b) << "the second forward repeated the first's masks";
}

// The golden parity test: k SGD-momentum steps with DataParallel over `devices`
// against the same steps on one device with the whole batch.
void expect_equivalent_training(std::shared_ptr<nn::Sequential> (*make)(uint64_t),
                                const Shape& input_shape, const std::vector<Device>& devices) {
  constexpr int kSteps = 5;
  auto single = make(11), wrapped = make(11);
  optim::SGD opt_single(single->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  optim::SGD opt_dp(wrapped->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  DataParallel dp(wrapped, devices);
  for (int step = 0; step < kSteps; ++step) {
    const Tensor x = randn(input_shape, 100 + static_cast<uint64_t>(step));
    const auto raw = rand({input_shape[0]}, 200 + static_cast<uint64_t>(step)).to_vector<float>();
    std::vector<int64_t> label_values;
    for (float r : raw) label_values.push_back(static_cast<int64_t>(r * 4.0f) % 4);
    const Tensor labels = from_vector<int64_t>(label_values, {input_shape[0]});

    opt_single.zero_grad(true);
    backward(functional::cross_entropy((*single)(x), labels));
    opt_single.step();

    opt_dp.zero_grad(true);
    backward(functional::cross_entropy(dp(x), labels));
    ASSERT_EQ(dp.last_stats().replicas,
              std::min(devices.size(), static_cast<size_t>(input_shape[0])));
    opt_dp.step();
  }
  const auto a = wrapped->named_parameters(), b = single->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    expect_close(
        a[i].second, b[i].second, 1e-5,
        fmt::format("{} after {} steps over {} replicas", a[i].first, kSteps, devices.size()));
  }
}

TEST(DataParallel, EquivalentToOneDeviceMlp2Replicas) {
  expect_equivalent_training(dp_mlp, {10, 12}, kCpu2);
}

TEST(DataParallel, EquivalentToOneDeviceMlp3ReplicasUnevenBatch) {
  expect_equivalent_training(dp_mlp, {10, 12}, kCpu3);  // chunks 4, 3, 3
}

TEST(DataParallel, EquivalentToOneDeviceCnn3Replicas) {
  expect_equivalent_training(dp_cnn, {8, 1, 4, 4}, kCpu3);  // chunks 3, 3, 2
}

}  // namespace
}  // namespace ddp
