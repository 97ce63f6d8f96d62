// GEMM on CUDA through cuBLAS, for row-major tensors.
//
// Note [row-major gemm]: cuBLAS is column-major, and a row-major [r, c] matrix
// read column-major is its transpose [c, r]. So row-major C = op(A) op(B) is
// computed as column-major C^T = op(B)^T op(A)^T: swap the operands and m/n,
// keep the transpose flags, and pass the row-major leading dimensions.
#include "runtime/ops/cuda/launch.cuh"  // first (see its top)

#include "runtime/cuda/cublas_library.h"
#include "runtime/ops/cuda/cublas_handle.h"
#include "runtime/ops/kernels.h"

#include <climits>
#include <map>
#include <unordered_map>
#include <utility>

namespace ddp::kernels::cuda {
namespace {

// One cuBLAS handle, destroyed with its owner.
class CublasHandle {
 public:
  explicit CublasHandle(int device) {
    cuda_api::DeviceGuard guard(device);
    DDP_CUBLAS_CHECK(cuda_api::cublas().create(&handle_));
  }
  ~CublasHandle() {
    // Errors cannot be reported from a destructor; at thread exit the context may
    // already be going away, which is not worth a crash.
    if (handle_ != nullptr) (void)cuda_api::cublas().destroy(handle_);
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

cudaDataType_t cublas_type(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    case DType::f32:
      return CUDA_R_32F;
    default:
      throw ValueError(
          fmt::format("matmul on cuda supports f32, bf16 and f16, not {}", dtype_name(dtype)));
  }
}

}  // namespace

namespace detail {

// Note [cublas workspace]: cublasSetStream puts a handle back on cuBLAS's own
// workspace, which cuBLAS then allocates and frees as nodes of a CUDA graph being
// captured, outside ddp's caching allocator and its memory limit. As PyTorch does,
// each (thread, device, stream) gets a workspace from the caching allocator instead,
// set after every cublasSetStream and kept while the thread lives: made while a graph
// is captured, it is that graph's (Note [capture pools]). The size is cuBLAS's
// recommendation: 32 MiB on Hopper and later, 4 MiB before.
const Tensor& cublas_workspace(int device, cudaStream_t stream) {
  thread_local std::map<std::pair<int, cudaStream_t>, Tensor> workspaces;
  auto it = workspaces.find({device, stream});
  if (it == workspaces.end()) {
    // Asked once per device, on its first gemm (an eager one: graphs capture after warm-up).
    thread_local std::unordered_map<int, int64_t> sizes;
    auto size = sizes.find(device);
    if (size == sizes.end()) {
      size = sizes.emplace(device, int64_t{cuda_api::properties(device).major >= 9 ? 32 : 4} << 20)
                 .first;
    }
    const int64_t bytes = size->second;
    it = workspaces
             .emplace(std::make_pair(device, stream),
                      empty({bytes / 8}, {.dtype = DType::i64, .device = Device::cuda(device)}))
             .first;
  }
  return it->second;
}

cublasHandle_t cublas_handle_for(const Tensor& t) {
  thread_local std::unordered_map<int, CublasHandle> handles;
  const int device = t.device().index;
  auto it = handles.find(device);
  if (it == handles.end()) it = handles.try_emplace(device, device).first;
  cublasHandle_t handle = it->second.get();
  const cudaStream_t stream = stream_of(t);
  DDP_CUBLAS_CHECK(cuda_api::cublas().set_stream(handle, stream));
  const Tensor& workspace = cublas_workspace(device, stream);  // Note [cublas workspace]
  DDP_CUBLAS_CHECK(
      cuda_api::cublas().set_workspace(handle, workspace.data_ptr(), workspace.nbytes()));
  return handle;
}

int cublas_int(int64_t v, const char* op, const char* what) {
  DDP_CHECK(v <= INT_MAX, "{}: {} = {} is larger than cuBLAS supports ({}); split the {}", op, what,
            v, INT_MAX, op);
  return static_cast<int>(v);
}

}  // namespace detail

namespace {
int checked_int(int64_t v, const char* what) {
  return detail::cublas_int(v, "matmul", what);
}
}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b, float alpha,
          float beta) {
  const int64_t m = trans_a ? a.size(1) : a.size(0);
  const int64_t k = trans_a ? a.size(0) : a.size(1);
  const int64_t n = trans_b ? b.size(0) : b.size(1);
  if (m == 0 || n == 0) return;
  const int mi = checked_int(m, "m"), ni = checked_int(n, "n"), ki = checked_int(k, "k");
  // Row-major leading dimensions (each operand's row length); cuBLAS wants >= 1
  // even when k == 0 (then it only scales out by beta).
  const int lda = std::max(checked_int(a.size(1), "a.size(1)"), 1);
  const int ldb = std::max(checked_int(b.size(1), "b.size(1)"), 1);
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;

  cuda_api::DeviceGuard guard(out.device().index);
  const cublasHandle_t handle = detail::cublas_handle_for(out);
  // Note [row-major gemm]: B first, then A; C^T is [n, m] with leading dimension n.
  if (a.dtype() == DType::f32) {
    // The default math mode keeps full f32 (no TF32) unless NVIDIA_TF32_OVERRIDE says so.
    DDP_CUBLAS_CHECK(cuda_api::cublas().sgemm(
        handle, op_b, op_a, ni, mi, ki, &alpha, detail::ptr<const float>(b), ldb,
        detail::ptr<const float>(a), lda, &beta, detail::ptr<float>(out), ni));
    return;
  }
  // 16-bit operands with f32 accumulation; out theirs or f32 (a weight's gradient
  // under autocast), both in cublasGemmEx's table for CUBLAS_COMPUTE_32F.
  const cudaDataType_t type = cublas_type(a.dtype());
  DDP_CUBLAS_CHECK(cuda_api::cublas().gemm_ex(handle, op_b, op_a, ni, mi, ki, &alpha, b.data_ptr(),
                                              type, ldb, a.data_ptr(), type, lda, &beta,
                                              out.data_ptr(), cublas_type(out.dtype()), ni,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace ddp::kernels::cuda
