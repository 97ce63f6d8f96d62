// The thin layer over the CUDA runtime that the rest of ddp uses.
//
// Compiled from cuda_api.cpp when the build has CUDA, from cuda_api_stub.cpp
// otherwise (every call there but the queries throws DeviceError). Handles are
// opaque (void*) so that no header outside runtime/cuda includes CUDA's.
//
// Failures of CUDA calls throw ddp::CudaError naming the call and CUDA's text.
// device_count() never throws: without a driver or GPU it returns 0 and
// unavailable_reason() says why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp::cuda_api {

using StreamHandle = void*;  // cudaStream_t; nullptr is the legacy default stream
using EventHandle = void*;   // cudaEvent_t

bool compiled();  // this build has CUDA
// The CUDA device is emulated on the CPU (Note [emulated CUDA device] in
// runtime/cuda/emu/kernel_emu.h): kernels run, but streams do not overlap and time
// means nothing.
bool emulated();
int device_count();
std::string unavailable_reason();

struct Properties {
  std::string name;
  uint64_t total_memory = 0;
  int major = 0, minor = 0;
  int multiprocessors = 0;
};
Properties properties(int device);
void mem_get_info(int device, uint64_t* free_bytes, uint64_t* total_bytes);
// The GPU's PCI address, "0000:3b:00.0" (cudaDeviceGetPCIBusId): the same GPU has
// the same address in every process, whatever CUDA_VISIBLE_DEVICES numbers it.
std::string pci_bus_id(int device);

int current_device();
void set_device(int device);
void device_synchronize(int device);

// Raw allocations. Return nullptr when the device is out of memory (and clear the
// CUDA error); throw CudaError on any other failure.
void* malloc_device(int device, size_t bytes);
void free_device(int device, void* ptr);
void* malloc_pinned(size_t bytes);
void free_pinned(void* ptr);

enum class CopyKind { host_to_device, device_to_host, device_to_device, host_to_host };

// Note [stream device]: a call that takes a stream also takes the device the stream
// belongs to (`device`), and runs with that device current (DeviceGuard below). A
// stream handle alone is ambiguous: nullptr is the legacy default stream of the
// *current* device, and an event can be recorded only on a stream of its own device.

// Asynchronous on `stream` of `device` (the device side of the copy).
void memcpy_async(int device, void* dst, const void* src, size_t bytes, CopyKind kind,
                  StreamHandle stream);
// Async copy between two different GPUs, on `stream` of `dst_device`. Works without
// peer access (the driver stages it); enable_peer_access() makes it direct.
void memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device, size_t bytes,
                       StreamHandle stream);
void memset_async(int device, void* dst, int value, size_t bytes, StreamHandle stream);

StreamHandle stream_create(int device);  // non-blocking w.r.t. the legacy default stream
void stream_destroy(int device, StreamHandle stream);
void stream_synchronize(int device, StreamHandle stream);  // blocks the host
bool stream_query(int device, StreamHandle stream);        // true when all work on it finished

// An event belongs to the device it was created on; every call names that device.
EventHandle event_create(int device, bool enable_timing);
void event_destroy(int device, EventHandle event);
// `stream` must belong to `device`, the event's device.
void event_record(int device, EventHandle event, StreamHandle stream);
void event_synchronize(int device, EventHandle event);  // blocks the host
bool event_query(int device, EventHandle event);
float event_elapsed_ms(int device, EventHandle start, EventHandle end);
// Makes `stream` of `stream_device` wait (on the GPU) for `event`, which may belong to
// another device.
void stream_wait_event(int stream_device, StreamHandle stream, EventHandle event);

// Throws CudaError if a kernel launch failed (cudaGetLastError), naming `what`.
void check_last_error(const char* what);

// How many times ddp blocked the host on the GPU so far (stream, event and device
// synchronizations, in every thread): tests count them to show that a path, such
// as DDP's backward, never stalls the host. Always 0 in a build without CUDA.
uint64_t host_sync_count();
// While one lives, this thread's synchronizations are not counted: a testing aid's own
// (Note [planted faults]) must not look like the path's.
class UncountedSyncs {
 public:
  UncountedSyncs();
  ~UncountedSyncs();
  UncountedSyncs(const UncountedSyncs&) = delete;
  UncountedSyncs& operator=(const UncountedSyncs&) = delete;
};

// ---- CUDA graphs (runtime/cuda_graph.h) ----
using GraphHandle = void*;  // cudaGraphExec_t: an instantiated graph

// Begins capturing the work queued on `stream` (not the legacy default stream, which
// cannot capture) in thread-local mode: a call of this thread that a capture does not
// allow (a host synchronization, an event query) breaks the capture. Raw allocations
// are allowed (Note [allocation during capture] in cuda_api.cpp).
void stream_begin_capture(int device, StreamHandle stream);
// Ends the capture begun on `stream` and instantiates what it recorded. Throws
// CudaError when the capture broke, naming the likely causes; the stream is out of
// capture either way.
GraphHandle stream_end_capture(int device, StreamHandle stream);
// Ends the capture begun on `stream` and drops what it recorded (the error path of a
// capture: nothing is instantiated). Never throws.
void stream_abort_capture(int device, StreamHandle stream) noexcept;
// Whether `stream` is capturing (or its capture broke and has not ended).
bool stream_is_capturing(int device, StreamHandle stream);
void graph_launch(int device, GraphHandle graph, StreamHandle stream);
void graph_destroy(int device, GraphHandle graph);

// ---- The calling thread's device, peer access ----

// Makes `device` current for the scope and then restores the previous device, so that
// ddp never changes the caller's current device behind its back, with one exception
// (Note [device guard]): it does not switch back to a device that has no CUDA context
// yet. Usable anywhere: this header includes no CUDA header. In a build without CUDA
// the constructor throws DeviceError.
//
// Note [device guard]: since CUDA 12, cudaSetDevice(k) creates device k's primary
// context (about 500 MiB of GPU memory). A thread that never chose a device has
// current device 0, so restoring "the previous device" would create a context on GPU 0
// in every process and every worker thread: the "all ranks on GPU 0" symptom. As
// PyTorch's MaybeSetDevice, the guard restores the previous device only if its primary
// context is active (cuDevicePrimaryCtxGetState, looked up through the runtime so that
// libcuda is not linked); otherwise the thread keeps `device` current, which is what a
// thread that has not chosen a device wants anyway.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = 0;
};

// Whether `device` can read and write `peer`'s memory directly (NVLink or PCIe P2P),
// from cudaDeviceCanAccessPeer; asked once per pair. False for device == peer.
bool can_access_peer(int device, int peer);
// Lets kernels and copies on `device` access `peer`'s memory directly, once per pair
// (later calls return the first answer). Returns whether access is enabled; false when
// the hardware cannot (copies still work, staged by the driver), never throws for that.
bool enable_peer_access(int device, int peer);

}  // namespace ddp::cuda_api
