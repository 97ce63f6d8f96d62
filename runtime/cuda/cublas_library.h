// cuBLAS, opened on first use (Note [vendor libraries on first use] in
// runtime/dynamic_library.h): the handful of its functions ddp calls, as
// pointers with cuBLAS's own signatures. Internal to runtime/cuda, ops/cuda and
// bench: it includes cuBLAS's header, but nothing links libcublas.
//
//   DDP_CUBLAS_CHECK(cuda_api::cublas().sgemm(handle, ...));
#pragma once

#include <cublas_v2.h>

namespace ddp::cuda_api {

// cublasGemmEx is overloaded in C++ (a wrapper taking the old cudaDataType compute
// type); this is the exported one.
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                        int, int, const void*, const void*, cudaDataType, int,
                                        const void*, cudaDataType, int, const void*, void*,
                                        cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

// Likewise cublasGemmStridedBatchedEx.
using CublasGemmStridedBatchedEx = cublasStatus_t (*)(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
    cudaDataType, int, long long int, const void*, cudaDataType, int, long long int, const void*,
    void*, cudaDataType, int, long long int, int, cublasComputeType_t, cublasGemmAlgo_t);

struct CublasLibrary {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetWorkspace_v2) set_workspace;
  decltype(&cublasSgemm_v2) sgemm;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched;
  CublasGemmEx gemm_ex;
  CublasGemmStridedBatchedEx gemm_strided_batched_ex;
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};

// Loads libcublas.so.<CUBLAS_VER_MAJOR> once per process; throws DeviceError
// naming the library, where it was looked for and how to get it.
const CublasLibrary& cublas();

}  // namespace ddp::cuda_api
