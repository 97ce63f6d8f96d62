// The nccl backend with world size 1 on cuda:0: every collective is the identity
// (or a copy), on every dtype, issued from a non-default current stream so the
// stream ordering of Note [nccl streams] is exercised; wait() against
// synchronize(), durations, and a timeout (a busy caller stream). Without NCCL in the build
// or without a GPU every test skips and says why. Multi-rank NCCL runs belong to
// a multi-GPU machine (ddprun -n N on it).
#include "collectives/backends.h"
#include "collectives/elastic.h"
#include "collectives/store/tcp_store.h"
#include "ddp/config.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/device.h"
#include "runtime/ops/ops.h"
#include "runtime/stream.h"
#include "tests/gpu/require_gpu.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define DDP_REQUIRE_NCCL()                                                                 \
  if (!DDP_HAVE_NCCL)                                                                      \
    GTEST_SKIP() << "this build has no NCCL (needs a CUDA build and NCCL found by CMake)"; \
  if (::ddp::device_count(::ddp::DeviceType::cuda) == 0)                                   \
  GTEST_SKIP() << "no CUDA device: " << ::ddp::unavailable_reason(::ddp::DeviceType::cuda)

namespace ddp {
namespace {

using namespace std::chrono_literals;

using gpu_test::kGpu;
constexpr DType kReducible[] = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

std::shared_ptr<Communicator> make_single_rank() {
  return make_nccl_communicator(nullptr,
                                {.rank = 0, .size = 1, .device = 0, .comm = {.timeout = 30s}});
}

// 1, -2, 3, -4, ... (exact in every dtype) on the GPU.
Tensor gpu_values(DType dtype, int64_t count) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    v[static_cast<size_t>(i)] = (i % 2 ? -1.f : 1.f) * (i % 100 + 1);
  return cast(from_vector<float>(v, {count}), dtype).to(kGpu);
}

std::vector<float> host_values(const Tensor& t) {
  return cast(t.cpu(), DType::f32).to_vector<float>();
}

TEST(NcclCommunicator, AllReduceIsTheIdentityForEveryOpAndDtype) {
  DDP_REQUIRE_NCCL();
  auto comm = make_single_rank();
  EXPECT_EQ(comm->backend(), "nccl");
  const Stream side = Stream::create(kGpu);
  StreamGuard guard(side);  // collectives follow the caller's current stream
  for (DType dtype : kReducible) {
    for (ReduceOp op : kOps) {
      if (op == ReduceOp::avg && !is_floating(dtype)) continue;
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1'000'003}}) {
        Tensor t = gpu_values(dtype, count);
        comm->all_reduce(t, op)->wait();
        EXPECT_EQ(host_values(t), host_values(gpu_values(dtype, count)))
            << dtype_name(dtype) << " " << reduce_op_name(op) << " of " << count;
      }
    }
  }
}

// Out of place, so NCCL cannot skip the work at one rank. Counts that are not a
// multiple of 16: at one rank NCCL 2.28's avg (a pre-multiplied sum) dropped the
// last count % 16 elements (found by bench/gpu's zero2_nccl_w1 on an H100,
// 2026-11-26; Note [nccl avg at one rank]).
TEST(NcclCommunicator, ReduceScatterIsTheIdentityForEveryOpAndDtype) {
  DDP_REQUIRE_NCCL();
  auto comm = make_single_rank();
  const Stream side = Stream::create(kGpu);
  StreamGuard guard(side);
  for (DType dtype : kReducible) {
    for (ReduceOp op : kOps) {
      if (op == ReduceOp::avg && !is_floating(dtype)) continue;
      for (int64_t count : {int64_t{1}, int64_t{10}, int64_t{17}, int64_t{203'530}}) {
        const Tensor in = gpu_values(dtype, count);
        Tensor out = zeros({count}, {.dtype = dtype, .device = kGpu});
        comm->reduce_scatter(in, out, op)->wait();
        EXPECT_EQ(host_values(out), host_values(in))
            << dtype_name(dtype) << " " << reduce_op_name(op) << " of " << count;
      }
    }
  }
}

TEST(NcclCommunicator, BroadcastGatherScatterReduceAndBarrier) {
  DDP_REQUIRE_NCCL();
  auto comm = make_single_rank();
  const Tensor expected = gpu_values(DType::f32, 1025);
  Tensor t = gpu_values(DType::f32, 1025);
  comm->broadcast(t, 0)->wait();
  EXPECT_EQ(host_values(t), host_values(expected));
  Tensor out = zeros({1025}, {.device = kGpu});
  comm->all_gather(t, out)->wait();
  EXPECT_EQ(host_values(out), host_values(expected));
  Tensor scattered = zeros({1025}, {.device = kGpu});
  comm->reduce_scatter(t, scattered, ReduceOp::sum)->wait();
  EXPECT_EQ(host_values(scattered), host_values(expected));
  comm->reduce(t, 0, ReduceOp::max)->wait();
  EXPECT_EQ(host_values(t), host_values(expected));
  Tensor bytes = cast(gpu_values(DType::f32, 9), DType::u8);
  comm->broadcast(bytes, 0)->wait();
  auto barrier = comm->barrier();
  barrier->wait();
  EXPECT_TRUE(barrier->done());
}

TEST(NcclCommunicator, AsyncWorksCompleteInAnyOrder) {
  DDP_REQUIRE_NCCL();
  auto comm = make_single_rank();
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < 8; ++k) {
    tensors.push_back(gpu_values(DType::bf16, 100'000 + k));
    works.push_back(comm->all_reduce(tensors.back(), ReduceOp::sum));
    EXPECT_EQ(works.back()->sequence(), k);
  }
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(host_values(tensors[static_cast<size_t>(k)]),
              host_values(gpu_values(DType::bf16, 100'000 + k)));
  }
}

// Note [nccl streams]: wait() orders the current stream after the collective
// without blocking the host; synchronize() blocks it.
TEST(NcclCommunicator, WaitDoesNotBlockTheHostAndSynchronizeDoes) {
  DDP_REQUIRE_NCCL();
  auto comm = make_single_rank();
  const Stream side = Stream::create(kGpu);
  StreamGuard guard(side);
  Tensor t = gpu_values(DType::f32, 1 << 20);
  const Tensor expected = gpu_values(DType::f32, 1 << 20);
  std::shared_ptr<Work> work = comm->all_reduce(t);
  const uint64_t before = cuda_api::host_sync_count();
  work->wait();
  EXPECT_EQ(cuda_api::host_sync_count(), before) << "wait() blocked the host";
  // Work queued on the current stream after wait() sees the result.
  const Tensor doubled = add(t, t);
  EXPECT_EQ(host_values(doubled), host_values(add(expected, expected)));

  std::shared_ptr<Work> second = comm->all_reduce(t);
  const uint64_t before_sync = cuda_api::host_sync_count();
  second->synchronize();
  EXPECT_GT(cuda_api::host_sync_count(), before_sync) << "synchronize() did not block the host";
  EXPECT_TRUE(second->done());
}

TEST(NcclCommunicator, DurationComesFromCudaEvents) {
  DDP_REQUIRE_NCCL();
  auto comm = make_single_rank();
  Tensor t = gpu_values(DType::f32, 1 << 22);
  std::shared_ptr<Work> work = comm->all_reduce(t);
  work->synchronize();
  const std::optional<std::chrono::nanoseconds> d = work->duration();
  ASSERT_TRUE(d.has_value());
  EXPECT_GE(d->count(), 0);
  EXPECT_LT(*d, 10s);
}

// The body of the timeout test; "" when everything held, else what did not.
std::string timeout_scenario() {
  auto comm = make_nccl_communicator(nullptr,
                                     {.rank = 0, .size = 1, .device = 0, .comm = {.timeout = 5ms}});
  // The tensor first: its host-to-device copy waits for the stream, so made after the
  // GEMMs it would hold the host until they finished (on an H200 the test failed so).
  Tensor t = gpu_values(DType::f32, 1024);
  const Tensor a = randn({4096, 4096}, 1, {.device = kGpu});
  Tensor busy = a;
  for (int i = 0; i < 40; ++i) busy = matmul(busy, a);  // 5.5 TFLOP: 0.1 s on an H200
  std::shared_ptr<Work> work = comm->all_reduce(t);
  try {
    work->synchronize();
    return "the collective did not time out: the GEMMs finished within 5 ms?";
  } catch (const CommTimeoutError& e) {
    if (e.sequence() != 0) return std::string("wrong sequence: ") + e.what();
  }
  try {
    work->wait();
    return "wait() after the timeout did not throw";
  } catch (const CommTimeoutError&) {
  }
  std::shared_ptr<Work> later = comm->barrier();
  try {
    later->wait();
    return "a collective after the failure succeeded";
  } catch (const CommError& e) {
    if (e.sequence() != 0) return std::string("not the first error: ") + e.what();
  }
  synchronize(kGpu);
  comm.reset();  // must not hang (ctest's timeout would say so)
  return "";
}

// The collective waits for the caller's stream (Note [nccl streams]); a stream kept
// busy far longer than the timeout makes it time out even with world size 1, so
// the watchdog's path runs: it aborts the communicator, synchronize() and wait()
// throw the CommTimeoutError, later collectives fail at once with it, and
// destroying the communicator returns. In a child process (a fresh CUDA context):
// whatever the abort leaves behind cannot touch the other tests.
TEST(NcclCommunicator, TimeoutAbortsAndLaterCollectivesGetTheFirstError) {
  DDP_REQUIRE_NCCL();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const std::string problem = timeout_scenario();
        if (!problem.empty()) std::fprintf(stderr, "%s\n", problem.c_str());
        std::_Exit(problem.empty() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// Note [nccl regroup] with world size 1: the body of the test below; "" when
// everything held, else what did not.
std::string regroup_scenario() {
  auto server = std::make_shared<TcpStoreServer>(TcpStoreServerOptions{});
  auto store = std::make_shared<TcpStore>(TcpStoreOptions{
      .host = "127.0.0.1", .port = server->port(), .secret = "", .timeout = 10000ms});
  ProcessGroup pg;
  pg.store = store;
  pg.backend = "nccl";
  pg.members = {0};
  pg.comm_options = {.timeout = 30s, .device = kGpu};
  pg.env.on_failure = "continue";
  // As init_process_group makes it under continue (there every 100 ms): abandoned
  // once there is a newer membership.
  pg.comm = make_store_communicator("nccl", store, pg.env, 0, 1, "", pg.comm_options, "",
                                    elastic::abandon_check(store, 0, {0}, 10ms, true));
  Tensor t = gpu_values(DType::f32, 1024);
  pg.comm->all_reduce(t)->synchronize();
  // A collective held in flight behind a busy stream (as behind a dead peer's
  // kernels) while the group's membership changes (membership 1 is 7).
  const Tensor a = randn({4096, 4096}, 1, {.device = kGpu});
  Tensor busy = a;
  for (int i = 0; i < 200; ++i) busy = matmul(busy, a);  // 27 TFLOP: 0.5 s on an H200
  std::shared_ptr<Work> work = pg.comm->all_reduce(t);
  store->set(elastic::members_key(1), std::string("7"));
  store->set(elastic::kEpochKey, std::string("1"));
  const auto start = std::chrono::steady_clock::now();
  try {
    work->synchronize();
    return "the collective completed: the abandon check did not fail it (or the GEMMs were done)";
  } catch (const CommTimeoutError& e) {
    return std::string("a timeout, not the departure: ") + e.what();
  } catch (const CommError& e) {
    if (std::string(e.what()).find("the group's membership changed") == std::string::npos)
      return std::string("not the departure: ") + e.what();
  }
  try {
    pg.comm->barrier()->wait();
    return "a collective on the aborted communicator succeeded";
  } catch (const CommError&) {
  }
  if (std::chrono::steady_clock::now() - start > 5s)
    return "the departure took over 5 s to fail it";
  synchronize(kGpu);
  pg.comm.reset();  // aborted: must not hang
  // Launch rank 0 is back in membership 2: the regroup forms a fresh nccl
  // communicator under elastic/2/ (instance 0 there, whatever this process made).
  store->set(elastic::members_key(2), std::string("0"));
  store->set(elastic::kEpochKey, std::string("2"));
  const Regroup g = regroup(pg, 11, 10s, "the test's departure");
  if (g.epoch != 2 || pg.membership != 2 || pg.comm == nullptr || pg.comm->backend() != "nccl")
    return "the regroup did not form membership 2 on nccl";
  if (!store->check({"elastic/2/nccl/uid"}))
    return "the new communicator's unique id is not in membership 2's namespace";
  Tensor u = gpu_values(DType::f32, 1024);
  pg.comm->all_reduce(u, ReduceOp::sum)->synchronize();
  if (host_values(u) != host_values(gpu_values(DType::f32, 1024)))
    return "the regrouped communicator's all_reduce is wrong";
  pg.comm.reset();
  return "";
}

// Note [nccl regroup], the abort path with world size 1 (issue 32): under
// --on-failure continue a collective in flight fails at once when the group
// goes on without a member of its communicator, the aborted communicator is
// dropped without a hang, and regroup() forms a new nccl communicator in the
// new membership's namespace that works. In a child process (a fresh CUDA
// context), as the timeout test.
TEST(NcclCommunicator, RegroupAbortsOnADepartureAndFormsANewCommunicator) {
  DDP_REQUIRE_NCCL();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::string problem;
        try {
          problem = regroup_scenario();
        } catch (const std::exception& e) {
          problem = std::string("threw: ") + e.what();
        }
        if (!problem.empty()) std::fprintf(stderr, "%s\n", problem.c_str());
        std::_Exit(problem.empty() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// The GPU's identity in the duplicate check (nccl_placement.h): a PCI address.
TEST(NcclCommunicator, PciBusIdNamesTheGpu) {
  DDP_REQUIRE_NCCL();
  const std::string id = cuda_api::pci_bus_id(0);
  EXPECT_EQ(id.size(), 12u) << id;  // dddd:bb:dd.f
  EXPECT_EQ(id[4], ':') << id;
  EXPECT_EQ(id[7], ':') << id;
  EXPECT_EQ(id[10], '.') << id;
}

TEST(NcclCommunicator, RejectsCpuTensors) {
  DDP_REQUIRE_NCCL();
  auto comm = make_single_rank();
  Tensor cpu = zeros({4});
  EXPECT_THROW(comm->all_reduce(cpu), DeviceError);
}

TEST(NcclCommunicator, StubSaysHowToEnableIt) {
  if (DDP_HAVE_NCCL) GTEST_SKIP() << "this build has NCCL; the stub is not compiled";
  try {
    make_single_rank();
    FAIL() << "the stub returned a communicator";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("nccl backend is not built"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddp
