// cuda_api.h for a build with the emulated CUDA device (Note [emulated CUDA device] in
// kernel_emu.h): DDP_CUDA_EMULATION=N gives N devices whose memory is host memory,
// whose streams run every call at once and in order, and whose kernels run on the
// CPU. Without the variable the build has no CUDA device, as a CPU-only build.
#include "runtime/cuda/cuda_api.h"

#include "runtime/cuda/emu/kernel_emu.h"
#include "runtime/error.h"
#include "runtime/memory/asan_poison.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace ddp::cuda_api {
namespace {

constexpr int kMaxDevices = 8;
constexpr uint64_t kDeviceMemory = uint64_t{16} << 30;  // what properties() reports

struct Emulation {
  int count = 0;
  std::string reason;  // why count is 0
};

const Emulation& emulation() {
  static const Emulation e = [] {
    Emulation out;
    const char* v = std::getenv("DDP_CUDA_EMULATION");
    if (v == nullptr || *v == '\0' || std::strcmp(v, "0") == 0) {
      out.reason =
          "this build emulates CUDA on the CPU (-DDDP_CUDA=EMULATE); set DDP_CUDA_EMULATION=N "
          "for N emulated devices, or build with -DDDP_CUDA=ON for a GPU";
      return out;
    }
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 1 || n > kMaxDevices) {
      out.reason = fmt::format(
          "DDP_CUDA_EMULATION='{}' is not a device count; expected 0 to {} (0 or unset: no "
          "device)",
          v, kMaxDevices);
      return out;
    }
    out.count = static_cast<int>(n);
    return out;
  }();
  return e;
}

void check_device(int device, const char* call) {
  if (emulation().count == 0)
    throw DeviceError(fmt::format("cuda_api::{}: {}", call, emulation().reason));
  if (device < 0 || device >= emulation().count)
    throw CudaError(fmt::format("{} on cuda:{}: invalid device ordinal (the emulation has {})",
                                call, device, emulation().count));
}

std::atomic<uint64_t> g_host_syncs{0};
thread_local int t_uncounted_syncs = 0;
thread_local int t_current_device = 0;
void count_host_sync() {
  if (t_uncounted_syncs == 0) ++g_host_syncs;
}

struct Accounts {
  std::mutex mutex;
  std::map<void*, std::pair<int, size_t>> allocations;  // pointer -> (device, bytes)
  uint64_t used[kMaxDevices] = {};
};
Accounts& accounts() {
  static Accounts* a = new Accounts;  // outlives static destructors that free memory
  return *a;
}

struct Stream {
  int device;
};
struct Event {
  int device;
  bool timing;
  bool recorded = false;
  std::chrono::steady_clock::time_point at{};
};

// Note [stream device]: CUDA refuses a call on a stream of another device than the
// one it names (or, for a launch, than the current one); a real GPU would fail there.
// The device a stream belongs to other than `device`, -1 if it belongs to `device`
// (nullptr: the legacy default stream of the device that uses it).
int foreign_owner(int device, StreamHandle stream) {
  if (stream == nullptr) return -1;
  const int owner = static_cast<Stream*>(stream)->device;
  return owner == device ? -1 : owner;
}

void check_stream(int device, StreamHandle stream, const char* call) {
  if (const int owner = foreign_owner(device, stream); owner >= 0)
    throw CudaError(
        fmt::format("{} on cuda:{}: the stream belongs to cuda:{}", call, device, owner));
}

[[noreturn]] void no_graphs(const char* call) {
  throw CudaError(fmt::format(
      "{}: CUDA graphs are not emulated (the emulated device runs every call at once); run "
      "without --cuda-graph, or on a GPU",
      call));
}

// A device allocation's bytes in host memory: 256-byte blocks, as cudaMalloc aligns.
size_t raw_size(size_t bytes) {
  return bytes == 0 ? 256 : (bytes + 255) / 256 * 256;
}

}  // namespace

bool compiled() {
  return true;
}
bool emulated() {
  return true;
}
int device_count() {
  return emulation().count;
}
std::string unavailable_reason() {
  return emulation().reason;
}

Properties properties(int device) {
  check_device(device, "properties");
  Properties p;
  p.name = fmt::format("emulated CUDA device {} (CPU)", device);
  p.total_memory = kDeviceMemory;
  p.major = 9;
  p.minor = 0;
  p.multiprocessors = 2;
  return p;
}

void mem_get_info(int device, uint64_t* free_bytes, uint64_t* total_bytes) {
  check_device(device, "mem_get_info");
  std::lock_guard<std::mutex> lock(accounts().mutex);
  const uint64_t used = accounts().used[device];
  if (free_bytes) *free_bytes = used < kDeviceMemory ? kDeviceMemory - used : 0;
  if (total_bytes) *total_bytes = kDeviceMemory;
}

std::string pci_bus_id(int device) {
  check_device(device, "pci_bus_id");
  return fmt::format("0000:e0:{:02x}.0", device);
}

int current_device() {
  check_device(0, "current_device");
  return t_current_device;
}
void set_device(int device) {
  check_device(device, "set_device");
  t_current_device = device;
}
void device_synchronize(int device) {
  check_device(device, "device_synchronize");
  count_host_sync();
}

void* malloc_device(int device, size_t bytes) {
  check_device(device, "malloc_device");
  std::lock_guard<std::mutex> lock(accounts().mutex);
  if (accounts().used[device] + bytes > kDeviceMemory) return nullptr;
  const size_t rounded = raw_size(bytes);
  void* p = std::aligned_alloc(256, rounded);
  if (p == nullptr) return nullptr;
  // Past the bytes asked is out of bounds, as compute-sanitizer sees a cudaMalloc (the
  // caching allocator poisons its own rounding; Note [no caching] asks for exact sizes).
  asan::poison(static_cast<char*>(p) + bytes, rounded - bytes);
  accounts().allocations[p] = {device, bytes};
  accounts().used[device] += bytes;
  return p;
}
void free_device(int device, void* ptr) {
  if (ptr == nullptr) return;
  check_device(device, "free_device");
  {
    std::lock_guard<std::mutex> lock(accounts().mutex);
    auto it = accounts().allocations.find(ptr);
    if (it == accounts().allocations.end() || it->second.first != device)
      throw CudaError(
          fmt::format("cudaFree on cuda:{}: {} is not an allocation of that device", device, ptr));
    accounts().used[device] -= it->second.second;
    asan::unpoison(ptr, raw_size(it->second.second));
    accounts().allocations.erase(it);
  }
  std::free(ptr);
}

void* malloc_pinned(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  return std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
}
void free_pinned(void* ptr) {
  std::free(ptr);
}

void memcpy_async(int device, void* dst, const void* src, size_t bytes, CopyKind kind,
                  StreamHandle stream) {
  if (kind != CopyKind::host_to_host) {
    check_device(device, "memcpy_async");
    check_stream(device, stream, "cudaMemcpyAsync");
  }
  if (bytes != 0) std::memmove(dst, src, bytes);
}
void memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device, size_t bytes,
                       StreamHandle stream) {
  check_device(dst_device, "memcpy_peer_async");
  check_device(src_device, "memcpy_peer_async");
  check_stream(dst_device, stream, "cudaMemcpyPeerAsync");
  if (bytes != 0) std::memmove(dst, src, bytes);
}
void memset_async(int device, void* dst, int value, size_t bytes, StreamHandle stream) {
  check_device(device, "memset_async");
  check_stream(device, stream, "cudaMemsetAsync");
  if (bytes != 0) std::memset(dst, value, bytes);
}

StreamHandle stream_create(int device) {
  check_device(device, "stream_create");
  return new Stream{device};
}
void stream_destroy(int, StreamHandle stream) {
  delete static_cast<Stream*>(stream);
}
void stream_synchronize(int device, StreamHandle stream) {
  check_device(device, "stream_synchronize");
  check_stream(device, stream, "cudaStreamSynchronize");
  count_host_sync();
}
bool stream_query(int device, StreamHandle) {
  check_device(device, "stream_query");
  return true;
}

EventHandle event_create(int device, bool enable_timing) {
  check_device(device, "event_create");
  return new Event{device, enable_timing};
}
void event_destroy(int, EventHandle event) {
  delete static_cast<Event*>(event);
}
void event_record(int device, EventHandle event, StreamHandle stream) {
  check_device(device, "event_record");
  check_stream(device, stream, "cudaEventRecord");
  auto* e = static_cast<Event*>(event);
  if (e->device != device)
    throw CudaError(
        fmt::format("cudaEventRecord: an event of cuda:{} recorded on cuda:{}", e->device, device));
  e->recorded = true;
  e->at = std::chrono::steady_clock::now();
}
void event_synchronize(int device, EventHandle) {
  check_device(device, "event_synchronize");
  count_host_sync();
}
bool event_query(int device, EventHandle) {
  check_device(device, "event_query");
  return true;
}
float event_elapsed_ms(int device, EventHandle start, EventHandle end) {
  check_device(device, "event_elapsed_ms");
  const auto* a = static_cast<Event*>(start);
  const auto* b = static_cast<Event*>(end);
  if (!a->timing || !b->timing)
    throw CudaError("cudaEventElapsedTime: an event created without timing");
  if (!a->recorded || !b->recorded)
    throw CudaError("cudaEventElapsedTime: an event that was never recorded");
  return std::chrono::duration<float, std::milli>(b->at - a->at).count();
}
void stream_wait_event(int stream_device, StreamHandle stream, EventHandle) {
  check_device(stream_device, "stream_wait_event");
  check_stream(stream_device, stream, "cudaStreamWaitEvent");
}

void stream_begin_capture(int, StreamHandle) {
  no_graphs("cudaStreamBeginCapture");
}
GraphHandle stream_end_capture(int, StreamHandle) {
  no_graphs("cudaStreamEndCapture");
}
void stream_abort_capture(int, StreamHandle) noexcept {}
bool stream_is_capturing(int, StreamHandle) {
  return false;
}
void graph_launch(int, GraphHandle, StreamHandle) {
  no_graphs("cudaGraphLaunch");
}
void graph_destroy(int, GraphHandle) {}

void check_last_error(const char* what) {
  const std::string err = cuda_emu::take_last_error();
  if (!err.empty()) throw CudaError(fmt::format("launch of {} failed: {}", what, err));
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

DeviceGuard::DeviceGuard(int device) : device_(device), previous_(t_current_device) {
  check_device(device, "DeviceGuard");
  t_current_device = device_;
}
DeviceGuard::~DeviceGuard() {
  t_current_device = previous_;
}

bool can_access_peer(int device, int peer) {
  return device != peer && device < emulation().count && peer < emulation().count;
}
bool enable_peer_access(int device, int peer) {
  return can_access_peer(device, peer);
}

}  // namespace ddp::cuda_api

namespace ddp::cuda_emu {

std::string stream_problem(cudaStream_t stream) {
  const int owner = cuda_api::foreign_owner(cuda_api::t_current_device, stream);
  if (owner < 0) return "";
  return fmt::format("launched into a stream of cuda:{} while cuda:{} is current", owner,
                     cuda_api::t_current_device);
}

}  // namespace ddp::cuda_emu

// The CUDA runtime calls that ops/cuda makes itself (cuda_check.h's error text): no
// emulated call fails with a cudaError_t, so there is never an error to report.
extern "C" {
cudaError_t cudaGetLastError() {
  return cudaSuccess;
}
const char* cudaGetErrorString(cudaError_t err) {
  return err == cudaSuccess ? "no error" : "emulated CUDA error";
}
const char* cudaGetErrorName(cudaError_t err) {
  return err == cudaSuccess ? "cudaSuccess" : "cudaErrorUnknown";
}
}
