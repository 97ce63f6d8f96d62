#include "collectives/host_staging.h"

#include "runtime/ops/ops.h"

namespace ddp::comm {
namespace {

Tensor pinned_like(const Tensor& t) {
  return empty(t.shape(), {.dtype = t.dtype(), .device = Device::cpu(), .pinned = true});
}

bool in_place(CollectiveKind kind) {
  return kind != CollectiveKind::all_gather && kind != CollectiveKind::reduce_scatter;
}

}  // namespace

bool needs_staging(const Device& device) {
  return device != Device::cpu();
}

// Note [host staging], step 1.
void stage(Collective& c, int rank) {
  if (!c.input.defined() || !needs_staging(c.input.device())) return;
  const Device device = c.input.device();
  DDP_ASSERT(c.output.device() == device, "{}: input on {}, output on {}", c.describe(),
             device.str(), c.output.device().str());
  auto staging = std::make_shared<HostStaging>();
  staging->device_output = c.output;
  Tensor host_input = pinned_like(c.input);
  const bool overwritten = c.kind == CollectiveKind::broadcast && rank != c.root;
  if (!overwritten) copy_(host_input, c.input, /*non_blocking=*/true);
  staging->copied = std::make_shared<Event>(device, /*enable_timing=*/false);
  staging->copied->record(current_stream(device));
  c.output = in_place(c.kind) ? host_input : pinned_like(c.output);
  c.input = std::move(host_input);
  c.staging = std::move(staging);
}

void before_run(const Collective& c) {
  if (c.staging) c.staging->copied->synchronize();
}

// Note [host staging], step 4.
void after_run(const Collective& c, const Stream& stream) {
  if (!c.staging) return;
  Tensor out = c.staging->device_output;
  {
    StreamGuard guard(stream);
    copy_uncounted_(out, c.output, /*non_blocking=*/true);  // Note [version counter]
  }
  stream.synchronize();
}

}  // namespace ddp::comm
