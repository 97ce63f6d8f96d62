// Replication for DataParallel: copies of a module whose parameters are
// differentiable functions of the original's, so that backward through every
// replica sums the replicas' gradients into the original parameters' .grad.
#pragma once

#include "runtime/nn/module.h"

#include <memory>
#include <vector>

namespace ddp::data_parallel {

// Copies `tensors` (all on one device) to `device` with one transfer per dtype:
// packed into one flat buffer per dtype, copied once, and returned (in order) as
// views into the copy (PyTorch's broadcast_coalesced). Nothing is recorded for
// autograd. Throws DeviceError if the tensors are not on one device.
std::vector<Tensor> copy_coalesced(const std::vector<Tensor>& tensors, const Device& device);

// One replica of `module` per entry of `devices` (Note [module replicas] in
// runtime/nn/module.h). The module must live on devices[0] (the caller checks).
// A replica on the module's own device shares the parameters' and buffers' storage
// (no copy); a replica on another device gets one coalesced copy per device.
// While grad mode is on, every replica parameter whose original requires grad is a
// non-leaf whose BroadcastBackward moves its gradient to the original's device,
// where the autograd engine sums the replicas' contributions into .grad (PyTorch's
// Broadcast / ReduceAddCoalesced, one parameter at a time). Buffers are shared or
// copied the same way, without autograd history: a module that updates its buffers
// in forward is not supported (updates would be lost in copies and race in shared
// storage; PyTorch's DataParallel also loses them).
std::vector<std::shared_ptr<nn::Module>> replicate(const nn::Module& module,
                                                   const std::vector<Device>& devices);

}  // namespace ddp::data_parallel
