#include "tests/gpu/driver_context.h"

#include <dlfcn.h>

#include <string>

namespace ddp::gpu_test {
namespace {

// The driver API's types, as cuda.h declares them (CUresult and CUdevice are
// ints); declared here so that this file builds without the CUDA headers.
using CuInit = int (*)(unsigned int flags);
using CuDeviceGet = int (*)(int* device, int ordinal);
using CuDevicePrimaryCtxGetState = int (*)(int device, unsigned int* flags, int* active);

struct Driver {
  CuInit init = nullptr;
  CuDeviceGet device_get = nullptr;
  CuDevicePrimaryCtxGetState primary_ctx_get_state = nullptr;
  std::string error;  // why the functions above are missing
};

const Driver& driver() {
  static const Driver d = [] {
    Driver out;
    // Never closed: the CUDA runtime keeps the same library loaded anyway.
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      out.error = std::string("dlopen(libcuda.so.1) failed: ") + (e ? e : "unknown error");
      return out;
    }
    out.init = reinterpret_cast<CuInit>(dlsym(lib, "cuInit"));
    out.device_get = reinterpret_cast<CuDeviceGet>(dlsym(lib, "cuDeviceGet"));
    out.primary_ctx_get_state =
        reinterpret_cast<CuDevicePrimaryCtxGetState>(dlsym(lib, "cuDevicePrimaryCtxGetState"));
    if (!out.init || !out.device_get || !out.primary_ctx_get_state) {
      out.error = "libcuda.so.1 lacks cuInit, cuDeviceGet or cuDevicePrimaryCtxGetState";
    }
    return out;
  }();
  return d;
}

}  // namespace

std::optional<bool> primary_context_active(int ordinal, std::string* why) {
  const Driver& d = driver();
  if (!d.error.empty()) {
    *why = d.error;
    return std::nullopt;
  }
  int device = 0, active = 0;
  unsigned int flags = 0;
  int rc = d.init(0);
  if (rc == 0) rc = d.device_get(&device, ordinal);
  if (rc == 0) rc = d.primary_ctx_get_state(device, &flags, &active);
  if (rc != 0) {
    *why = "the driver API failed with CUresult " + std::to_string(rc) + " for device " +
           std::to_string(ordinal);
    return std::nullopt;
  }
  return active != 0;
}

}  // namespace ddp::gpu_test
