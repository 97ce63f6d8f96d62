// CUDA graphs: record a step's kernels once, launch them again with one call.
//
// Note [cuda graphs]: a small model's step is hundreds of kernels of a few
// microseconds each, and the host's launches, not the GPU, set its pace. A captured
// graph replays the same kernels, with the same arguments and addresses, from one
// launch. What a graph needs from the work it records:
// - Fixed addresses. Memory the work allocates while capturing comes from the graph's
//   pool in the caching allocator and stays the graph's (Note [capture pools] in
//   memory/caching_allocator.h); tensors made before the capture and used by it
//   (inputs, parameters, optimizer state) must stay alive while the graph does, and
//   new data reaches the graph by copying into them (Tensor::copy_) before replay().
// - Fixed values. A host value passed to a kernel (a learning rate, a step count, a
//   seed) is recorded as it was at the capture: values that change must live in
//   device memory.
// - No host waits or reads while capturing: copy_ between the host and the device
//   refuses (ValueError naming the capture: item(), cpu(), a batch's upload), and a
//   wait (synchronize) breaks the capture in CUDA (CudaError). capture() throws either.
// - Warm-up first: work that makes handles, plans or caches on its first run (cuBLAS
//   handles, cuBLASLt's algorithm choice, cuDNN plans) must have run once eagerly.
// The capture runs on a stream of its own, made current for the scope; work queued on
// the device's current stream before capture() is ordered before every replay, and
// each replay before the work queued on the current stream after it (two events and
// two waits, on the device). A replay runs on the capture stream, so the graph's pool
// is only ever used in one stream's order.
#pragma once

#include "runtime/device.h"
#include "runtime/stream.h"

#include <cstdint>
#include <functional>

namespace ddp {

// Whether the current stream of `device` is capturing a CUDA graph (false on the CPU
// and on the legacy default stream, which cannot capture).
bool is_capturing(const Device& device);
// Whether `stream` is capturing (false on the CPU and on the legacy default stream).
bool is_capturing(const Stream& stream);

class CudaGraph {
 public:
  CudaGraph() = default;
  // Waits for the replays still running, then frees the graph and returns its pool.
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Runs `work` with a new capture stream of `device` current, recording the CUDA work
  // it queues instead of running it. `pool` (another graph's pool()) shares that
  // graph's memory, for graphs that never replay at the same time; 0: a pool of its
  // own. Throws DeviceError for a device that is not CUDA or a graph already captured,
  // CudaError when the capture broke (work, the allocator and the device stay usable),
  // and what `work` throws.
  void capture(const Device& device, const std::function<void()>& work, uint64_t pool = 0);
  // Queues one run of the captured work (asynchronous, as a kernel launch).
  void replay();

  bool captured() const { return graph_ != nullptr; }
  uint64_t pool() const { return pool_; }
  const Stream& stream() const { return stream_; }

 private:
  void order_after(const Stream& stream);  // stream_ waits for `stream`'s work so far

  Device device_ = Device::cpu();
  Stream stream_;  // the capture stream, where replays run
  Stream after_;   // the current stream at the capture
  void* graph_ = nullptr;
  uint64_t pool_ = 0;
  // Made once at the capture, recorded again at every replay: a wait takes the
  // record the event had when it was queued.
  Event ordered_, done_;
};

}  // namespace ddp
