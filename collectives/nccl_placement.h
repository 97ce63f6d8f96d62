// Which GPU each rank of an nccl communicator uses, exchanged through the store
// before ncclCommInitRank: NCCL cannot put two ranks on one GPU (it fails with
// "Duplicate GPU detected" or hangs), so that case gets a clear error on every
// rank instead. Pure, unit-tested without a GPU.
#pragma once

#include "collectives/store/store.h"

#include <optional>
#include <string>
#include <vector>

namespace ddp {

struct RankGpu {
  int rank = 0;
  std::string host;        // gethostname()
  int device = 0;          // the rank's own CUDA index: cuda:<device>
  std::string name;        // "NVIDIA H100 80GB HBM3"
  std::string pci_bus_id;  // "0000:3b:00.0": the same GPU has the same one in every process
};

// The store value of one rank's entry, and back (`rank` is the key's rank).
Bytes encode_rank_gpu(const RankGpu& gpu);
RankGpu decode_rank_gpu(const Bytes& value, int rank);

// The error every rank throws (as DeviceError) when two ranks on one host use the
// same GPU, naming the first such pair, the GPU and the ways out; nullopt when
// every rank has a GPU of its own.
std::optional<std::string> shared_gpu_error(const std::vector<RankGpu>& ranks);

// Publishes `mine` under prefix + its rank, reads the entries of ranks [0, size)
// (each within the store's timeout) and throws DeviceError(shared_gpu_error) on
// every rank when two share a GPU.
void check_one_gpu_per_rank(Store& store, const std::string& prefix, const RankGpu& mine, int size);

}  // namespace ddp
