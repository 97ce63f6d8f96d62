#include "runtime/cuda/cublas_library.h"

#include "runtime/dynamic_library.h"
#include "runtime/error.h"

#include "runtime/fmt.h"

namespace ddp::cuda_api {
namespace {

CublasLibrary load_cublas() {
  // Static: opened once, kept open (runtime/dynamic_library.h).
  static const DynamicLibrary lib(LibrarySpec{
      .soname = fmt::format("libcublas.so.{}", CUBLAS_VER_MAJOR),
      .what = "cuBLAS, which matmul on CUDA devices needs",
      .fallback_dirs =
          python_wheel_library_dirs("cublas", {DDP_CUDA_LIBRARY_DIR, "/usr/local/cuda/lib64"}),
      .fix = fmt::format(
          "cuBLAS {} comes with the CUDA {} toolkit (or pip install nvidia-cublas): put its lib "
          "folder on LD_LIBRARY_PATH, or build ddp with the CUDA toolkit installed here "
          "(cmake -DCMAKE_CUDA_COMPILER=/usr/local/cuda-X.Y/bin/nvcc). Without a GPU use --device "
          "cpu",
          CUBLAS_VER_MAJOR, CUBLAS_VER_MAJOR)});
  CublasLibrary api{};
  api.create = lib.function<decltype(api.create)>("cublasCreate_v2");
  api.destroy = lib.function<decltype(api.destroy)>("cublasDestroy_v2");
  api.set_stream = lib.function<decltype(api.set_stream)>("cublasSetStream_v2");
  api.set_workspace = lib.function<decltype(api.set_workspace)>("cublasSetWorkspace_v2");
  api.sgemm = lib.function<decltype(api.sgemm)>("cublasSgemm_v2");
  api.sgemm_strided_batched =
      lib.function<decltype(api.sgemm_strided_batched)>("cublasSgemmStridedBatched");
  api.gemm_ex = lib.function<decltype(api.gemm_ex)>("cublasGemmEx");
  api.gemm_strided_batched_ex =
      lib.function<decltype(api.gemm_strided_batched_ex)>("cublasGemmStridedBatchedEx");
  api.status_name = lib.function<decltype(api.status_name)>("cublasGetStatusName");
  api.status_string = lib.function<decltype(api.status_string)>("cublasGetStatusString");
  return api;
}

}  // namespace

const CublasLibrary& cublas() {
  static const CublasLibrary api = load_cublas();
  return api;
}

}  // namespace ddp::cuda_api
