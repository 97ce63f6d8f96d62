// copy_: moving bytes between the host and GPUs, and between GPUs.
//
// Note [copy semantics], as PyTorch's copy_:
// - cuda -> cuda never blocks the host, non_blocking or not: the copy is ordered by
//   streams. On one device it runs on the current stream; across devices see
//   Note [cross-device copy].
// - host -> device: from pinned memory the copy is asynchronous, and with
//   non_blocking the pinned block is recorded on the stream (record_stream) so that
//   it is not handed out again before the copy has read it. From pageable memory
//   with non_blocking the source is first copied into pinned staging memory (then as
//   above), so the caller may change or free its buffer at once. Without non_blocking
//   the host waits for the stream after the copy.
// - device -> host blocks the host, unless non_blocking and the destination is
//   pinned: then the pinned block is recorded on the stream and its data is valid
//   once the stream has reached the copy (e.g. after current_stream(d).synchronize()).
//
// Note [cross-device copy]: the copy runs on the destination's current stream, after
// an event recorded on the source's current stream (so it reads the source only
// after the work queued there so far, such as the kernel that produced it), and the
// source's current stream then waits for the copy (so later work there, an in-place
// update of the source or a reuse of its memory, cannot overtake the copy). It is
// thus ordered as if it ran on both current streams, like PyTorch's two-way barrier,
// and the host never waits. Peer access is enabled once per pair of devices where
// the hardware allows it; without it the driver stages the copy, which is slower but
// equally correct.
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda_graph.h"
#include "runtime/ops/copy_plan.h"
#include "runtime/ops/ops.h"
#include "runtime/profile.h"
#include "runtime/stream.h"

#include <cstring>

namespace ddp {

namespace ops_detail {

CopyPlan plan_copy(const Device& dst, bool dst_pinned, const Device& src, bool src_pinned,
                   bool non_blocking) {
  DDP_CHECK_T(DeviceError, dst.type != DeviceType::mps && src.type != DeviceType::mps,
              "copy_: mps is not available in this build (copy from {} to {})", src.str(),
              dst.str());
  CopyPlan plan;
  if (!dst.is_cuda() && !src.is_cuda()) {
    plan.route = CopyRoute::host;
  } else if (dst.is_cuda() && src.is_cuda()) {
    plan.route = dst == src ? CopyRoute::same_gpu : CopyRoute::between_gpus;
  } else if (dst.is_cuda()) {
    plan.route = CopyRoute::host_to_gpu;
    plan.stage_in_pinned = non_blocking && !src_pinned;
    plan.record_host_block = non_blocking;
    plan.host_waits = !non_blocking;
  } else {
    plan.route = CopyRoute::gpu_to_host;
    plan.record_host_block = non_blocking && dst_pinned;
    plan.host_waits = !plan.record_host_block;
  }
  return plan;
}

}  // namespace ops_detail

namespace {

using ops_detail::CopyPlan;
using ops_detail::CopyRoute;

void copy_between_gpus(Tensor& dst, const Tensor& src, size_t bytes) {
  const Device& dd = dst.device();
  const Device& sd = src.device();
  const Stream dst_stream = current_stream(dd);
  const Stream src_stream = current_stream(sd);
  cuda_api::enable_peer_access(dd.index, sd.index);
  Event source_ready(sd, /*enable_timing=*/false);
  source_ready.record(src_stream);
  source_ready.block(dst_stream);
  cuda_api::memcpy_peer_async(dst.data_ptr(), dd.index, src.data_ptr(), sd.index, bytes,
                              dst_stream.handle());
  Event copied(dd, /*enable_timing=*/false);
  copied.record(dst_stream);
  copied.block(src_stream);
}

// Everything but between_gpus: one cudaMemcpyAsync on the GPU side's current stream.
void copy_with_host(Tensor& dst, const Tensor& src, size_t bytes, const CopyPlan& plan) {
  const Device& gpu = dst.device().is_cuda() ? dst.device() : src.device();
  const Stream stream = current_stream(gpu);
  // Note [cuda graphs]: a replay would copy the same host bytes (a staging buffer long
  // reused, or whatever the host memory holds by then), and a pinned block's event
  // recorded in the capture could never be queried.
  DDP_CHECK(plan.route == CopyRoute::same_gpu || !is_capturing(gpu),
            "copy_ between the host and {} while a CUDA graph is being captured: a replay "
            "would repeat this copy of the host's bytes as they were; copy into the graph's "
            "input tensors before replay() instead (docs/cuda_graphs.md)",
            gpu.str());
  const void* from = src.data_ptr();
  // The host side of the copy (none on one GPU), or the pinned staging copy of a source.
  Tensor host_side = plan.route == CopyRoute::host_to_gpu   ? src
                     : plan.route == CopyRoute::gpu_to_host ? dst
                                                            : Tensor();
  if (plan.stage_in_pinned) {
    host_side = empty(src.shape(), {.dtype = src.dtype(), .device = Device::cpu(), .pinned = true});
    std::memcpy(host_side.data_ptr(), from, bytes);
    from = host_side.data_ptr();
  }
  const auto kind = plan.route == CopyRoute::same_gpu      ? cuda_api::CopyKind::device_to_device
                    : plan.route == CopyRoute::host_to_gpu ? cuda_api::CopyKind::host_to_device
                                                           : cuda_api::CopyKind::device_to_host;
  cuda_api::memcpy_async(gpu.index, dst.data_ptr(), from, bytes, kind, stream.handle());
  if (plan.record_host_block) host_side.record_stream(stream);
  if (plan.host_waits) stream.synchronize();
}

}  // namespace

void copy_uncounted_(Tensor& dst, const Tensor& src, bool non_blocking) {
  DDP_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype(),
            "copy_: destination {} {} and source {} {} must have the same shape and dtype",
            shape_str(dst.shape()), dtype_name(dst.dtype()), shape_str(src.shape()),
            dtype_name(src.dtype()));
  const size_t bytes = src.nbytes();
  if (bytes == 0 || (dst.data_ptr() == src.data_ptr() && dst.device() == src.device())) return;
  const CopyPlan plan = ops_detail::plan_copy(dst.device(), dst.is_pinned(), src.device(),
                                              src.is_pinned(), non_blocking);
  // One op of Note [op profile], timed on the GPU's stream (between GPUs: the
  // destination's, which runs the copy).
  static constexpr const char* kNames[] = {"copy (host)", "copy (same gpu)", "copy (between gpus)",
                                           "copy (host to gpu)", "copy (gpu to host)"};
  const profile::Scope op_scope(kNames[static_cast<int>(plan.route)],
                                dst.device().is_cuda() ? dst.device() : src.device(), src);
  switch (plan.route) {
    case CopyRoute::host:
      std::memcpy(dst.data_ptr(), src.data_ptr(), bytes);
      return;
    case CopyRoute::between_gpus:
      return copy_between_gpus(dst, src, bytes);
    case CopyRoute::same_gpu:
    case CopyRoute::host_to_gpu:
    case CopyRoute::gpu_to_host:
      return copy_with_host(dst, src, bytes, plan);
  }
}

void copy_(Tensor& dst, const Tensor& src, bool non_blocking) {
  copy_uncounted_(dst, src, non_blocking);
  dst.storage()->bump_version();  // Note [version counter]
}

}  // namespace ddp
