// One GPU per rank for nccl (collectives/nccl_placement.h): the store entry
// round-trips, distinct GPUs pass, and two ranks on one GPU get the error that
// names both ranks, the GPU, the host and the ways out.
#include "collectives/nccl_placement.h"
#include "collectives/store/tcp_store.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace ddp {
namespace {

RankGpu gpu(int rank, const std::string& host, int device, const std::string& bus) {
  return {.rank = rank, .host = host, .device = device, .name = "NVIDIA H100", .pci_bus_id = bus};
}

TEST(NcclPlacement, EntryRoundTrips) {
  const RankGpu a = gpu(3, "node-7", 1, "0000:3b:00.0");
  const RankGpu b = decode_rank_gpu(encode_rank_gpu(a), 3);
  EXPECT_EQ(b.rank, 3);
  EXPECT_EQ(b.host, "node-7");
  EXPECT_EQ(b.device, 1);
  EXPECT_EQ(b.name, "NVIDIA H100");
  EXPECT_EQ(b.pci_bus_id, "0000:3b:00.0");
}

TEST(NcclPlacement, MalformedEntryIsAClearError) {
  const std::string junk = "only-a-host";
  EXPECT_THROW(decode_rank_gpu(Bytes(junk.begin(), junk.end()), 2), ValueError);
  const std::string bad_device = "h\nx\nname\n0000:01:00.0";
  EXPECT_THROW(decode_rank_gpu(Bytes(bad_device.begin(), bad_device.end()), 2), ValueError);
}

TEST(NcclPlacement, OneGpuPerRankPasses) {
  // The same bus id on two hosts is two GPUs; two GPUs on one host are two GPUs.
  EXPECT_EQ(shared_gpu_error({gpu(0, "a", 0, "0000:01:00.0"), gpu(1, "a", 1, "0000:02:00.0"),
                              gpu(2, "b", 0, "0000:01:00.0"), gpu(3, "b", 1, "0000:02:00.0")}),
            std::nullopt);
  EXPECT_EQ(shared_gpu_error({gpu(0, "a", 0, "0000:01:00.0")}), std::nullopt);
}

TEST(NcclPlacement, TwoRanksOnOneGpuAreNamed) {
  const std::optional<std::string> error =
      shared_gpu_error({gpu(0, "box", 0, "0000:01:00.0"), gpu(1, "box", 0, "0000:01:00.0")});
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(*error,
            "ranks 0 and 1 both use cuda:0 (NVIDIA H100, PCI 0000:01:00.0) on host box: NCCL "
            "needs one GPU per rank. With fewer GPUs than ranks use --backend shm (one node) or "
            "gloo, which stage CUDA tensors through host memory; or run fewer ranks per node "
            "(ddprun -n 1)");
}

TEST(NcclPlacement, SameGpuUnderDifferentIndicesIsFound) {
  // CUDA_VISIBLE_DEVICES differs per rank: cuda:0 and cuda:1 are one physical GPU.
  const std::optional<std::string> error =
      shared_gpu_error({gpu(0, "box", 0, "0000:01:00.0"), gpu(1, "box", 0, "0000:02:00.0"),
                        gpu(2, "box", 1, "0000:02:00.0")});
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("ranks 1 and 2 both use the GPU NVIDIA H100 at PCI 0000:02:00.0 (cuda:0 "
                        "on rank 1, cuda:1 on rank 2) on host box"),
            std::string::npos)
      << *error;
  EXPECT_NE(error->find("ddprun -n 2"), std::string::npos) << "two GPUs on that host: " << *error;
}

// The exchange through a real store, one thread per rank: every rank gets the
// same verdict, the error on all of them or on none.
std::vector<std::string> exchange(const std::vector<RankGpu>& gpus) {
  TcpStoreServerOptions server_options;
  server_options.port = 0;
  TcpStoreServer server(server_options);
  std::vector<std::string> outcome(gpus.size());
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < gpus.size(); ++r) {
    ranks.emplace_back([&, r] {
      TcpStoreOptions o;
      o.host = "127.0.0.1";
      o.port = server.port();
      o.timeout = std::chrono::milliseconds(10000);
      TcpStore store(o);
      try {
        check_one_gpu_per_rank(store, "nccl/0/gpu/", gpus[r], static_cast<int>(gpus.size()));
        outcome[r] = "ok";
      } catch (const DeviceError& e) {
        outcome[r] = e.what();
      } catch (const std::exception& e) {
        outcome[r] = std::string("not a DeviceError: ") + e.what();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  return outcome;
}

TEST(NcclPlacement, EveryRankThrowsThroughTheStore) {
  const std::vector<std::string> shared =
      exchange({gpu(0, "box", 0, "0000:01:00.0"), gpu(1, "box", 0, "0000:01:00.0"),
                gpu(2, "box", 1, "0000:02:00.0")});
  for (const std::string& e : shared) {
    EXPECT_NE(e.find("ranks 0 and 1 both use cuda:0 (NVIDIA H100, PCI 0000:01:00.0) on host box"),
              std::string::npos)
        << e;
  }
  const std::vector<std::string> distinct =
      exchange({gpu(0, "box", 0, "0000:01:00.0"), gpu(1, "box", 1, "0000:02:00.0")});
  EXPECT_EQ(distinct, (std::vector<std::string>{"ok", "ok"}));
}

}  // namespace
}  // namespace ddp
