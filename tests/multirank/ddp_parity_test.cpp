// Golden parity of DistributedDataParallel (collectives/ddp/): N ranks with b
// rows each train to the same parameters as one process on the N * b rows, and
// construction fails on every rank when the ranks' models differ.
//
// Tolerance: per tensor, max |ddp - reference| <= 1e-5 * max |reference|. The
// two differ only in float32 summation order (per-rank means averaged versus
// one mean), about 1e-7 relative per step.
#include "collectives/ddp/distributed_data_parallel.h"
#include "models/zoo.h"
#include "runtime/autograd/functions.h"
#include "runtime/optim/optimizer.h"
#include "tests/multirank/conformance.h"
#include "tests/multirank/spawn.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

namespace ddp::test {
namespace {

using functional::cross_entropy;

constexpr int64_t kRowsPerRank = 4;
constexpr int kSteps = 5;
constexpr double kRelTol = 1e-5;

std::shared_ptr<nn::Sequential> tiny_mlp(uint64_t seed, std::vector<int64_t> hidden = {16, 8}) {
  models::ModelConfig config;
  config.hidden = std::move(hidden);
  Generator gen(seed);
  return models::make_model(config, gen);
}

struct Batch {
  Tensor x, labels;
  Batch rows(int64_t begin, int64_t end) const {
    return {x.slice(begin, end), labels.slice(begin, end)};
  }
};

// The global batch of micro-batch `micro` of step `step`: world * kRowsPerRank rows.
Batch global_batch(int world, int step, int micro) {
  const int64_t n = world * kRowsPerRank;
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = (i * 7 + step * 3 + micro) % 10;
  const auto seed = static_cast<uint64_t>(1000 + step * 10 + micro);
  return {randn({n, 1, 28, 28}, seed), from_vector<int64_t>(labels, {n})};
}

optim::SGD make_sgd(nn::Module& model) {
  return optim::SGD(model.parameters(), {.lr = 0.1f, .momentum = 0.9f});
}

// One process on the whole batch: micro-batches accumulate into .grad.
std::shared_ptr<nn::Sequential> train_reference(int world, int micro_batches) {
  auto model = tiny_mlp(1);
  optim::SGD sgd = make_sgd(*model);
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad(true);
    for (int m = 0; m < micro_batches; ++m) {
      const Batch b = global_batch(world, step, m);
      backward(cross_entropy(model->forward(b.x), b.labels));
    }
    sgd.step();
  }
  return model;
}

struct ParityCase {
  int world = 2;
  std::string backend = "shm";
  double bucket_cap_mb = 25;
  int micro_batches = 1;  // > 1: all but the last under no_sync()
};

void train_ddp(DistributedDataParallel& ddp, int rank, int world, int micro_batches) {
  optim::SGD sgd = make_sgd(ddp.module());
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad(true);
    for (int m = 0; m < micro_batches; ++m) {
      const Batch b =
          global_batch(world, step, m).rows(rank * kRowsPerRank, (rank + 1) * kRowsPerRank);
      if (m + 1 < micro_batches) {
        auto guard = ddp.no_sync();
        ddp.backward(cross_entropy(ddp(b.x), b.labels));
      } else {
        ddp.backward(cross_entropy(ddp(b.x), b.labels));
      }
    }
    sgd.step();
  }
}

void expect_close(const nn::Module& got, const nn::Module& want, int rank) {
  const nn::NamedTensors g = got.named_parameters(), w = want.named_parameters();
  require(g.size() == w.size(), "parameter counts differ");
  for (size_t k = 0; k < g.size(); ++k) {
    const std::vector<float> a = g[k].second.to_vector<float>(), b = w[k].second.to_vector<float>();
    double max_ref = 0, max_diff = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_ref = std::max(max_ref, std::abs(double(b[i])));
      max_diff = std::max(max_diff, std::abs(double(a[i]) - double(b[i])));
    }
    require(max_diff <= kRelTol * max_ref,
            fmt::format("rank {}: parameter '{}' differs from the single-process reference by {} "
                        "(max |reference| {})",
                        rank, g[k].first, max_diff, max_ref));
  }
}

int parity_body(const ParityCase& c, int rank, int world) {
  auto comm = make_backend(c.backend, rank, world, {.timeout = std::chrono::milliseconds(30000)});
  // Rank-dependent initial values: only rank 0's broadcast makes them agree.
  DdpOptions options;
  options.bucket_cap_mb = c.bucket_cap_mb;
  options.first_bucket_mb = std::min(1.0, c.bucket_cap_mb);
  DistributedDataParallel ddp(tiny_mlp(1 + static_cast<uint64_t>(rank)), comm, options);
  if (c.bucket_cap_mb < 1e-3) {
    require(ddp.buckets().size() == ddp.module().parameters().size(),
            fmt::format("a tiny cap should give one bucket per parameter, got {}",
                        ddp.buckets().size()));
  }
  train_ddp(ddp, rank, world, c.micro_batches);
  expect_close(ddp.module(), *train_reference(world, c.micro_batches), rank);
  return 0;
}

void run_parity(const ParityCase& c) {
  for (const RankResult& r :
       spawn_ranks(c.world, [&](int rank, int size) { return parity_body(c, rank, size); })) {
    EXPECT_TRUE(r.ok()) << r.describe();
  }
}

TEST(DdpParity, TwoRanks) {
  run_parity({.world = 2});
}
TEST(DdpParity, ThreeRanks) {
  run_parity({.world = 3});
}
TEST(DdpParity, ManyBucketsTwoRanks) {
  run_parity({.world = 2, .bucket_cap_mb = 1e-6});
}
TEST(DdpParity, ManyBucketsThreeRanks) {
  run_parity({.world = 3, .bucket_cap_mb = 1e-6});
}
TEST(DdpParity, NoSyncAccumulationTwoRanks) {
  run_parity({.world = 2, .micro_batches = 2});
}
TEST(DdpParity, NoSyncAccumulationThreeRanksManyBuckets) {
  run_parity({.world = 3, .bucket_cap_mb = 1e-6, .micro_batches = 2});
}

TEST(DdpConstruction, DifferentModelsFailNamingTheMismatch) {
  const auto results = spawn_ranks(2, [](int rank, int world) {
    auto comm = make_backend("shm", rank, world, {.timeout = std::chrono::milliseconds(30000)});
    try {
      DistributedDataParallel ddp(tiny_mlp(1, {rank == 1 ? 17 : 16}), comm);
    } catch (const ValueError& e) {
      const std::string what = e.what();
      require(what.find("shape [16, 784] on rank 0") != std::string::npos &&
                  what.find("shape [17, 784] on rank 1") != std::string::npos,
              "unexpected message: " + what);
      return 0;
    }
    throw std::runtime_error("construction succeeded with different models");
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

// An MLP and a parameter that no loss uses.
class WithUnused : public nn::Module {
 public:
  explicit WithUnused(uint64_t seed) {
    unused_ = register_parameter("unused", zeros({3}));
    mlp_ = register_module("mlp", tiny_mlp(seed));
  }
  Tensor forward(const Tensor& x) override { return mlp_->forward(x); }
  std::string name() const override { return "WithUnused"; }

 private:
  Tensor unused_;
  std::shared_ptr<nn::Sequential> mlp_;
};

int unused_body(bool find_unused, int rank, int world) {
  auto comm = make_backend("shm", rank, world, {.timeout = std::chrono::milliseconds(30000)});
  DdpOptions options;
  options.find_unused_parameters = find_unused;
  options.bucket_cap_mb = 1e-6;  // "unused" alone in the first bucket
  DistributedDataParallel ddp(std::make_shared<WithUnused>(1), comm, options);
  const Batch b = global_batch(world, 0, 0).rows(rank * kRowsPerRank, (rank + 1) * kRowsPerRank);
  try {
    ddp.backward(cross_entropy(ddp(b.x), b.labels));
  } catch (const ValueError& e) {
    const std::string what = e.what();
    require(!find_unused, "find_unused_parameters = true threw: " + what);
    require(what.find("unused") != std::string::npos &&
                what.find("find_unused_parameters = true") != std::string::npos,
            "unexpected message: " + what);
    return 0;
  }
  require(find_unused, "an unused parameter passed without find_unused_parameters");
  const nn::NamedTensors params = ddp.module().named_parameters();
  require(params[0].first == "unused", "expected 'unused' first");
  for (float v : grad(params[0].second).to_vector<float>())
    require(v == 0.0f, "unused grad not zero");
  require(grad(params[1].second).defined(), "used parameter without a gradient");
  return 0;
}

void run_unused(bool find_unused) {
  for (const RankResult& r :
       spawn_ranks(2, [&](int rank, int size) { return unused_body(find_unused, rank, size); })) {
    EXPECT_TRUE(r.ok()) << r.describe();
  }
}

TEST(DdpUnused, UnusedParameterIsAnErrorNamingIt) {
  run_unused(false);
}
TEST(DdpUnused, FindUnusedParametersReducesZeros) {
  run_unused(true);
}

}  // namespace
}  // namespace ddp::test
