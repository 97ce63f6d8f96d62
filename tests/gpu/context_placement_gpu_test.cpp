// Per-rank context placement: a rank bound to cuda:k creates a CUDA context on
// cuda:k only. A context on another GPU costs that GPU hundreds of MiB per rank
// (eight ranks on an eight-GPU node put eight contexts on GPU 0) and is what a
// thread that never set its device creates when it touches CUDA (its current
// device is 0): a loader's prefetch thread allocating pinned memory, a guard that
// "restores" device 0 in such a thread, a communication thread.
//
// Each check runs in a fresh process (a gtest death test in the "threadsafe"
// style re-executes this binary), since contexts are per process and other tests
// in this one have used cuda:0. The driver is asked directly
// (tests/gpu/driver_context.h). Without a GPU every test skips and says why; the
// cross-device checks need two GPUs.
#include "collectives/backends.h"
#include "collectives/bootstrap.h"
#include "collectives/ddp/distributed_data_parallel.h"
#include "ddp/config.h"
#include "runtime/autograd/autograd.h"
#include "runtime/autograd/functions.h"
#include "runtime/data/loader.h"
#include "runtime/nn/layers.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "runtime/stream.h"
#include "tests/gpu/driver_context.h"
#include "tests/gpu/require_gpu.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace ddp {
namespace {

using namespace std::chrono_literals;

// What a rank does, bound to cuda:`device` the way init_process_group binds it:
// a DataLoader prefetching pinned batches on a background thread, DDP over nccl
// (world size 1, where built; else the local backend) for a few steps, and ops
// from a thread that never set its device. Returns "" or what went wrong.
std::string work_as_rank_on(int device) {
  const std::string name = "cuda:" + std::to_string(device);
  ProcessGroupOptions options;
  options.backend = "local";
  options.device = name;
  ProcessGroup pg = init_process_group(options);
  if (pg.device != Device::cuda(device)) return "init_process_group bound " + pg.device.str();
  std::shared_ptr<Communicator> comm = pg.comm;
  if (DDP_HAVE_NCCL) {
    comm = make_nccl_communicator(
        nullptr, {.rank = 0, .size = 1, .device = device, .comm = {.timeout = 60s}});
  }
  Generator gen(3);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(784, 64, gen));
  model->add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::Linear>(64, 10, gen));
  model->to(pg.device);
  DistributedDataParallel ddp(model, comm, {.bucket_cap_mb = 0.1, .first_bucket_mb = 0.1});
  optim::SGD opt(model->parameters(), {.lr = 0.05f, .momentum = 0.9f});
  const Dataset data = make_synthetic({.n = 512, .shape = {784}, .seed = 5});
  DataLoader loader(data, {.batch_size = 64, .device = pg.device},
                    DistributedSampler(data.size(), 0, 1, {.shuffle = true, .seed = 1}));
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    loader.start_epoch(epoch);
    for (Batch b; loader.next(b);) {
      opt.zero_grad(true);
      ddp.backward(functional::cross_entropy(ddp.forward(b.inputs), b.labels));
      opt.step();
    }
  }
  std::string thread_error;
  std::thread helper([&] {
    try {
      const Tensor x = randn({128, 128}, 9, {.device = pg.device});
      const Tensor y = matmul(x, x).to(Device::cpu());
      (void)x.to(Device::cpu(), /*non_blocking=*/true);
      if (y.numel() != 128 * 128) thread_error = "matmul gave " + shape_str(y.shape());
    } catch (const std::exception& e) {
      thread_error = std::string("ops from a new thread failed: ") + e.what();
    }
  });
  helper.join();
  synchronize(pg.device);
  return thread_error;
}

// "" when exactly cuda:`device` has an active primary context, else what is wrong.
std::string check_contexts(int device) {
  std::string problems;
  for (int i = 0; i < device_count(DeviceType::cuda); ++i) {
    std::string why;
    const std::optional<bool> active = gpu_test::primary_context_active(i, &why);
    if (!active)
      return "cannot query the primary context of cuda:" + std::to_string(i) + ": " + why;
    if (*active != (i == device)) {
      problems +=
          "cuda:" + std::to_string(i) + (*active ? " has" : " has no") + " primary context; ";
    }
  }
  return problems.empty()
             ? ""
             : problems + "a rank on cuda:" + std::to_string(device) + " must have one there only";
}

// The death test's statement: exits 0 with "context placement: ok", or 1 with the problem.
[[noreturn]] void run_rank_and_exit(int device) {
  std::string problem;
  try {
    problem = work_as_rank_on(device);
    if (problem.empty()) problem = check_contexts(device);
  } catch (const std::exception& e) {
    problem = std::string("the rank failed: ") + e.what();
  }
  std::fprintf(stderr, "%s\n", problem.empty() ? "context placement: ok" : problem.c_str());
  std::fflush(stderr);
  // _Exit: no static destructors (the allocators' caches) after CUDA's own teardown.
  std::_Exit(problem.empty() ? 0 : 1);
}

// Runs everywhere: without a driver or a GPU the query says why instead of answering.
TEST(PrimaryContextQuery, AnswersOnlyWithAGpuAndSaysWhyOtherwise) {
  std::string why;
  const std::optional<bool> active = gpu_test::primary_context_active(0, &why);
  if (device_count(DeviceType::cuda) > 0 && !cuda_api::emulated()) {
    EXPECT_TRUE(active.has_value())
        << "the driver API query failed on a machine with a GPU: " << why;
  } else {
    EXPECT_FALSE(active.has_value()) << "a primary-context answer for cuda:0 without a GPU";
    EXPECT_NE(why, "") << "no reason given";
  }
}

class ContextPlacement : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// On one GPU: the rank's context is on its device (the query itself is checked).
TEST_F(ContextPlacement, RankOnCuda0HasItsContextThere) {
  DDP_REQUIRE_REAL_CUDA("the CUDA driver's primary contexts");
  EXPECT_EXIT(run_rank_and_exit(0), ::testing::ExitedWithCode(0), "context placement: ok");
}

TEST_F(ContextPlacement, RankOnCuda1HasNoContextOnCuda0) {
  DDP_REQUIRE_REAL_CUDA("the CUDA driver's primary contexts");
  if (device_count(DeviceType::cuda) < 2) {
    GTEST_SKIP() << "needs two CUDA devices, this machine has " << device_count(DeviceType::cuda);
  }
  EXPECT_EXIT(run_rank_and_exit(1), ::testing::ExitedWithCode(0), "context placement: ok");
}

}  // namespace
}  // namespace ddp
