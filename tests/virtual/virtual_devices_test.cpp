// Multi-device logic on a machine without a GPU (Note [virtual cpu devices]):
// every rank, or every DataParallel replica, on a cpu device of its own, and
// communicators bound to their rank's device (Note [communicator devices]). What
// would crash the first GPU user — metadata created on the host and handed to a
// GPU communicator, a tensor on the wrong device — fails here the same way.
// Label `virtual` in ctest.
#include "collectives/backends.h"
#include "collectives/data_parallel/data_parallel.h"
#include "collectives/host_staging.h"
#include "runtime/autograd/functions.h"
#include "runtime/nn/layers.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "tests/multirank/conformance.h"
#include "tests/multirank/ddp_parity.h"
#include "tests/multirank/spawn.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace ddp::test {
namespace {

using namespace std::chrono_literals;

constexpr const char* kVirtual = "DDP_VIRTUAL_CPU_DEVICES";
constexpr DType kReducible[] = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64};

Device cpu(int index) {
  return {DeviceType::cpu, index};
}

std::string what(const Communicator& comm, std::string_view op, DType dtype, int64_t count) {
  return fmt::format("rank {} on {}: {} of {} {}", comm.rank(), comm.device().str(), op, count,
                     dtype_name(dtype));
}

// Rank r is bound to cpu:(r + 1), so no rank works on the host device cpu:0 and
// every tensor the backends see is staged (Note [host staging]).
struct VirtualCase {
  std::string backend;
  int world = 2;
};
void PrintTo(const VirtualCase& c, std::ostream* os) {
  *os << c.backend << " with world size " << c.world << ", rank r on cpu:r+1";
}
std::string name_of(const ::testing::TestParamInfo<VirtualCase>& info) {
  return fmt::format("{}_{}", info.param.backend, info.param.world);
}

class VirtualRanks : public ::testing::TestWithParam<VirtualCase> {
 protected:
  void run_on_ranks(const std::function<void(Communicator&)>& body) {
    const VirtualCase c = GetParam();
    SpawnOptions options{.timeout = 240s};
    options.env = {{kVirtual, std::to_string(c.world + 1)}};
    const auto results = spawn_ranks(
        c.world,
        [&](int rank, int size) {
          auto comm =
              make_backend(c.backend, rank, size, {.timeout = 20s, .device = cpu(rank + 1)});
          require(comm->device() == cpu(rank + 1), "the communicator is not bound to its device");
          body(*comm);
          return 0;
        },
        options);
    for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
  }
};

TEST_P(VirtualRanks, StagedCollectivesGiveTheClosedFormsOnTheRanksDevice) {
  run_on_ranks([](Communicator& comm) {
    const Device mine = comm.device();
    for (DType dtype : kReducible) {
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1023}, int64_t{300'007}}) {
        Tensor t = make_input(dtype, count, comm.rank()).to(mine);
        comm.all_reduce(t, ReduceOp::sum)->wait();
        require(t.device() == mine, "all_reduce moved the tensor");
        expect_values(t.cpu(), make_reduced(dtype, ReduceOp::sum, comm.size(), count),
                      what(comm, "all_reduce(sum)", dtype, count));
      }
    }
    for (int root = 0; root < comm.size(); ++root) {
      Tensor t = make_input(DType::f32, 777, comm.rank()).to(mine);
      comm.broadcast(t, root)->wait();
      expect_values(t.cpu(), make_input(DType::f32, 777, root),
                    what(comm, "broadcast", DType::f32, 777));
    }
    const int64_t n = 1001;
    Tensor in = make_input(DType::i64, n, comm.rank()).to(mine);
    Tensor gathered = zeros({n * comm.size()}, {.dtype = DType::i64, .device = mine});
    comm.all_gather(in, gathered)->wait();
    for (int q = 0; q < comm.size(); ++q) {
      expect_values(gathered.slice(q * n, (q + 1) * n).cpu(), make_input(DType::i64, n, q),
                    what(comm, "all_gather", DType::i64, n));
    }
    Tensor whole = make_input(DType::f32, n * comm.size(), comm.rank()).to(mine);
    Tensor block = zeros({n}, {.device = mine});
    comm.reduce_scatter(whole, block, ReduceOp::max)->wait();
    expect_values(block.cpu(),
                  make_reduced(DType::f32, ReduceOp::max, comm.size(), n, comm.rank() * n),
                  what(comm, "reduce_scatter(max)", DType::f32, n));
    Tensor r = make_input(DType::bf16, 513, comm.rank()).to(mine);
    comm.reduce(r, 0, ReduceOp::avg)->wait();
    if (comm.rank() == 0) {
      expect_values(r.cpu(), make_reduced(DType::bf16, ReduceOp::avg, comm.size(), 513),
                    what(comm, "reduce(avg)", DType::bf16, 513),
                    tolerance(ReduceOp::avg, DType::bf16));
    }
    comm.barrier()->wait();
  });
}

TEST_P(VirtualRanks, ManyOutstandingStagedCollectivesCompleteInOrder) {
  run_on_ranks([](Communicator& comm) {
    std::vector<Tensor> tensors;
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 16; ++i) {
      tensors.push_back(full({257 + i}, comm.rank() + i, {.device = comm.device()}));
      works.push_back(comm.all_reduce(tensors.back(), ReduceOp::sum));
    }
    const int w = comm.size();
    for (int i = 15; i >= 0; --i) {  // waited in reverse: staging must not depend on wait order
      works[static_cast<size_t>(i)]->wait();
      const double want = w * (w - 1) / 2.0 + static_cast<double>(w) * i;
      expect_values(
          tensors[static_cast<size_t>(i)].cpu(), [want](int64_t) { return want; },
          what(comm, "outstanding all_reduce", DType::f32, 257 + i));
    }
  });
}

TEST_P(VirtualRanks, ATensorOnAnotherDeviceIsRejectedNamingBoth) {
  run_on_ranks([](Communicator& comm) {
    Tensor host = zeros({4});  // cpu:0, not this rank's device
    try {
      comm.all_reduce(host);
      require(false,
              "a cpu:0 tensor was accepted by a communicator bound to " + comm.device().str());
    } catch (const DeviceError& e) {
      const std::string msg = e.what();
      require(msg.find("bound to " + comm.device().str()) != std::string::npos &&
                  msg.find("tensor on cpu") != std::string::npos &&
                  msg.find("comm.device()") != std::string::npos,
              "unclear message: " + msg);
    }
    require(!comm.accepts(Device::cpu()) && comm.accepts(comm.device()),
            "accepts() disagrees with the binding");
    comm.barrier()->wait();  // the rejected call issued nothing: the ranks are still in step
  });
}

// The golden parity test with each rank's model, data, buckets and metadata on
// its own device: DDP construction (the model fingerprint), the bucket rebuild
// broadcast and every all_reduce go through a communicator that takes nothing else.
TEST_P(VirtualRanks, DdpOnEachRanksOwnDeviceEqualsOneProcess) {
  run_on_ranks([](Communicator& comm) {
    std::shared_ptr<Communicator> shared(&comm, [](Communicator*) {});
    check_parity(shared, {});
    check_parity(shared, {.ddp = {.bucket_cap_mb = 1e-4, .gradient_as_bucket_view = true}});
  });
}

TEST_P(VirtualRanks, DdpRejectsAModelOnAnotherDevice) {
  run_on_ranks([](Communicator& comm) {
    std::shared_ptr<Communicator> shared(&comm, [](Communicator*) {});
    try {
      DistributedDataParallel ddp(tiny_mlp(1), shared);  // left on cpu:0
      require(false,
              "DDP took a model on cpu:0 with a communicator bound to " + comm.device().str());
    } catch (const DeviceError& e) {
      const std::string msg = e.what();
      require(msg.find("is on cpu") != std::string::npos &&
                  msg.find("bound to " + comm.device().str()) != std::string::npos,
              "unclear message: " + msg);
    }
    // The check is local; the barrier keeps a fast rank from exiting while the
    // others still join the group (shm names a rank that left during setup).
    comm.barrier()->wait();
  });
}

INSTANTIATE_TEST_SUITE_P(Shm, VirtualRanks,
                         ::testing::Values(VirtualCase{"shm", 2}, VirtualCase{"shm", 3}), name_of);
INSTANTIATE_TEST_SUITE_P(Gloo, VirtualRanks, ::testing::Values(VirtualCase{"gloo", 2}), name_of);

// ---- one process, several devices ----

class VirtualDevices : public ::testing::Test {
 protected:
  void SetUp() override { setenv(kVirtual, "3", 1); }
  void TearDown() override { unsetenv(kVirtual); }
};

TEST_F(VirtualDevices, HostStagingRoundTripsThroughPinnedHostBuffers) {
  const Tensor original = make_input(DType::f32, 100, 2).to(cpu(1));
  Tensor t = original.clone();
  Collective c{CollectiveKind::all_reduce, ReduceOp::sum, 0, 7, t, t, {}, {}};
  comm::stage(c, 0);
  ASSERT_TRUE(c.staging != nullptr);
  EXPECT_EQ(c.input.device(), Device::cpu());
  EXPECT_TRUE(c.input.is_pinned());
  EXPECT_TRUE(c.input.is_same(c.output)) << "an in-place collective stages one buffer";
  EXPECT_NE(c.input.data_ptr(), t.data_ptr());
  comm::before_run(c);
  expect_values(c.input, original.cpu(), "staged input");
  fill_(c.output, 5.0);  // what a backend would write
  comm::after_run(c, current_stream(cpu(1)));
  expect_values(
      t.cpu(), [](int64_t) { return 5.0; }, "result copied back");
  EXPECT_EQ(t.device(), cpu(1));

  Tensor root_data = make_input(DType::f32, 10, 0).to(cpu(2));
  Collective b{CollectiveKind::broadcast, ReduceOp::sum, 1, 8, root_data, root_data, {}, {}};
  comm::stage(b, 0);  // rank 0 is not the root: its data is overwritten, nothing to copy
  Collective host_only{
      CollectiveKind::all_reduce, ReduceOp::sum, 0, 9, zeros({3}), zeros({3}), {}, {}};
  comm::stage(host_only, 0);
  EXPECT_TRUE(host_only.staging == nullptr) << "host tensors need no staging";

  Tensor in = make_input(DType::i32, 6, 1).to(cpu(2));
  Tensor out = zeros({12}, {.dtype = DType::i32, .device = cpu(2)});
  Collective g{CollectiveKind::all_gather, ReduceOp::sum, 0, 10, in, out, {}, {}};
  comm::stage(g, 0);
  EXPECT_FALSE(g.input.is_same(g.output));
  EXPECT_EQ(g.output.numel(), 12);
  fill_(g.output, 3.0);
  comm::after_run(g, current_stream(cpu(2)));
  expect_values(
      out.cpu(), [](int64_t) { return 3.0; }, "all_gather result copied back");
}

// DataParallel's equivalence with one device, with its replicas on three
// distinct devices: replicate, scatter, gather and the gradient reduction must
// move every tensor explicitly.
TEST_F(VirtualDevices, DataParallelOverThreeDevicesEqualsOneDevice) {
  auto make = [] {
    Generator gen(5);
    auto m = std::make_shared<nn::Sequential>();
    m->add(std::make_shared<nn::Linear>(12, 16, gen));
    m->add(std::make_shared<nn::ReLU>());
    m->add(std::make_shared<nn::Linear>(16, 4, gen));
    return m;
  };
  auto single = make(), wrapped = make();
  optim::SGD opt_single(single->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  optim::SGD opt_dp(wrapped->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  DataParallel dp(wrapped, {cpu(0), cpu(1), cpu(2)});
  for (int step = 0; step < 4; ++step) {
    const Tensor x = randn({10, 12}, 100 + static_cast<uint64_t>(step));
    std::vector<int64_t> labels;
    for (int i = 0; i < 10; ++i) labels.push_back((i * 3 + step) % 4);
    const Tensor y = from_vector<int64_t>(labels, {10});
    opt_single.zero_grad(true);
    backward(functional::cross_entropy((*single)(x), y));
    opt_single.step();
    opt_dp.zero_grad(true);
    const Tensor out = dp(x);
    ASSERT_EQ(out.device(), cpu(0)) << "outputs are gathered on the output device";
    backward(functional::cross_entropy(out, y));
    opt_dp.step();
  }
  const auto a = wrapped->named_parameters(), b = single->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].second.device(), cpu(0));
    expect_values(a[i].second, b[i].second, a[i].first + " after 4 steps over 3 devices", 1e-5);
  }
}

TEST_F(VirtualDevices, DataParallelWithTheModelOffThePrimaryDeviceGivesPyTorchsMessage) {
  Generator gen(1);
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(4, 2, gen));
  m->to(cpu(1));
  DataParallel dp(m, {cpu(0), cpu(2)});
  try {
    dp(zeros({4, 4}));  // checked at forward, as in PyTorch
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("module must have its parameters and buffers on device "
                                         "cpu (device_ids[0]) but found one of them on device: "
                                         "cpu:1"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(VirtualDevices, LocalCommunicatorIsBoundToItsDevice) {
  auto comm = make_local_communicator({.device = cpu(2)});
  EXPECT_EQ(comm->device(), cpu(2));
  Tensor t = full({3}, 2.0, {.device = cpu(2)});
  comm->all_reduce(t)->wait();
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{2, 2, 2}));
}

}  // namespace
}  // namespace ddp::test
