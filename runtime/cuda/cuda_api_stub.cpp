// cuda_api.h for a build without CUDA: no devices, and every device call throws
// DeviceError saying how to get a CUDA build. Host-only pieces (host-to-host
// copies, "pinned" staging memory) still work so CPU code paths need no special case.
#include "runtime/cuda/cuda_api.h"

#include "runtime/error.h"

#include <cstdlib>
#include <cstring>

namespace ddp::cuda_api {
namespace {

constexpr const char* kNoCuda =
    "this build of ddp has no CUDA support (configure with -DDDP_CUDA=ON and the CUDA toolkit "
    "installed)";

[[noreturn]] void no_cuda(const char* call) {
  throw DeviceError(fmt::format("cuda_api::{}: {}", call, kNoCuda));
}

}  // namespace

bool compiled() {
  return false;
}
bool emulated() {
  return false;
}
int device_count() {
  return 0;
}
std::string unavailable_reason() {
  return kNoCuda;
}

Properties properties(int) {
  no_cuda("properties");
}
void mem_get_info(int, uint64_t*, uint64_t*) {
  no_cuda("mem_get_info");
}
std::string pci_bus_id(int) {
  no_cuda("pci_bus_id");
}
int current_device() {
  no_cuda("current_device");
}
void set_device(int) {
  no_cuda("set_device");
}
void device_synchronize(int) {
  no_cuda("device_synchronize");
}

void* malloc_device(int, size_t) {
  no_cuda("malloc_device");
}
// Releasing nothing is not an error: destructors may call these with null handles.
void free_device(int, void* ptr) {
  if (ptr != nullptr) no_cuda("free_device");
}

// Plain 64-byte aligned memory, like the CPU allocator, so pinned staging works.
void* malloc_pinned(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  return std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
}
void free_pinned(void* ptr) {
  std::free(ptr);
}

void memcpy_async(int, void* dst, const void* src, size_t bytes, CopyKind kind, StreamHandle) {
  if (kind != CopyKind::host_to_host) no_cuda("memcpy_async");
  if (bytes != 0) std::memcpy(dst, src, bytes);
}
void memcpy_peer_async(void*, int, const void*, int, size_t, StreamHandle) {
  no_cuda("memcpy_peer_async");
}
void memset_async(int, void*, int, size_t, StreamHandle) {
  no_cuda("memset_async");
}

StreamHandle stream_create(int) {
  no_cuda("stream_create");
}
void stream_destroy(int, StreamHandle stream) {
  if (stream != nullptr) no_cuda("stream_destroy");
}
void stream_synchronize(int, StreamHandle) {
  no_cuda("stream_synchronize");
}
bool stream_query(int, StreamHandle) {
  no_cuda("stream_query");
}

EventHandle event_create(int, bool) {
  no_cuda("event_create");
}
void event_destroy(int, EventHandle event) {
  if (event != nullptr) no_cuda("event_destroy");
}
void event_record(int, EventHandle, StreamHandle) {
  no_cuda("event_record");
}
void event_synchronize(int, EventHandle) {
  no_cuda("event_synchronize");
}
bool event_query(int, EventHandle) {
  no_cuda("event_query");
}
float event_elapsed_ms(int, EventHandle, EventHandle) {
  no_cuda("event_elapsed_ms");
}
void stream_wait_event(int, StreamHandle, EventHandle) {
  no_cuda("stream_wait_event");
}

void stream_begin_capture(int, StreamHandle) {
  no_cuda("stream_begin_capture");
}
GraphHandle stream_end_capture(int, StreamHandle) {
  no_cuda("stream_end_capture");
}
void stream_abort_capture(int, StreamHandle) noexcept {}
bool stream_is_capturing(int, StreamHandle) {
  no_cuda("stream_is_capturing");
}
void graph_launch(int, GraphHandle, StreamHandle) {
  no_cuda("graph_launch");
}
void graph_destroy(int, GraphHandle) {
  no_cuda("graph_destroy");
}

void check_last_error(const char*) {
  no_cuda("check_last_error");
}

UncountedSyncs::UncountedSyncs() = default;
UncountedSyncs::~UncountedSyncs() = default;

uint64_t host_sync_count() {
  return 0;
}

// Without CUDA there is no device to make current; the members stay unused.
DeviceGuard::DeviceGuard(int device) : device_(device) {
  (void)device_;
  (void)previous_;
  no_cuda("DeviceGuard");
}
DeviceGuard::~DeviceGuard() = default;

bool can_access_peer(int, int) {
  return false;
}
bool enable_peer_access(int, int) {
  return false;
}

}  // namespace ddp::cuda_api
