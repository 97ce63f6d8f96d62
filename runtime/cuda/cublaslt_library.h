// cuBLASLt, opened on first use (Note [vendor libraries on first use] in
// runtime/dynamic_library.h): the functions of its matmul API that ddp calls
// (ops/cuda/linear_lt.cpp), as pointers with cuBLASLt's own signatures. Internal to
// runtime/cuda and ops/cuda: it includes cuBLASLt's header, but nothing links it.
#pragma once

#include <cublasLt.h>

namespace ddp::cuda_api {

struct CublasLtLibrary {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
  decltype(&cublasLtGetStatusName) status_name;
};

// Loads libcublasLt.so.<CUBLAS_VER_MAJOR> once per process; throws DeviceError
// naming the library, where it was looked for and how to get it.
const CublasLtLibrary& cublaslt();

}  // namespace ddp::cuda_api
