// The op profile (runtime/profile.h, Note [op profile]) on the CPU, where an op's time
// is its wall time: which ops it records and how it keys them, only the outermost of
// nested ops, ops of other threads, the sums and the table. The CUDA events and
// graph replays are checked in tests/gpu/profile_gpu_test.cpp.
#include "runtime/profile.h"

#include "runtime/autograd/autograd.h"
#include "runtime/autograd/functions.h"
#include "runtime/error.h"
#include "runtime/ops/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace ddp {
namespace {

// The entry of `op` with `shapes` ("" for any), or nullptr.
const profile::OpTime* find(const std::vector<profile::OpTime>& ops, const std::string& op,
                            const std::string& shapes = "") {
  for (const profile::OpTime& t : ops) {
    if (t.op == op && (shapes.empty() || t.shapes == shapes)) return &t;
  }
  return nullptr;
}

// Stops the profile if a test left it on (a failed assertion between start and stop).
struct StopAtEnd {
  ~StopAtEnd() {
    if (profile::enabled()) profile::stop();
  }
};

TEST(OpProfile, CountsEachOpByItsShapes) {
  StopAtEnd guard;
  const Tensor a = randn({4, 5}, 1), b = randn({5, 6}, 2), c = randn({4, 6}, 3);
  matmul(a, b);  // not recorded: the profile is off
  profile::start();
  EXPECT_TRUE(profile::enabled());
  for (int i = 0; i < 3; ++i) matmul(a, b);
  add(c, c);
  add(a, a);
  add(a, a);
  const profile::Report r = profile::stop();
  EXPECT_FALSE(profile::enabled());
  const profile::OpTime* gemm = find(r.ops, "gemm");
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(gemm->calls, 3);
  EXPECT_EQ(gemm->device, "cpu");
  EXPECT_EQ(gemm->shapes, "f32[4, 5] f32[5, 6] f32[4, 6]");
  const profile::OpTime* add_46 = find(r.ops, "binary", "f32[4, 6] f32[4, 6] f32[4, 6]");
  const profile::OpTime* add_45 = find(r.ops, "binary", "f32[4, 5] f32[4, 5] f32[4, 5]");
  ASSERT_NE(add_46, nullptr);
  ASSERT_NE(add_45, nullptr);
  EXPECT_EQ(add_46->calls, 1);
  EXPECT_EQ(add_45->calls, 2);
  EXPECT_EQ(r.ops.size(), 3u);
  // Summed over shapes.
  const std::vector<profile::OpTime> by_op = r.by_op();
  ASSERT_EQ(by_op.size(), 2u);
  const profile::OpTime* binary = find(by_op, "binary");
  ASSERT_NE(binary, nullptr);
  EXPECT_EQ(binary->calls, 3);
  EXPECT_DOUBLE_EQ(binary->total_ms, add_46->total_ms + add_45->total_ms);
  EXPECT_EQ(binary->shapes, "");
}

TEST(OpProfile, TimesAreTheOpsWallTimeAndSumToAtMostTheWhole) {
  StopAtEnd guard;
  const Tensor big = randn({768, 768}, 4), small = randn({8, 8}, 5);
  profile::start();
  for (int i = 0; i < 3; ++i) matmul(big, big);
  for (int i = 0; i < 3; ++i) matmul(small, small);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // outside any op
  const profile::Report r = profile::stop();
  const profile::OpTime* large = find(r.ops, "gemm", "f32[768, 768] f32[768, 768] f32[768, 768]");
  const profile::OpTime* tiny = find(r.ops, "gemm", "f32[8, 8] f32[8, 8] f32[8, 8]");
  ASSERT_NE(large, nullptr);
  ASSERT_NE(tiny, nullptr);
  // 0.9 GFLOP against 1 KFLOP a call: the larger product takes longer, even if the
  // machine preempted one tiny call (its longest left out).
  EXPECT_GT(large->total_ms, tiny->total_ms - tiny->max_ms);
  ASSERT_EQ(r.ops.size(), 2u);
  EXPECT_GE(r.ops[0].total_ms, r.ops[1].total_ms);  // the longest first
  EXPECT_GE(large->max_ms * 3, large->total_ms - 1e-9);
  EXPECT_LE(large->max_ms, large->total_ms);
  EXPECT_LE(r.ops_ms(), r.wall_ms);
  EXPECT_GE(r.wall_ms - r.ops_ms(), 25.0);  // the sleep is no op's
}

TEST(OpProfile, NestedOpsCountOnceAsTheOutermost) {
  StopAtEnd guard;
  const Tensor x = randn({3, 4}, 6), w = randn({5, 4}, 7), bias = randn({5}, 8);
  profile::start();
  linear(x, w, bias);  // a matmul and add_bias_rows inside
  matmul(x, w, {.trans_b = true});
  const profile::Report r = profile::stop();
  const profile::OpTime* lin = find(r.ops, "linear");
  ASSERT_NE(lin, nullptr);
  EXPECT_EQ(lin->calls, 1);
  EXPECT_EQ(lin->shapes, "f32[3, 4] f32[5, 4] f32[5]");
  EXPECT_EQ(find(r.ops, "add_bias_rows"), nullptr);
  const profile::OpTime* gemm = find(r.ops, "gemm");
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(gemm->calls, 1);  // the matmul outside linear only
}

TEST(OpProfile, RecordsTheBackwardAndOtherThreads) {
  StopAtEnd guard;
  Tensor w = randn({6, 4}, 9);
  set_requires_grad(w, true);
  const Tensor x = randn({2, 4}, 10);
  profile::start();
  const Tensor loss = functional::sum(functional::relu(functional::linear(x, w, Tensor())));
  backward(loss);
  std::thread other([] {
    const Tensor y = randn({7}, 11);
    relu(y);
    relu(y);
  });
  other.join();
  const profile::Report r = profile::stop();
  const profile::OpTime* relu_grad = find(r.ops, "relu_backward");
  ASSERT_NE(relu_grad, nullptr);
  EXPECT_EQ(relu_grad->calls, 1);
  EXPECT_NE(find(r.ops, "linear_param_grads"), nullptr);
  const profile::OpTime* relu_7 = find(r.ops, "relu", "f32[7] f32[7]");
  ASSERT_NE(relu_7, nullptr);
  EXPECT_EQ(relu_7->calls, 2);
  const profile::OpTime* relu_26 = find(r.ops, "relu", "f32[2, 6] f32[2, 6]");
  ASSERT_NE(relu_26, nullptr);
  EXPECT_EQ(relu_26->calls, 1);
}

TEST(OpProfile, AnOpThatThrowsIsNotCountedAndLeavesNoTrace) {
  StopAtEnd guard;
  const Tensor x = randn({3, 4}, 13), w = randn({5, 3}, 14);  // w does not fit x
  profile::start();
  EXPECT_THROW(linear(x, w, Tensor()), ValueError);
  matmul(x, randn({4, 2}, 15));  // the next op is outermost again, and counted
  const profile::Report r = profile::stop();
  EXPECT_EQ(find(r.ops, "linear"), nullptr);
  const profile::OpTime* gemm = find(r.ops, "gemm");
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(gemm->calls, 1);
  EXPECT_EQ(r.dropped, 0);
}

TEST(OpProfile, AThreadCapturingAGraphRecordsNothing) {
  StopAtEnd guard;
  const Tensor a = randn({6}, 16);
  profile::start();
  profile::detail::set_thread_capturing(true);  // as CudaGraph::capture does
  relu(a);
  profile::detail::set_thread_capturing(false);
  relu(a);
  relu(a);
  const profile::Report r = profile::stop();
  const profile::OpTime* relu_6 = find(r.ops, "relu");
  ASSERT_NE(relu_6, nullptr);
  EXPECT_EQ(relu_6->calls, 2);
}

TEST(OpProfile, ThousandsOfOpsFromTwoThreadsAreEachCountedOnce) {
  StopAtEnd guard;
  // More than the 4096 pairs after which finished ones are added up as ops run.
  constexpr int kEach = 3000;
  profile::start();
  const auto work = [](uint64_t seed) {
    const Tensor x = randn({2}, seed);
    for (int i = 0; i < kEach; ++i) relu(x);
  };
  std::thread other(work, 17);
  work(18);
  other.join();
  const profile::Report r = profile::stop();
  const profile::OpTime* relu_2 = find(r.ops, "relu");
  ASSERT_NE(relu_2, nullptr);
  EXPECT_EQ(relu_2->calls, 2 * kEach);
  EXPECT_EQ(r.dropped, 0);
}

TEST(OpProfile, StartsAfreshAndNamesMisuse) {
  StopAtEnd guard;
  const Tensor a = randn({3}, 12);
  profile::start();
  relu(a);
  profile::stop();
  profile::start();
  add(a, a);
  try {
    profile::start();
    ADD_FAILURE() << "a second start() was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("already on"), std::string::npos) << e.what();
  }
  const profile::Report r = profile::stop();
  EXPECT_EQ(find(r.ops, "relu"), nullptr);  // the first profile's
  ASSERT_EQ(r.ops.size(), 1u);
  EXPECT_EQ(r.ops[0].op, "binary");
  try {
    profile::stop();
    ADD_FAILURE() << "stop() without start() was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("not on"), std::string::npos) << e.what();
  }
}

TEST(OpProfile, TableShowsTheTopEntriesAndTheRest) {
  std::vector<profile::OpTime> ops = {
      {.op = "gemm",
       .device = "cuda:0",
       .shapes = "bf16[8, 8]",
       .calls = 4,
       .total_ms = 6.0,
       .max_ms = 2.0},
      {.op = "gelu",
       .device = "cuda:0",
       .shapes = "bf16[8, 32]",
       .calls = 2,
       .total_ms = 1.0,
       .max_ms = 0.5},
      {.op = "relu",
       .device = "cuda:0",
       .shapes = "f32[3]",
       .calls = 1,
       .total_ms = 0.5,
       .max_ms = 0.5},
      {.op = "add",
       .device = "cuda:0",
       .shapes = "f32[3]",
       .calls = 3,
       .total_ms = 0.5,
       .max_ms = 0.2},
  };
  const std::string table = profile::format_table(ops, 10.0, 2);
  EXPECT_NE(table.find("gemm (cuda:0)"), std::string::npos) << table;
  EXPECT_NE(table.find("1500.0"), std::string::npos) << table;  // mean us of gemm
  EXPECT_NE(table.find("60.0%"), std::string::npos) << table;
  EXPECT_NE(table.find("gelu (cuda:0)"), std::string::npos) << table;
  EXPECT_EQ(table.find("relu"), std::string::npos) << table;
  EXPECT_NE(table.find("(2 more)"), std::string::npos) << table;
  EXPECT_NE(table.find("10.0%"), std::string::npos) << table;  // relu + add: 1 ms of 10
  const std::string all = profile::format_table(ops, 10.0, 0);
  EXPECT_NE(all.find("add (cuda:0)"), std::string::npos) << all;
  EXPECT_EQ(all.find("more)"), std::string::npos) << all;
}

}  // namespace
}  // namespace ddp
