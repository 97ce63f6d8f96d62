#include "collectives/nccl_library.h"

#include "runtime/dynamic_library.h"
#include "runtime/error.h"

#include "runtime/fmt.h"

namespace ddp::nccl {
namespace {

Library load() {
  // Static: opened once, kept open (runtime/dynamic_library.h).
  static const DynamicLibrary lib(LibrarySpec{
      .soname = fmt::format("libnccl.so.{}", NCCL_MAJOR),
      .what = "NCCL, which the nccl backend needs",
      .fallback_dirs = {DDP_NCCL_LIBRARY_DIR, "/usr/local/cuda/lib64"},
      .fix = fmt::format(
          "NCCL {}.x for CUDA {} comes from NVIDIA's repository (apt-get install libnccl2) or "
          "pip install nvidia-nccl-cu{}: put its lib folder on LD_LIBRARY_PATH. Without NCCL, "
          "--backend shm (one node) or gloo carry CUDA tensors through host memory",
          NCCL_MAJOR, CUDART_VERSION / 1000, CUDART_VERSION / 1000)});
  Library api{};
  api.get_version = lib.function<decltype(api.get_version)>("ncclGetVersion");
  api.get_error_string = lib.function<decltype(api.get_error_string)>("ncclGetErrorString");
  api.get_unique_id = lib.function<decltype(api.get_unique_id)>("ncclGetUniqueId");
  api.comm_init_rank = lib.function<decltype(api.comm_init_rank)>("ncclCommInitRank");
  api.comm_destroy = lib.function<decltype(api.comm_destroy)>("ncclCommDestroy");
  api.comm_abort = lib.function<decltype(api.comm_abort)>("ncclCommAbort");
  api.comm_get_async_error =
      lib.function<decltype(api.comm_get_async_error)>("ncclCommGetAsyncError");
  api.all_reduce = lib.function<decltype(api.all_reduce)>("ncclAllReduce");
  api.broadcast = lib.function<decltype(api.broadcast)>("ncclBroadcast");
  api.all_gather = lib.function<decltype(api.all_gather)>("ncclAllGather");
  api.reduce_scatter = lib.function<decltype(api.reduce_scatter)>("ncclReduceScatter");
  api.reduce = lib.function<decltype(api.reduce)>("ncclReduce");
  return api;
}

}  // namespace

const Library& library() {
  static const Library api = load();
  return api;
}

}  // namespace ddp::nccl
