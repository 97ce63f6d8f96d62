#include "runtime/cuda/cublaslt_library.h"

#include "runtime/dynamic_library.h"
#include "runtime/error.h"

#include "runtime/fmt.h"

namespace ddp::cuda_api {
namespace {

CublasLtLibrary load_cublaslt() {
  // Static: opened once, kept open (runtime/dynamic_library.h).
  static const DynamicLibrary lib(LibrarySpec{
      .soname = fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR),
      .what = "cuBLASLt, which bf16 linear layers on CUDA devices use",
      .fallback_dirs =
          python_wheel_library_dirs("cublas", {DDP_CUDA_LIBRARY_DIR, "/usr/local/cuda/lib64"}),
      .fix =
          fmt::format("cuBLASLt {} comes with the CUDA {} toolkit next to cuBLAS (or pip install "
                      "nvidia-cublas): put its lib folder on LD_LIBRARY_PATH",
                      CUBLAS_VER_MAJOR, CUBLAS_VER_MAJOR)});
  CublasLtLibrary api{};
  api.create = lib.function<decltype(api.create)>("cublasLtCreate");
  api.destroy = lib.function<decltype(api.destroy)>("cublasLtDestroy");
  api.desc_create = lib.function<decltype(api.desc_create)>("cublasLtMatmulDescCreate");
  api.desc_destroy = lib.function<decltype(api.desc_destroy)>("cublasLtMatmulDescDestroy");
  api.desc_set = lib.function<decltype(api.desc_set)>("cublasLtMatmulDescSetAttribute");
  api.layout_create = lib.function<decltype(api.layout_create)>("cublasLtMatrixLayoutCreate");
  api.layout_destroy = lib.function<decltype(api.layout_destroy)>("cublasLtMatrixLayoutDestroy");
  api.preference_create =
      lib.function<decltype(api.preference_create)>("cublasLtMatmulPreferenceCreate");
  api.preference_destroy =
      lib.function<decltype(api.preference_destroy)>("cublasLtMatmulPreferenceDestroy");
  api.preference_set =
      lib.function<decltype(api.preference_set)>("cublasLtMatmulPreferenceSetAttribute");
  api.heuristic = lib.function<decltype(api.heuristic)>("cublasLtMatmulAlgoGetHeuristic");
  api.matmul = lib.function<decltype(api.matmul)>("cublasLtMatmul");
  api.status_name = lib.function<decltype(api.status_name)>("cublasLtGetStatusName");
  return api;
}

}  // namespace

const CublasLtLibrary& cublaslt() {
  static const CublasLtLibrary api = load_cublaslt();
  return api;
}

}  // namespace ddp::cuda_api
