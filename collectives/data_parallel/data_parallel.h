// DataParallel: one process drives several devices, as torch.nn.DataParallel.
//
// Every forward:
//   1. scatter   the batch along dim 0 over the devices (scatter_gather.h: balanced
//                chunks; a batch smaller than the device count uses fewer replicas),
//   2. replicate the module onto those devices (replicate.h: coalesced copies; a
//                replica on the module's own device shares its storage),
//   3. apply     every replica to its chunk in parallel, one thread per device (the
//                calling thread runs replica 0), each on its own stream on CUDA,
//   4. gather    the outputs on output_device.
// backward(loss) through the result runs through gather, the replicas and
// replicate, so the wrapped module's parameters receive the sum of the replicas'
// gradients: for a loss that is a mean over the batch, the same .grad as one device
// on the whole batch. The optimizer steps the wrapped module's parameters as usual.
//
// Contract:
// - devices: all CUDA devices, or the CPU repeated ("cpu,cpu": replicas in
//   threads, how CI tests this mode). Empty means every visible CUDA device. All of
//   one type (ValueError), all available (DeviceError). A CUDA device listed twice
//   is allowed for testing on a one-GPU machine, and a warning says so.
// - The module's parameters and buffers must be on devices[0] when forward runs,
//   else ValueError with PyTorch's message ("module must have its parameters and
//   buffers on device cuda:0 (device_ids[0]) but found one of them on device: cpu").
// - Every module class in the tree must be replicable (nn::Cloneable, Note [module
//   replicas] in runtime/nn/module.h). Modules that update buffers in forward are
//   not supported (see replicate.h).
// - forward takes the input on any device and returns a tensor on output_device.
//   An exception in a replica is rethrown by forward, same type, its message
//   prefixed with "replica i on <device>: ".
// - Not thread-safe: one forward at a time per DataParallel.
#pragma once

#include "collectives/data_parallel/parallel_apply.h"
#include "runtime/nn/module.h"
#include "runtime/stream.h"

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

namespace ddp {

// Host milliseconds of the phases of the last forward (on CUDA, the time to queue
// the work unless something synchronized), and how many replicas ran.
struct DataParallelStats {
  double scatter_ms = 0, replicate_ms = 0, apply_ms = 0, gather_ms = 0;
  size_t replicas = 0;
};

class DataParallel {
 public:
  DataParallel(std::shared_ptr<nn::Module> module, std::vector<Device> devices = {},
               std::optional<Device> output_device = std::nullopt);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  nn::Module& module() { return *module_; }
  const std::shared_ptr<nn::Module>& module_ptr() const { return module_; }
  const std::vector<Device>& devices() const { return devices_; }
  const Device& output_device() const { return output_device_; }
  const DataParallelStats& last_stats() const { return stats_; }

 private:
  void check_module_device() const;

  std::shared_ptr<nn::Module> module_;
  std::vector<Device> devices_;
  Device output_device_;
  std::vector<Stream> streams_;  // one per replica: its own CUDA stream, else the CPU's
  std::unique_ptr<data_parallel::ReplicaThreads> threads_;
  DataParallelStats stats_;
};

// The checks the constructor makes on a non-empty device list: one type
// (ValueError), every device available (DeviceError). For callers that want to
// fail before building a model.
void check_data_parallel_devices(const std::vector<Device>& devices);

// Parses a device list such as "cpu,cpu" or "cuda:0,cuda:1" (Device::parse for each
// entry); throws ValueError naming the text. Availability is checked by DataParallel.
std::vector<Device> parse_device_list(std::string_view text);

}  // namespace ddp
