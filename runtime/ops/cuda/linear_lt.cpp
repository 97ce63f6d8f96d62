// The 16-bit linear layer through cuBLASLt (linear_lt.h; Note [cublasLt linear] in
// lt_plan.h): one matmul whose epilogue adds the bias before the single rounding to
// bf16, so the product never makes a round trip through memory for its bias.
//
// Descriptors, layouts and the heuristic's algorithm are made once per (device,
// shape, dtypes, operand alignments) and cached per thread, with the cuBLASLt handle
// (one per thread and device, like the cuBLAS handle). The workspace comes from the
// caching allocator on the call's stream, so it costs nothing after the first step.
#include "runtime/ops/cuda/linear_lt.h"

#include "runtime/cuda/cublaslt_library.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/logging.h"
#include "runtime/ops/cuda/lt_plan.h"
#include "runtime/stream.h"

#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>

namespace ddp::kernels::cuda {
namespace {

// cuBLAS's recommended workspace on Hopper; the heuristic is told the limit.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

const cuda_api::CublasLtLibrary* library() {
  // Tried once per process: a missing library is a fallback, said once.
  static const cuda_api::CublasLtLibrary* lib = []() -> const cuda_api::CublasLtLibrary* {
    try {
      return &cuda_api::cublaslt();
    } catch (const DeviceError& e) {
      DDP_LOG_WARN("bf16 linear layers use cublasGemmEx and a bias kernel: {}", e.what());
      return nullptr;
    }
  }();
  return lib;
}

void check(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw CudaError(fmt::format("{} failed: {} (cuBLASLt status {})", call,
                              library()->status_name(status), static_cast<int>(status)));
}

cudaDataType_t lt_type(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

class LtHandle {
 public:
  explicit LtHandle(int device) {
    cuda_api::DeviceGuard guard(device);
    check(library()->create(&handle_), "cublasLtCreate");
  }
  ~LtHandle() {
    if (handle_ != nullptr) (void)library()->destroy(handle_);
  }
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  cublasLtHandle_t get() const { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

// What the descriptors and the chosen algorithm depend on.
struct Key {
  int device;
  int64_t m, n, k;
  DType dtype;
  bool bias;
  int align_a, align_b, align_d, align_bias;
  bool operator==(const Key& o) const {
    return std::tie(device, m, n, k, dtype, bias, align_a, align_b, align_d, align_bias) ==
           std::tie(o.device, o.m, o.n, o.k, o.dtype, o.bias, o.align_a, o.align_b, o.align_d,
                    o.align_bias);
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<int64_t>()(k.m);
    for (int64_t v : {k.n, k.k, static_cast<int64_t>(k.dtype), static_cast<int64_t>(k.bias),
                      static_cast<int64_t>(k.device), static_cast<int64_t>(k.align_a),
                      static_cast<int64_t>(k.align_b), static_cast<int64_t>(k.align_d),
                      static_cast<int64_t>(k.align_bias)}) {
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    }
    return h;
  }
};

// One shape's descriptors and algorithm; usable == false: cuBLASLt has none (fall back).
struct Entry {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  bool usable = false;
  Entry() = default;
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;
  ~Entry() {
    const cuda_api::CublasLtLibrary* lib = library();
    if (lib == nullptr) return;
    for (cublasLtMatrixLayout_t l : {a, b, d}) {
      if (l != nullptr) (void)lib->layout_destroy(l);
    }
    if (desc != nullptr) (void)lib->desc_destroy(desc);
  }
};

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value,
              const char* what) {
  check(library()->desc_set(desc, attr, &value, sizeof(value)), what);
}

// Builds the descriptors of `plan` and asks the heuristic for an algorithm.
// bias: the call's bias pointer (or null): the heuristic reads its alignment
// (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER), and every later call of this entry
// has a bias of the same alignment (Key::align_bias).
std::unique_ptr<Entry> make_entry(cublasLtHandle_t handle, const lt_plan::Plan& plan,
                                  const Key& key, const void* bias) {
  const cuda_api::CublasLtLibrary& lt = *library();
  auto e = std::make_unique<Entry>();
  const cudaDataType_t type = lt_type(key.dtype);
  check(lt.desc_create(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = plan.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = plan.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a, "set TRANSA");
  set_desc(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b, "set TRANSB");
  if (key.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, "set EPILOGUE");
    const int32_t bias_type = type;  // the output's type (cublasLt.h)
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, "set BIAS_DATA_TYPE");
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "set BIAS_POINTER");
  }
  const auto layout = [&](cublasLtMatrixLayout_t* l, const lt_plan::Layout& s) {
    check(lt.layout_create(l, type, static_cast<uint64_t>(s.rows), static_cast<uint64_t>(s.cols),
                           s.ld),
          "cublasLtMatrixLayoutCreate");
  };
  layout(&e->a, plan.a);
  layout(&e->b, plan.b);
  layout(&e->d, plan.d);
  cublasLtMatmulPreference_t pref = nullptr;
  check(lt.preference_create(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t max_workspace = kWorkspaceBytes;
  const uint32_t align_a = static_cast<uint32_t>(key.align_a);
  const uint32_t align_b = static_cast<uint32_t>(key.align_b);
  const uint32_t align_d = static_cast<uint32_t>(key.align_d);
  cublasStatus_t status = lt.preference_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &max_workspace, sizeof(max_workspace));
  for (const auto& [attr, value] :
       {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d}}) {
    if (status == CUBLAS_STATUS_SUCCESS)
      status = lt.preference_set(pref, attr, value, sizeof(*value));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = lt.heuristic(handle, e->desc, e->a, e->b, e->d, e->d, pref, 1, &result, &found);
  }
  (void)lt.preference_destroy(pref);
  if (status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    e->algo = result.algo;
    e->workspace = result.workspaceSize;
    e->usable = true;
  } else {
    DDP_LOG_WARN(
        "cuBLASLt has no algorithm for a {} linear layer [{}, {}] x [{}, {}]^T{} (alignments {}, "
        "{}, {} bytes; heuristic: {}, {} found): it runs as cublasGemmEx and a bias kernel",
        dtype_name(key.dtype), key.n, key.k, key.m, key.k, key.bias ? " + bias" : "", key.align_b,
        key.align_a, key.align_d, lt.status_name(status), found);
  }
  return e;
}

uintptr_t address(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr());
}

}  // namespace

bool linear_lt(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out) {
  if (x.size(0) == 0 || x.size(1) == 0 || weight.size(0) == 0) return false;  // no layouts
  if (bias.defined() && bias.dtype() != out.dtype()) return false;            // the epilogue's rule
  if (bias.defined() && address(bias) % 16 != 0) return false;
  const cuda_api::CublasLtLibrary* lt = library();
  if (lt == nullptr) return false;
  const int device = out.device().index;
  cuda_api::DeviceGuard guard(device);
  thread_local std::unordered_map<int, LtHandle> handles;
  thread_local std::unordered_map<Key, std::unique_ptr<Entry>, KeyHash> entries;
  auto h = handles.find(device);
  if (h == handles.end()) h = handles.try_emplace(device, device).first;
  const lt_plan::Plan plan =
      lt_plan::linear_plan(x.size(0), x.size(1), weight.size(0), bias.defined());
  // cuBLASLt's A is the weight, its B the input (Note [cublasLt linear]).
  const Key key{device,
                plan.m,
                plan.n,
                plan.k,
                out.dtype(),
                bias.defined(),
                lt_plan::alignment_of(address(weight)),
                lt_plan::alignment_of(address(x)),
                lt_plan::alignment_of(address(out)),
                bias.defined() ? lt_plan::alignment_of(address(bias)) : 0};
  auto it = entries.find(key);
  if (it == entries.end()) {
    const void* bias_ptr = bias.defined() ? bias.data_ptr() : nullptr;
    it = entries.emplace(key, make_entry(h->second.get(), plan, key, bias_ptr)).first;
  }
  Entry& e = *it->second;
  if (!e.usable) return false;
  if (bias.defined()) {
    const void* bias_ptr = bias.data_ptr();
    set_desc(e.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_ptr, "set BIAS_POINTER");
  }
  const auto stream = static_cast<cudaStream_t>(current_stream(out.device()).handle());
  const Tensor workspace = e.workspace > 0 ? empty({static_cast<int64_t>(e.workspace)},
                                                   {.dtype = DType::u8, .device = out.device()})
                                           : Tensor();
  const float alpha = 1.0f, beta = 0.0f;
  check(lt->matmul(h->second.get(), e.desc, &alpha, weight.data_ptr(), e.a, x.data_ptr(), e.b,
                   &beta, out.data_ptr(), e.d, out.data_ptr(), e.d, &e.algo,
                   workspace.defined() ? workspace.data_ptr() : nullptr, e.workspace, stream),
        "cublasLtMatmul");
  return true;
}

}  // namespace ddp::kernels::cuda
