#include "collectives/nccl_placement.h"

#include "runtime/error.h"

#include <map>
#include <set>
#include <sstream>
#include <utility>

namespace ddp {

// host, device, name and bus id on one line each (none of them holds a newline).
Bytes encode_rank_gpu(const RankGpu& gpu) {
  const std::string text =
      fmt::format("{}\n{}\n{}\n{}", gpu.host, gpu.device, gpu.name, gpu.pci_bus_id);
  return Bytes(text.begin(), text.end());
}

RankGpu decode_rank_gpu(const Bytes& value, int rank) {
  std::istringstream in(std::string(value.begin(), value.end()));
  RankGpu gpu;
  gpu.rank = rank;
  std::string device;
  const bool ok = std::getline(in, gpu.host) && std::getline(in, device) &&
                  std::getline(in, gpu.name) && std::getline(in, gpu.pci_bus_id);
  DDP_CHECK(ok && !device.empty() && device.size() < 10 &&
                device.find_first_not_of("0123456789") == std::string::npos,
            "nccl: rank {}'s GPU entry in the store is malformed ({} bytes); is another job using "
            "the same store?",
            rank, value.size());
  gpu.device = std::stoi(device);
  return gpu;
}

std::optional<std::string> shared_gpu_error(const std::vector<RankGpu>& ranks) {
  std::map<std::pair<std::string, std::string>, const RankGpu*> first_user;  // (host, bus id)
  for (const RankGpu& gpu : ranks) {
    auto [it, fresh] = first_user.emplace(std::make_pair(gpu.host, gpu.pci_bus_id), &gpu);
    if (fresh) continue;
    const RankGpu& a = *it->second;
    std::set<std::string> gpus_on_host;
    for (const RankGpu& g : ranks) {
      if (g.host == gpu.host) gpus_on_host.insert(g.pci_bus_id);
    }
    const std::string which =
        a.device == gpu.device
            ? fmt::format("both use cuda:{} ({}, PCI {})", a.device, a.name, a.pci_bus_id)
            : fmt::format("both use the GPU {} at PCI {} (cuda:{} on rank {}, cuda:{} on rank {})",
                          a.name, a.pci_bus_id, a.device, a.rank, gpu.device, gpu.rank);
    return fmt::format(
        "ranks {} and {} {} on host {}: NCCL needs one GPU per rank. With fewer GPUs than ranks "
        "use --backend shm (one node) or gloo, which stage CUDA tensors through host memory; or "
        "run fewer ranks per node (ddprun -n {})",
        a.rank, gpu.rank, which, gpu.host, gpus_on_host.size());
  }
  return std::nullopt;
}

void check_one_gpu_per_rank(Store& store, const std::string& prefix, const RankGpu& mine,
                            int size) {
  store.set(prefix + std::to_string(mine.rank), encode_rank_gpu(mine));
  std::vector<RankGpu> all;
  for (int r = 0; r < size; ++r)
    all.push_back(decode_rank_gpu(store.get(prefix + std::to_string(r)), r));
  if (std::optional<std::string> error = shared_gpu_error(all)) throw DeviceError(*error);
}

}  // namespace ddp
