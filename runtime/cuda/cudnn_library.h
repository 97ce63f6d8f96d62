// cuDNN, opened on first use (Note [vendor libraries on first use] in
// runtime/dynamic_library.h): its handle functions and the backend (graph) API that
// the fused attention calls (ops/cuda/sdpa_cudnn.cpp), as pointers with cuDNN's own
// signatures. Internal to runtime/cuda and ops/cuda: it includes cuDNN's graph
// header, but nothing links libcudnn.
//
// cuDNN is optional: the fused attention falls back to the packed kernels when the
// library is missing (try_cudnn), while cudnn() throws for callers that need it.
#pragma once

#include <cudnn_graph.h>

#include <string>

namespace ddp::cuda_api {

struct CudnnLibrary {
  decltype(&cudnnGetVersion) get_version;
  decltype(&cudnnCreate) create;
  decltype(&cudnnDestroy) destroy;
  decltype(&cudnnSetStream) set_stream;
  decltype(&cudnnGetErrorString) error_string;
  decltype(&cudnnGetLastErrorString) last_error_string;
  decltype(&cudnnBackendCreateDescriptor) create_descriptor;
  decltype(&cudnnBackendDestroyDescriptor) destroy_descriptor;
  decltype(&cudnnBackendSetAttribute) set_attribute;
  decltype(&cudnnBackendGetAttribute) get_attribute;
  decltype(&cudnnBackendFinalize) finalize;
  decltype(&cudnnBackendExecute) execute;
  size_t version = 0;                // get_version(), e.g. 91900 for 9.19.0
  std::string path;                  // the file that was opened
  std::string version_text() const;  // "9.19.0"
};

// Loads libcudnn.so.<CUDNN_MAJOR> once per process (the CUDA toolkit's lib folder,
// the system's, then the Python nvidia-cudnn wheels'); throws DeviceError naming the
// library, where it was looked for and how to get it, or a loaded library whose
// major version is not the one this build's headers describe.
const CudnnLibrary& cudnn();

// cudnn(), or nullptr with `why` set to its error: for the optional users.
const CudnnLibrary* try_cudnn(std::string* why = nullptr);

}  // namespace ddp::cuda_api
