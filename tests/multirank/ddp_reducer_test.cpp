// The reducer's options beyond the golden parity suite: gradient_as_bucket_view
// (with both kinds of zero_grad), the bucket rebuild from the observed gradient
// order, and its timing statistics. shm, 2 ranks.
#include "collectives/ddp/distributed_data_parallel.h"
#include "runtime/autograd/autograd.h"
#include "runtime/autograd/functions.h"
#include "runtime/optim/optimizer.h"
#include "tests/multirank/conformance.h"
#include "tests/multirank/ddp_parity.h"
#include "tests/multirank/spawn.h"

#include <gtest/gtest.h>
#include "runtime/fmt.h"

namespace ddp::test {
namespace {

using functional::cross_entropy;

std::shared_ptr<Communicator> shm(int rank, int world) {
  return make_backend("shm", rank, world, {.timeout = std::chrono::milliseconds(30000)});
}

void expect_all_ok(const std::vector<RankResult>& results) {
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

// Parity with gradient_as_bucket_view; after backward every .grad lies in its bucket.
int view_body(bool set_to_none, int rank, int world) {
  DdpOptions options;
  options.gradient_as_bucket_view = true;
  DistributedDataParallel ddp(tiny_mlp(1 + static_cast<uint64_t>(rank)), shm(rank, world), options);
  optim::SGD sgd(ddp.module().parameters(), {.lr = 0.1f, .momentum = 0.9f});
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad(set_to_none);
    const Batch b = rank_batch(world, rank, step, 0);
    ddp.backward(cross_entropy(ddp(b.x), b.labels));
    // One bucket (default caps): the grads are consecutive slices of one tensor,
    // in plan order.
    const auto& bucket = ddp.buckets().at(0);
    const nn::NamedTensors named = ddp.module().named_parameters();
    for (size_t k = 0; k + 1 < bucket.params.size(); ++k) {
      const std::string& name = ddp.bucket_parameters()[bucket.params[k]];
      const std::string& next = ddp.bucket_parameters()[bucket.params[k + 1]];
      Tensor g, h;
      for (const auto& [n, p] : named) {
        if (n == name) g = grad(p);
        if (n == next) h = grad(p);
      }
      require(static_cast<const float*>(g.data_ptr()) + g.numel() == h.data_ptr(),
              fmt::format("step {}: .grad of '{}' and '{}' are not adjacent bucket views", step,
                          name, next));
    }
    sgd.step();
  }
  // train_reference runs the same steps on the global batch.
  expect_close(ddp.module(), *train_reference(world, 1), rank);
  return 0;
}

TEST(DdpReducer, GradientAsBucketViewSetToNone) {
  expect_all_ok(spawn_ranks(2, [](int r, int w) { return view_body(true, r, w); }));
}
TEST(DdpReducer, GradientAsBucketViewZeroInPlace) {
  expect_all_ok(spawn_ranks(2, [](int r, int w) { return view_body(false, r, w); }));
}

// Registered first, applied last: backward completes "first" before "second",
// the reverse of Note [bucket order]'s guess, so the rebuild must change the plan.
class Swapped : public nn::Module {
 public:
  explicit Swapped(uint64_t seed) {
    Generator gen(seed);
    first_ = register_module("first", std::make_shared<nn::Linear>(8, 4, gen));
    second_ = register_module("second", std::make_shared<nn::Linear>(6, 8, gen));
  }
  Tensor forward(const Tensor& x) override { return first_->forward(second_->forward(x)); }
  std::string name() const override { return "Swapped"; }

 private:
  std::shared_ptr<nn::Linear> first_, second_;
};

int rebuild_body(bool view, int rank, int world) {
  DdpOptions options;
  options.bucket_cap_mb = 1e-6;  // one parameter per bucket
  options.first_bucket_mb = 1e-6;
  options.gradient_as_bucket_view = view;
  DistributedDataParallel ddp(std::make_shared<Swapped>(7), shm(rank, world), options);
  auto reference = std::make_shared<Swapped>(7);
  optim::SGD sgd(ddp.module().parameters(), {.lr = 0.1f, .momentum = 0.9f});
  optim::SGD ref_sgd(reference->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  auto first_bucket = [&] { return ddp.bucket_parameters()[ddp.buckets()[0].params[0]]; };
  require(first_bucket().starts_with("second."),
          "before the rebuild, bucket 0 should hold a "
          "parameter of 'second' (reverse registration), "
          "got " +
              first_bucket());
  for (int step = 0; step < 4; ++step) {
    // Every rank sees the same rows: the average equals the local gradient, so
    // DDP must match the reference exactly.
    const Tensor x = randn({5, 6}, 100 + static_cast<uint64_t>(step));
    const Tensor labels = from_vector<int64_t>({0, 1, 2, 3, 1}, {5});
    sgd.zero_grad(true);
    ddp.backward(cross_entropy(ddp(x), labels));
    sgd.step();
    ref_sgd.zero_grad(true);
    backward(cross_entropy(reference->forward(x), labels));
    ref_sgd.step();
    require(ddp.buckets_rebuilt(), "the buckets were not rebuilt after the first backward");
    require(first_bucket().starts_with("first."),
            "after the rebuild, bucket 0 should hold a parameter of 'first' (ready first), got " +
                first_bucket());
    expect_close(ddp.module(), *reference, rank, 0.0);
  }
  const CommStats& stats = ddp.comm_stats();
  require(stats.buckets == 4 &&
              stats.bytes == static_cast<int64_t>(sizeof(float)) * (8 * 4 + 4 + 6 * 8 + 8),
          fmt::format("comm stats: {} buckets, {} bytes", stats.buckets, stats.bytes));
  require(stats.comm_s > 0 && stats.exposed_s >= 0, "the shm backend should time its all_reduces");
  return 0;
}

TEST(DdpReducer, RebuildsBucketsInTheObservedOrder) {
  expect_all_ok(spawn_ranks(2, [](int r, int w) { return rebuild_body(false, r, w); }));
}
TEST(DdpReducer, RebuildsBucketsInTheObservedOrderWithViews) {
  expect_all_ok(spawn_ranks(2, [](int r, int w) { return rebuild_body(true, r, w); }));
}

// Note [last bucket on the caller]: the backward waits for the last bucket's
// all_reduce (in_backward_s, counted in exposed_s), the result is the average.
TEST(DdpReducer, TheBackwardWaitsForTheLastBucket) {
  expect_all_ok(spawn_ranks(2, [](int rank, int world) {
    DistributedDataParallel ddp(tiny_mlp(1 + static_cast<uint64_t>(rank)), shm(rank, world), {});
    optim::SGD sgd(ddp.module().parameters(),
                   {.lr = 0.1f, .momentum = 0.9f});  // as train_reference
    for (int step = 0; step < kSteps; ++step) {
      sgd.zero_grad(true);
      const Batch b = rank_batch(world, rank, step, 0);
      ddp.backward(cross_entropy(ddp(b.x), b.labels));
      const CommStats& stats = ddp.comm_stats();
      require(stats.in_backward_s > 0 && stats.in_backward_s <= stats.exposed_s,
              fmt::format("step {}: the backward's wait for the last bucket {} s, exposed {} s",
                          step, stats.in_backward_s, stats.exposed_s));
      sgd.step();
    }
    expect_close(ddp.module(), *train_reference(world, 1), rank);
    return 0;
  }));
}

// The last bucket's collective fails inside the backward (rank 1 is gone): the
// error is thrown by finish_backward(), as for every bucket, not by backward().
TEST(DdpReducer, ALastBucketErrorIsThrownByFinishBackward) {
  expect_all_ok(spawn_ranks(2, [](int rank, int world) {
    DistributedDataParallel ddp(tiny_mlp(1), shm(rank, world), {});
    if (rank == 1) return 0;  // exits: rank 0's all_reduce fails, naming it
    const Batch b = rank_batch(world, rank, 0, 0);
    backward(cross_entropy(ddp(b.x), b.labels));
    try {
      ddp.finish_backward();
    } catch (const CommError& e) {
      require(std::string(e.what()).find("rank 1") != std::string::npos,
              std::string("the error does not name rank 1: ") + e.what());
      return 0;
    }
    throw std::runtime_error("finish_backward() did not throw with rank 1 gone");
  }));
}

}  // namespace
}  // namespace ddp::test
