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
// Asynchronous on `stream` (which belongs to the device of the device side).
void memcpy_async(void* dst, const void* src, size_t bytes, CopyKind kind, StreamHandle stream);
// Async copy between two different GPUs (peer copy).
void memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device, size_t bytes,
                       StreamHandle stream);
void memset_async(void* dst, int value, size_t bytes, StreamHandle stream);

StreamHandle stream_create(int device);  // non-blocking w.r.t. the legacy default stream
void stream_destroy(StreamHandle stream);
void stream_synchronize(StreamHandle stream);
bool stream_query(StreamHandle stream);  // true when all work on it finished

EventHandle event_create(int device, bool enable_timing);
void event_destroy(EventHandle event);
void event_record(EventHandle event, StreamHandle stream);
void event_synchronize(EventHandle event);
bool event_query(EventHandle event);
float event_elapsed_ms(EventHandle start, EventHandle end);
void stream_wait_event(StreamHandle stream, EventHandle event);

// Throws CudaError if a kernel launch failed (cudaGetLastError), naming `what`.
void check_last_error(const char* what);

// How many times ddp blocked the host on the GPU so far (stream, event and device
// synchronizations, in every thread): tests count them to show that a path, such
// as DDP's backward, never stalls the host. Always 0 in a build without CUDA.
uint64_t host_sync_count();

}  // namespace ddp::cuda_api
