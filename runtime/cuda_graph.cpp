#include "runtime/cuda_graph.h"

#include "runtime/cuda/cuda_api.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/memory/allocator.h"
#include "runtime/profile.h"

namespace ddp {

bool is_capturing(const Device& device) {
  return device.is_cuda() && is_capturing(current_stream(device));
}

bool is_capturing(const Stream& stream) {
  return stream.device().is_cuda() && stream.handle() != nullptr &&
         cuda_api::stream_is_capturing(stream.device().index, stream.handle());
}

void CudaGraph::order_after(const Stream& stream) {
  ordered_.record(stream);
  ordered_.block(stream_);
}

void CudaGraph::capture(const Device& device, const std::function<void()>& work, uint64_t pool) {
  DDP_CHECK_T(DeviceError, device.is_cuda(),
              "CudaGraph::capture on {}: CUDA graphs need a CUDA device; on the CPU run the "
              "work directly",
              device.str());
  DDP_CHECK_T(DeviceError, graph_ == nullptr,
              "CudaGraph::capture: this graph is captured already; make a new CudaGraph for "
              "other work");
  check_available(device);
  device_ = device;
  after_ = current_stream(device);
  stream_ = Stream::create(device);
  ordered_ = Event(device, /*enable_timing=*/false);
  done_ = Event(device, /*enable_timing=*/false);
  order_after(after_);
  Allocator& allocator = device_allocator(device);
  pool_ = allocator.begin_capture(stream_, after_, pool);
  void* graph = nullptr;
  try {
    cuda_api::stream_begin_capture(device.index, stream_.handle());
    try {
      StreamGuard on_capture_stream(stream_);
      // Note [op profile]: this thread records nothing while it captures.
      struct ProfileQuiet {
        ProfileQuiet() { profile::detail::set_thread_capturing(true); }
        ~ProfileQuiet() { profile::detail::set_thread_capturing(false); }
      } quiet;
      work();
    } catch (...) {
      cuda_api::stream_abort_capture(device.index, stream_.handle());  // `work`'s error says why
      throw;
    }
    graph = cuda_api::stream_end_capture(device.index, stream_.handle());
  } catch (...) {
    allocator.end_capture(stream_);
    allocator.release_pool(pool_);
    pool_ = 0;
    throw;
  }
  allocator.end_capture(stream_);
  graph_ = graph;
}

void CudaGraph::replay() {
  DDP_CHECK(graph_ != nullptr, "CudaGraph::replay: nothing captured; call capture() first");
  const profile::Scope op_scope("cuda_graph_replay", device_);  // Note [op profile]
  // Note [cuda graphs]: after the current stream's work, and before what follows it.
  const Stream current = current_stream(device_);
  order_after(after_);
  if (!(current == after_)) order_after(current);
  cuda_api::graph_launch(device_.index, graph_, stream_.handle());
  done_.record(stream_);
  done_.block(current);
}

CudaGraph::~CudaGraph() {
  if (graph_ == nullptr) return;
  try {
    // The pool's blocks go back to the system: no replay, and no work of another stream
    // that read the graph's outputs (after_), may still use them.
    synchronize(device_);
    cuda_api::graph_destroy(device_.index, graph_);
    device_allocator(device_).release_pool(pool_);
  } catch (const std::exception& e) {
    DDP_LOG_WARN("CUDA graph on {} not released: {}", device_.str(), e.what());
  }
}

}  // namespace ddp
