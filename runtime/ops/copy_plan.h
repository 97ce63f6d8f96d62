// How copy_ moves bytes between two devices, decided from the devices, the
// pinnedness of the host sides and non_blocking alone (Note [copy semantics] in
// copy.cpp), so that the rules are unit-tested on a machine without a GPU.
// Internal to runtime/ops and its tests.
#pragma once

#include "runtime/device.h"

namespace ddp::ops_detail {

enum class CopyRoute {
  host,          // both sides on the host: memcpy
  same_gpu,      // on the device's current stream
  between_gpus,  // Note [cross-device copy]
  host_to_gpu,   // on the destination's current stream
  gpu_to_host,   // on the source's current stream
};

struct CopyPlan {
  CopyRoute route = CopyRoute::host;
  // host_to_gpu: copy the pageable source into pinned staging memory first.
  bool stage_in_pinned = false;
  // The pinned host block (the source, the staging memory or the destination) is
  // recorded on the GPU stream, so it is not handed out again before the copy is done.
  bool record_host_block = false;
  // The host synchronizes with the GPU stream after the copy.
  bool host_waits = false;
};

// Throws DeviceError for an mps side (no mps kernels in this build).
CopyPlan plan_copy(const Device& dst, bool dst_pinned, const Device& src, bool src_pinned,
                   bool non_blocking);

}  // namespace ddp::ops_detail
