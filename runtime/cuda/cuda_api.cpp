// cuda_api.h over the CUDA runtime. Every call but device_count() goes through
// DDP_CUDA_CHECK; calls that act on one device make it current with a DeviceGuard.
#include "runtime/cuda/cuda_api.h"

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/driver_check.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

namespace ddp::cuda_api {
namespace {

struct DeviceCount {
  int count = 0;
  std::string reason;  // why count is 0, "" otherwise
};

CudaProblem problem_of(cudaError_t err, int driver_version) {
  switch (err) {
    case cudaErrorInsufficientDriver:
      return driver_version == 0 ? CudaProblem::no_driver : CudaProblem::driver_too_old;
    case cudaErrorCallRequiresNewerDriver:
      return CudaProblem::driver_too_old;
    case cudaErrorNoDevice:
    case cudaSuccess:  // no error, but no device either
      return CudaProblem::no_device;
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorSystemDriverMismatch:
      return CudaProblem::compat_mismatch;
    default:
      return CudaProblem::other;
  }
}

// Why there is no device, with the versions that explain it (driver_check.h).
std::string describe_no_device(cudaError_t err) {
  CudaStartup s;
  int driver = 0;
  // Works without a device, and reports 0 when no driver is installed.
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  (void)cudaGetLastError();
  s.driver_version = driver;
  s.runtime_version = CUDART_VERSION;
  s.problem = problem_of(err, driver);
  s.error = err == cudaSuccess
                ? "no CUDA device is visible"
                : fmt::format("{}: {}", cudaGetErrorName(err), cudaGetErrorString(err));
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) s.visible_devices = visible;
  return describe(s);
}

// The first CUDA call of a process initializes the driver; asking once keeps the
// answer (and the error of a machine without a GPU) stable and cheap.
const DeviceCount& device_count_once() {
  static std::once_flag once;
  static DeviceCount result;
  std::call_once(once, [] {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      count = 0;
    }
    if (count == 0) result.reason = describe_no_device(err);
    result.count = count;
  });
  return result;
}

std::atomic<uint64_t> g_host_syncs{0};
thread_local int t_uncounted_syncs = 0;  // UncountedSyncs scopes open in this thread
void count_host_sync() {
  if (t_uncounted_syncs == 0) ++g_host_syncs;
}

bool has_primary_context(int device);  // below, with the driver query

cudaStream_t to_stream(StreamHandle stream) {
  return static_cast<cudaStream_t>(stream);
}
cudaEvent_t to_event(EventHandle event) {
  return static_cast<cudaEvent_t>(event);
}

cudaMemcpyKind to_cuda_kind(CopyKind kind) {
  switch (kind) {
    case CopyKind::host_to_device:
      return cudaMemcpyHostToDevice;
    case CopyKind::device_to_host:
      return cudaMemcpyDeviceToHost;
    case CopyKind::device_to_device:
      return cudaMemcpyDeviceToDevice;
    case CopyKind::host_to_host:
      return cudaMemcpyHostToHost;
  }
  DDP_ASSERT(false, "unknown CopyKind {}", static_cast<int>(kind));
}

// true on success, false when the work is still running; throws on a real error.
bool ready(cudaError_t err, std::string_view call) {
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error to report later
    return false;
  }
  detail::check_cuda(err, call);
  return true;
}

}  // namespace

bool compiled() {
  return true;
}
bool emulated() {
  return false;
}

int device_count() {
  return device_count_once().count;
}

std::string unavailable_reason() {
  return device_count_once().reason;
}

Properties properties(int device) {
  cudaDeviceProp prop{};
  DDP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  Properties out;
  out.name = prop.name;
  out.total_memory = prop.totalGlobalMem;
  out.major = prop.major;
  out.minor = prop.minor;
  out.multiprocessors = prop.multiProcessorCount;
  return out;
}

void mem_get_info(int device, uint64_t* free_bytes, uint64_t* total_bytes) {
  DeviceGuard guard(device);
  size_t free_b = 0, total_b = 0;
  DDP_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (free_bytes) *free_bytes = free_b;
  if (total_bytes) *total_bytes = total_b;
}

std::string pci_bus_id(int device) {
  char id[64] = {};  // "dddd:bb:dd.f" and a terminator fit; CUDA asks for at least 13
  DDP_CUDA_CHECK(cudaDeviceGetPCIBusId(id, static_cast<int>(sizeof(id)), device));
  return id;
}

int current_device() {
  int device = 0;
  DDP_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void set_device(int device) {
  DDP_CUDA_CHECK(cudaSetDevice(device));
}

void device_synchronize(int device) {
  DeviceGuard guard(device);
  count_host_sync();
  DDP_CUDA_CHECK(cudaDeviceSynchronize());
}

// Note [allocation during capture]: cudaMalloc is among the calls that break a capture
// of the calling thread, since a graph cannot replay it. The caching allocator does
// allocate memory for a graph's pool while it captures, on purpose: the memory is the
// graph's from then on (Note [capture pools] in memory/caching_allocator.h). So the
// thread's capture mode is relaxed for the one call and restored after it.
namespace {
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { DDP_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode_)); }
  ~RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};
}  // namespace

void* malloc_device(int device, size_t bytes) {
  DeviceGuard guard(device);
  void* ptr = nullptr;
  cudaError_t err = cudaSuccess;
  {
    RelaxedCaptureMode relaxed;  // Note [allocation during capture]
    err = cudaMalloc(&ptr, bytes);
  }
  if (err == cudaErrorMemoryAllocation) {
    // The caller (the caching allocator) frees its cache and retries, or throws
    // OutOfMemoryError with the numbers; the error must not linger.
    (void)cudaGetLastError();
    return nullptr;
  }
  if (err != cudaSuccess) {
    detail::throw_cuda_error(err, fmt::format("cudaMalloc({} bytes on cuda:{})", bytes, device));
  }
  return ptr;
}

void free_device(int device, void* ptr) {
  DeviceGuard guard(device);
  DDP_CUDA_CHECK(cudaFree(ptr));
}

// The device whose context serves a pinned allocation: the current one if it has a
// context, else the first one that has, else the current one. A thread whose first
// CUDA call is a pinned allocation (pin_memory, a staged copy) thus does not make a
// context on GPU 0 in every rank (PyTorch's host allocator does the same).
namespace {
int pinned_device() {
  int current = 0;
  DDP_CUDA_CHECK(cudaGetDevice(&current));
  if (has_primary_context(current)) return current;
  for (int d = 0; d < device_count(); ++d) {
    if (has_primary_context(d)) return d;
  }
  return current;
}
}  // namespace

void* malloc_pinned(size_t bytes) {
  DeviceGuard guard(pinned_device());
  void* ptr = nullptr;
  const cudaError_t err = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  if (err != cudaSuccess) {
    detail::throw_cuda_error(err, fmt::format("cudaHostAlloc({} bytes)", bytes));
  }
  return ptr;
}

void free_pinned(void* ptr) {
  DeviceGuard guard(pinned_device());
  DDP_CUDA_CHECK(cudaFreeHost(ptr));
}

void memcpy_async(int device, void* dst, const void* src, size_t bytes, CopyKind kind,
                  StreamHandle stream) {
  DeviceGuard guard(device);
  DDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, to_cuda_kind(kind), to_stream(stream)));
}

void memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device, size_t bytes,
                       StreamHandle stream) {
  DeviceGuard guard(dst_device);
  DDP_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, to_stream(stream)));
}

void memset_async(int device, void* dst, int value, size_t bytes, StreamHandle stream) {
  DeviceGuard guard(device);
  DDP_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, to_stream(stream)));
}

StreamHandle stream_create(int device) {
  DeviceGuard guard(device);
  cudaStream_t stream = nullptr;
  DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}

void stream_destroy(int device, StreamHandle stream) {
  if (stream == nullptr) return;  // the legacy default stream is not ours to destroy
  DeviceGuard guard(device);
  DDP_CUDA_CHECK(cudaStreamDestroy(to_stream(stream)));
}

void stream_synchronize(int device, StreamHandle stream) {
  DeviceGuard guard(device);
  count_host_sync();
  DDP_CUDA_CHECK(cudaStreamSynchronize(to_stream(stream)));
}

bool stream_query(int device, StreamHandle stream) {
  DeviceGuard guard(device);
  return ready(cudaStreamQuery(to_stream(stream)), "cudaStreamQuery(stream)");
}

EventHandle event_create(int device, bool enable_timing) {
  DeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  DDP_CUDA_CHECK(
      cudaEventCreateWithFlags(&event, enable_timing ? cudaEventDefault : cudaEventDisableTiming));
  return event;
}

// The calls below that name no stream do not need their device current, but a call
// on a thread whose current device has no context yet would create one there.
void event_destroy(int device, EventHandle event) {
  if (event == nullptr) return;
  DeviceGuard guard(device);
  DDP_CUDA_CHECK(cudaEventDestroy(to_event(event)));
}

void event_record(int device, EventHandle event, StreamHandle stream) {
  DeviceGuard guard(device);
  DDP_CUDA_CHECK(cudaEventRecord(to_event(event), to_stream(stream)));
}

void event_synchronize(int device, EventHandle event) {
  DeviceGuard guard(device);
  count_host_sync();
  DDP_CUDA_CHECK(cudaEventSynchronize(to_event(event)));
}

bool event_query(int device, EventHandle event) {
  DeviceGuard guard(device);
  return ready(cudaEventQuery(to_event(event)), "cudaEventQuery(event)");
}

float event_elapsed_ms(int device, EventHandle start, EventHandle end) {
  DeviceGuard guard(device);
  float ms = 0.0f;
  DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, to_event(start), to_event(end)));
  return ms;
}

void stream_wait_event(int stream_device, StreamHandle stream, EventHandle event) {
  DeviceGuard guard(stream_device);
  DDP_CUDA_CHECK(cudaStreamWaitEvent(to_stream(stream), to_event(event), 0));
}

void stream_begin_capture(int device, StreamHandle stream) {
  if (stream == nullptr) {
    throw CudaError(fmt::format(
        "cudaStreamBeginCapture on cuda:{}: the legacy default stream cannot be captured; "
        "capture on a stream ddp created (Stream::create)",
        device));
  }
  DeviceGuard guard(device);
  DDP_CUDA_CHECK(cudaStreamBeginCapture(to_stream(stream), cudaStreamCaptureModeThreadLocal));
}

GraphHandle stream_end_capture(int device, StreamHandle stream) {
  DeviceGuard guard(device);
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(to_stream(stream), &graph);
  if (err != cudaSuccess) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // a broken capture leaves its error behind
    detail::throw_cuda_error(
        err,
        fmt::format("cudaStreamEndCapture on cuda:{}: the capture broke. While capturing, "
                    "the work may not wait for the device or read from it (synchronize, "
                    "item(), a copy to pageable host memory), query an event, or use the "
                    "legacy default stream (docs/cuda_graphs.md lists what a captured step may do)",
                    device));
  }
  cudaGraphExec_t exec = nullptr;
  // A library's allocation left in the graph (a memory node not freed in it) is freed
  // before the next launch, which would fail otherwise; as PyTorch instantiates.
  const cudaError_t inst =
      cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
  (void)cudaGraphDestroy(graph);  // the instantiated graph does not need it
  if (inst != cudaSuccess) {
    (void)cudaGetLastError();
    detail::throw_cuda_error(inst, fmt::format("cudaGraphInstantiate on cuda:{}", device));
  }
  return exec;
}

void stream_abort_capture(int device, StreamHandle stream) noexcept {
  try {
    DeviceGuard guard(device);
    cudaGraph_t graph = nullptr;
    (void)cudaStreamEndCapture(to_stream(stream), &graph);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
  } catch (...) {
    // DeviceGuard failed: the device is gone, and the capture with it.
  }
}

bool stream_is_capturing(int device, StreamHandle stream) {
  DeviceGuard guard(device);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  DDP_CUDA_CHECK(cudaStreamIsCapturing(to_stream(stream), &status));
  return status != cudaStreamCaptureStatusNone;
}

void graph_launch(int device, GraphHandle graph, StreamHandle stream) {
  DeviceGuard guard(device);
  DDP_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), to_stream(stream)));
}

void graph_destroy(int device, GraphHandle graph) {
  if (graph == nullptr) return;
  DeviceGuard guard(device);
  DDP_CUDA_CHECK(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph)));
}

void check_last_error(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) detail::throw_cuda_error(err, fmt::format("launch of {}", what));
}

UncountedSyncs::UncountedSyncs() {
  ++t_uncounted_syncs;
}
UncountedSyncs::~UncountedSyncs() {
  --t_uncounted_syncs;
}

uint64_t host_sync_count() {
  return g_host_syncs.load(std::memory_order_relaxed);
}

// ---- The calling thread's device, peer access ----

namespace {

// The two driver functions Note [device guard] needs, looked up through the runtime:
// linking libcuda directly would keep the binaries from starting without a driver.
struct PrimaryContextQuery {
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDevicePrimaryCtxGetState_v7000 get_state = nullptr;
};

const PrimaryContextQuery& primary_context_query() {
  static const PrimaryContextQuery query = [] {
    PrimaryContextQuery q;
    // 12000: a version every driver that can run a CUDA 12 or 13 runtime has; a
    // version newer than the driver would fail the lookup.
    constexpr unsigned kVersion = 12000;
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &fn, kVersion, cudaEnableDefault,
                                         &status) == cudaSuccess &&
        status == cudaDriverEntryPointSuccess) {
      q.device_get = reinterpret_cast<PFN_cuDeviceGet_v2000>(fn);
    }
    fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, kVersion,
                                         cudaEnableDefault, &status) == cudaSuccess &&
        status == cudaDriverEntryPointSuccess) {
      q.get_state = reinterpret_cast<PFN_cuDevicePrimaryCtxGetState_v7000>(fn);
    }
    (void)cudaGetLastError();  // a failed lookup is an answer, not an error to report later
    return q;
  }();
  return query;
}

// Whether `device`'s primary context exists. When the driver cannot be asked (not
// expected with a CUDA 12+ driver) the answer is "yes": the guard then restores the
// previous device as a plain guard would.
bool has_primary_context(int device) {
  const PrimaryContextQuery& q = primary_context_query();
  if (q.device_get == nullptr || q.get_state == nullptr) return true;
  CUdevice handle = 0;
  if (q.device_get(&handle, device) != CUDA_SUCCESS) return true;
  unsigned int flags = 0;
  int active = 0;
  if (q.get_state(handle, &flags, &active) != CUDA_SUCCESS) return true;
  return active != 0;
}

// Peer access answers per (device, peer) pair: asked and enabled once per process.
struct PeerAccess {
  std::mutex mutex;
  std::map<std::pair<int, int>, bool> can_access;
  std::map<std::pair<int, int>, bool> enabled;
};

PeerAccess& peer_access() {
  static auto* state = new PeerAccess();  // never destroyed: used until exit
  return *state;
}

bool can_access_peer_locked(PeerAccess& state, int device, int peer) {
  const auto key = std::make_pair(device, peer);
  auto it = state.can_access.find(key);
  if (it != state.can_access.end()) return it->second;
  int can = 0;
  if (device != peer) DDP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device, peer));
  state.can_access[key] = can != 0;
  return can != 0;
}

}  // namespace

DeviceGuard::DeviceGuard(int device) : device_(device) {
  DDP_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device_) DDP_CUDA_CHECK(cudaSetDevice(device_));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ == device_ || !has_primary_context(previous_)) return;
  // A destructor must not throw; restoring a device that was valid a moment ago does
  // not fail in practice, and a failure would show in the next check.
  if (cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
}

bool can_access_peer(int device, int peer) {
  PeerAccess& state = peer_access();
  std::lock_guard<std::mutex> lock(state.mutex);
  return can_access_peer_locked(state, device, peer);
}

bool enable_peer_access(int device, int peer) {
  PeerAccess& state = peer_access();
  std::lock_guard<std::mutex> lock(state.mutex);
  const auto key = std::make_pair(device, peer);
  if (auto it = state.enabled.find(key); it != state.enabled.end()) return it->second;
  bool enabled = false;
  if (can_access_peer_locked(state, device, peer)) {
    DeviceGuard guard(device);
    const cudaError_t err = cudaDeviceEnablePeerAccess(peer, 0);
    // Already enabled (by another library, or by the user) is what we wanted. Anything
    // else (too many peers, ...) leaves copies staged by the driver: slower, not wrong.
    enabled = err == cudaSuccess || err == cudaErrorPeerAccessAlreadyEnabled;
    if (err != cudaSuccess) (void)cudaGetLastError();
  }
  state.enabled[key] = enabled;
  return enabled;
}

}  // namespace ddp::cuda_api
