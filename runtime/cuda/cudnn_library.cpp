#include "runtime/cuda/cudnn_library.h"

#include "runtime/dynamic_library.h"
#include "runtime/error.h"

#include "runtime/fmt.h"

#include <memory>

namespace ddp::cuda_api {
namespace {

// cuDNN compiles its fused-attention kernels with NVRTC, which it opens itself by
// name (libnvrtc.so.<CUDA major>): opened here first from the places we search, so an
// NVRTC that only a Python wheel brings (nvidia-cuda-nvrtc) is the one it finds, the
// loader matching the name to the library already loaded. Optional: without it cuDNN
// has no engine for the graphs and says so, and the packed attention runs.
void preload_nvrtc() {
  try {
    static const DynamicLibrary nvrtc(
        LibrarySpec{.soname = fmt::format("libnvrtc.so.{}", CUDART_VERSION / 1000),
                    .what = "NVRTC, which cuDNN compiles its fused attention with",
                    .fallback_dirs = python_wheel_library_dirs(
                        "cuda_nvrtc", {DDP_CUDA_LIBRARY_DIR, "/usr/local/cuda/lib64"}),
                    .fix = "install the CUDA toolkit's NVRTC or pip install nvidia-cuda-nvrtc"});
  } catch (const DeviceError&) {
  }
}

CudnnLibrary load_cudnn() {
  preload_nvrtc();
  // Static: opened once, kept open (runtime/dynamic_library.h).
  static const DynamicLibrary lib(LibrarySpec{
      .soname = fmt::format("libcudnn.so.{}", CUDNN_MAJOR),
      .what = "cuDNN, whose fused attention bf16 GPT training on CUDA devices uses",
      .fallback_dirs =
          python_wheel_library_dirs("cudnn", {DDP_CUDA_LIBRARY_DIR, "/usr/local/cuda/lib64"}),
      .fix = fmt::format("install cuDNN {} for CUDA {} (the toolkit's cudnn package, or pip "
                         "install nvidia-cudnn-cu{}) and put its lib folder on LD_LIBRARY_PATH; "
                         "DDP_CUDNN_ATTENTION=0 silences this and keeps the packed attention",
                         CUDNN_MAJOR, CUDART_VERSION / 1000, CUDART_VERSION / 1000)});
  CudnnLibrary api{};
  api.get_version = lib.function<decltype(api.get_version)>("cudnnGetVersion");
  api.create = lib.function<decltype(api.create)>("cudnnCreate");
  api.destroy = lib.function<decltype(api.destroy)>("cudnnDestroy");
  api.set_stream = lib.function<decltype(api.set_stream)>("cudnnSetStream");
  api.error_string = lib.function<decltype(api.error_string)>("cudnnGetErrorString");
  api.last_error_string = lib.function<decltype(api.last_error_string)>("cudnnGetLastErrorString");
  api.create_descriptor =
      lib.function<decltype(api.create_descriptor)>("cudnnBackendCreateDescriptor");
  api.destroy_descriptor =
      lib.function<decltype(api.destroy_descriptor)>("cudnnBackendDestroyDescriptor");
  api.set_attribute = lib.function<decltype(api.set_attribute)>("cudnnBackendSetAttribute");
  api.get_attribute = lib.function<decltype(api.get_attribute)>("cudnnBackendGetAttribute");
  api.finalize = lib.function<decltype(api.finalize)>("cudnnBackendFinalize");
  api.execute = lib.function<decltype(api.execute)>("cudnnBackendExecute");
  api.version = api.get_version();
  api.path = lib.path();
  if (api.version / 10000 != CUDNN_MAJOR) {
    throw DeviceError(
        fmt::format("{} is cuDNN {}, but this build was compiled against cuDNN {} ({}.{}.{}): its "
                    "backend API's attributes may differ. Put a cuDNN {} lib folder first on "
                    "LD_LIBRARY_PATH (DDP_CUDNN_ATTENTION=0 keeps the packed attention)",
                    api.path, api.version_text(), CUDNN_MAJOR, CUDNN_MAJOR, CUDNN_MINOR,
                    CUDNN_PATCHLEVEL, CUDNN_MAJOR));
  }
  return api;
}

}  // namespace

// cuDNN's versions are MAJOR * 10000 + MINOR * 100 + PATCH since 9.0.
std::string CudnnLibrary::version_text() const {
  return fmt::format("{}.{}.{}", version / 10000, version / 100 % 100, version % 100);
}

const CudnnLibrary& cudnn() {
  static const CudnnLibrary api = load_cudnn();
  return api;
}

const CudnnLibrary* try_cudnn(std::string* why) {
  // Tried once per process; the reason kept for every later caller.
  static std::string error;
  static const CudnnLibrary* lib = []() -> const CudnnLibrary* {
    try {
      return &cudnn();
    } catch (const DeviceError& e) {
      error = e.what();
      return nullptr;
    }
  }();
  if (lib == nullptr && why != nullptr) *why = error;
  return lib;
}

}  // namespace ddp::cuda_api
