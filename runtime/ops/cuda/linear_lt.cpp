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
#include "runtime/env.h"
#include "runtime/logging.h"
#include "runtime/ops/cuda/lt_plan.h"
#include "runtime/stream.h"

#include "runtime/fmt.h"

#include <atomic>
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

// The matmuls of Note [cublasLt linear], Note [weight gradient epilogue] and Note
// [gelu epilogues].
enum class Kind { forward, weight_grad, forward_gelu, input_grad_dgelu };

// What the descriptors and the chosen algorithm depend on. bias: the epilogue's vector
// (the bias, or the bias gradient for Kind::weight_grad) is used.
struct Key {
  int device;
  Kind kind;
  int64_t m, n, k;
  DType dtype;      // A's and B's
  DType out_dtype;  // D's and the epilogue vector's
  bool bias;
  int align_a, align_b, align_d, align_bias, align_aux;
  bool operator==(const Key& o) const {
    return std::tie(device, kind, m, n, k, dtype, out_dtype, bias, align_a, align_b, align_d,
                    align_bias, align_aux) == std::tie(o.device, o.kind, o.m, o.n, o.k, o.dtype,
                                                       o.out_dtype, o.bias, o.align_a, o.align_b,
                                                       o.align_d, o.align_bias, o.align_aux);
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<int64_t>()(k.m);
    for (int64_t v : {k.n, k.k, static_cast<int64_t>(k.kind), static_cast<int64_t>(k.dtype),
                      static_cast<int64_t>(k.out_dtype), static_cast<int64_t>(k.bias),
                      static_cast<int64_t>(k.device), static_cast<int64_t>(k.align_a),
                      static_cast<int64_t>(k.align_b), static_cast<int64_t>(k.align_d),
                      static_cast<int64_t>(k.align_bias), static_cast<int64_t>(k.align_aux)}) {
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
  bool ran = false;  // a matmul of this entry has been accepted once
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

// What an entry multiplies, for the log: "a bf16 linear layer [N, in] x [out, in]^T".
std::string describe(const Key& key) {
  if (key.kind == Kind::forward || key.kind == Kind::forward_gelu) {
    return fmt::format("a {} linear layer [{}, {}] x [{}, {}]^T{}{}", dtype_name(key.dtype), key.n,
                       key.k, key.m, key.k, key.bias ? " + bias" : "",
                       key.kind == Kind::forward_gelu ? " then GELU" : "");
  }
  if (key.kind == Kind::input_grad_dgelu) {
    return fmt::format("a {} linear layer's input gradient [{}, {}] x [{}, {}] through GELU",
                       dtype_name(key.dtype), key.n, key.k, key.k, key.m);
  }
  return fmt::format("a {} linear layer's weight gradient [{}, {}]^T x [{}, {}] into {}{}",
                     dtype_name(key.dtype), key.k, key.n, key.k, key.m, dtype_name(key.out_dtype),
                     key.bias ? " with its bias gradient" : "");
}

// What runs instead when an entry cannot, for the warning.
const char* fallback_text(const Key& key) {
  switch (key.kind) {
    case Kind::forward:
      return key.bias ? "it runs as cublasGemmEx and a bias kernel" : "it runs as cublasGemmEx";
    case Kind::weight_grad:
      return "it runs as cublasGemmEx and a column sum for the bias gradient";
    case Kind::forward_gelu:
    case Kind::input_grad_dgelu:
      return "the matmul and the GELU kernel run apart";
  }
  return "";
}

// Builds the descriptors of `plan` and asks the heuristic for an algorithm.
// vector: the call's bias (or bias gradient) pointer, or null: the heuristic reads its
// alignment (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER), and every later call of
// this entry has one of the same alignment (Key::align_bias).
std::unique_ptr<Entry> make_entry(cublasLtHandle_t handle, const lt_plan::Plan& plan,
                                  const Key& key, const void* vector, const void* aux) {
  const cuda_api::CublasLtLibrary& lt = *library();
  auto e = std::make_unique<Entry>();
  const cudaDataType_t type = lt_type(key.dtype), out_type = lt_type(key.out_dtype);
  check(lt.desc_create(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = plan.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = plan.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a, "set TRANSA");
  set_desc(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b, "set TRANSB");
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  switch (key.kind) {
    case Kind::forward:
      if (key.bias) epilogue = CUBLASLT_EPILOGUE_BIAS;
      break;
    case Kind::weight_grad:
      if (key.bias) epilogue = CUBLASLT_EPILOGUE_BGRADB;
      break;
    case Kind::forward_gelu:
      epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
      break;
    case Kind::input_grad_dgelu:
      epilogue = CUBLASLT_EPILOGUE_DGELU;
      break;
  }
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, "set EPILOGUE");
  }
  if (key.bias) {
    const int32_t bias_type = out_type;  // the output's type (cublasLt.h)
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, "set BIAS_DATA_TYPE");
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, vector, "set BIAS_POINTER");
  }
  if (plan.gelu || plan.dgelu) {  // Note [gelu epilogues]: pre, laid out as D
    // Its type is left at the default, D's (cublasLt.h: setting an unsupported one makes
    // cublasLtMatmul fail, not the heuristic).
    const int64_t aux_ld = plan.aux.ld;
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux, "set EPILOGUE_AUX_POINTER");
    set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld, "set EPILOGUE_AUX_LD");
  }
  const auto layout = [&](cublasLtMatrixLayout_t* l, cudaDataType_t t, const lt_plan::Layout& s) {
    check(
        lt.layout_create(l, t, static_cast<uint64_t>(s.rows), static_cast<uint64_t>(s.cols), s.ld),
        "cublasLtMatrixLayoutCreate");
  };
  layout(&e->a, type, plan.a);
  layout(&e->b, type, plan.b);
  layout(&e->d, out_type, plan.d);
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
        "cuBLASLt has no algorithm for {} (alignments A {}, B {}, D {} bytes; heuristic: {}, {} "
        "found): {}",
        describe(key), key.align_a, key.align_b, key.align_d, lt.status_name(status), found,
        fallback_text(key));
  }
  return e;
}

uintptr_t address(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr());
}

// Runs `plan` (cuBLASLt's A = a, B = b, D = out, the epilogue's vector `vector` when
// it is defined) on out's device and stream; false when cuBLASLt is missing or has no
// algorithm for the key.
bool run(const lt_plan::Plan& plan, Kind kind, const Tensor& a, const Tensor& b, Tensor& out,
         const Tensor& vector, const Tensor& aux = Tensor()) {
  const cuda_api::CublasLtLibrary* lt = library();
  if (lt == nullptr) return false;
  const int device = out.device().index;
  cuda_api::DeviceGuard guard(device);
  thread_local std::unordered_map<int, LtHandle> handles;
  thread_local std::unordered_map<Key, std::unique_ptr<Entry>, KeyHash> entries;
  auto h = handles.find(device);
  if (h == handles.end()) h = handles.try_emplace(device, device).first;
  Key key{};
  key.kind = kind;
  key.dtype = a.dtype();
  key.out_dtype = out.dtype();
  key.device = device;
  key.m = plan.m;
  key.n = plan.n;
  key.k = plan.k;
  key.bias = vector.defined();
  key.align_a = lt_plan::alignment_of(address(a));
  key.align_b = lt_plan::alignment_of(address(b));
  key.align_d = lt_plan::alignment_of(address(out));
  key.align_bias = vector.defined() ? lt_plan::alignment_of(address(vector)) : 0;
  key.align_aux = aux.defined() ? lt_plan::alignment_of(address(aux)) : 0;
  const void* vector_ptr = vector.defined() ? vector.data_ptr() : nullptr;
  const void* aux_ptr = aux.defined() ? aux.data_ptr() : nullptr;
  auto it = entries.find(key);
  if (it == entries.end()) {
    it = entries.emplace(key, make_entry(h->second.get(), plan, key, vector_ptr, aux_ptr)).first;
  }
  Entry& e = *it->second;
  if (!e.usable) return false;
  if (vector.defined()) {
    set_desc(e.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, vector_ptr, "set BIAS_POINTER");
  }
  if (aux.defined()) {
    set_desc(e.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux_ptr,
             "set EPILOGUE_AUX_POINTER");
  }
  const auto stream = static_cast<cudaStream_t>(current_stream(out.device()).handle());
  const Tensor workspace = e.workspace > 0 ? empty({static_cast<int64_t>(e.workspace)},
                                                   {.dtype = DType::u8, .device = out.device()})
                                           : Tensor();
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t status =
      lt->matmul(h->second.get(), e.desc, &alpha, a.data_ptr(), e.a, b.data_ptr(), e.b, &beta,
                 out.data_ptr(), e.d, out.data_ptr(), e.d, &e.algo,
                 workspace.defined() ? workspace.data_ptr() : nullptr, e.workspace, stream);
  if (status != CUBLAS_STATUS_SUCCESS && !e.ran) {
    // The heuristic's algorithm refused at its first call (an epilogue it does not run
    // with these types): fall back for good, as for no algorithm, rather than fail.
    e.usable = false;
    DDP_LOG_WARN("cuBLASLt refused {} at its first call ({}): {}", describe(key),
                 lt->status_name(status), fallback_text(key));
    return false;
  }
  check(status, "cublasLtMatmul");
  e.ran = true;
  return true;
}

}  // namespace

bool linear_lt(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out) {
  if (x.size(0) == 0 || x.size(1) == 0 || weight.size(0) == 0) return false;  // no layouts
  if (bias.defined() && bias.dtype() != out.dtype()) return false;            // the epilogue's rule
  if (bias.defined() && address(bias) % 16 != 0) return false;
  const lt_plan::Plan plan =
      lt_plan::linear_plan(x.size(0), x.size(1), weight.size(0), bias.defined());
  // cuBLASLt's A is the weight, its B the input (Note [cublasLt linear]).
  return run(plan, Kind::forward, weight, x, out, bias);
}

namespace {
bool env_flag(const char* name, bool fallback) {
  return env::get_int(name).value_or(fallback ? 1 : 0) != 0;
}
std::atomic<bool>& bias_grad_switch() {
  static std::atomic<bool> on{env_flag(env::kLtBiasGrad, true)};
  return on;
}
std::atomic<bool>& gelu_switch() {
  static std::atomic<bool> on{env_flag(env::kLtGelu, false)};
  return on;
}
}  // namespace

bool lt_bias_grad_enabled() {
  return bias_grad_switch().load(std::memory_order_relaxed);
}

void set_lt_bias_grad_enabled(bool enabled) {
  bias_grad_switch().store(enabled, std::memory_order_relaxed);
}

bool lt_gelu_enabled() {
  return gelu_switch().load(std::memory_order_relaxed);
}

void set_lt_gelu_enabled(bool enabled) {
  gelu_switch().store(enabled, std::memory_order_relaxed);
}

bool linear_gelu_lt(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
                    Tensor& pre) {
  if (x.size(0) == 0 || x.size(1) == 0 || weight.size(0) == 0) return false;  // no layouts
  if (weight.size(0) % 8 != 0) return false;                                  // pre's ld
  if (bias.dtype() != out.dtype() || address(bias) % 16 != 0) return false;
  DDP_ASSERT(pre.dtype() == out.dtype() && pre.shape() == out.shape(),
             "linear_gelu_lt: pre must be like out");
  const lt_plan::Plan plan = lt_plan::linear_gelu_plan(x.size(0), x.size(1), weight.size(0));
  return run(plan, Kind::forward_gelu, weight, x, out, bias, pre);
}

bool linear_input_grad_dgelu_lt(const Tensor& grad, const Tensor& weight, const Tensor& pre,
                                Tensor& grad_pre) {
  if (grad.size(0) == 0 || grad.size(1) == 0 || weight.size(1) == 0) return false;  // no layouts
  if (weight.size(1) % 8 != 0) return false;                                        // pre's ld
  DDP_ASSERT(pre.dtype() == grad_pre.dtype() && pre.shape() == grad_pre.shape() &&
                 grad.dtype() == pre.dtype(),
             "linear_input_grad_dgelu_lt: pre and grad_pre must be alike, of grad's dtype");
  const lt_plan::Plan plan =
      lt_plan::input_grad_dgelu_plan(grad.size(0), grad.size(1), weight.size(1));
  // cuBLASLt's A is the weight, its B the output's gradient (Note [gelu epilogues]).
  return run(plan, Kind::input_grad_dgelu, weight, grad, grad_pre, Tensor(), pre);
}

bool linear_weight_grad_lt(const Tensor& grad, const Tensor& x, Tensor& grad_weight,
                           Tensor& grad_bias) {
  if (grad.size(0) == 0 || grad.size(1) == 0 || x.size(1) == 0) return false;  // no layouts
  if (grad_bias.defined() && address(grad_bias) % 16 != 0) return false;
  if (!lt_bias_grad_enabled()) return false;
  // Only where both feature counts are multiples of 8 (every bf16 row 16-byte aligned:
  // a transformer's layers): BGRADB has made illegal accesses at an odd small output
  // (one feature, NVIDIA/apex#1392), and small layers gain nothing from it.
  if (grad.size(1) % 8 != 0 || x.size(1) % 8 != 0) return false;
  const lt_plan::Plan plan =
      lt_plan::weight_grad_plan(grad.size(0), x.size(1), grad.size(1), grad_bias.defined());
  // cuBLASLt's A is the input, its B the output's gradient (Note [weight gradient epilogue]).
  return run(plan, Kind::weight_grad, x, grad, grad_weight, grad_bias);
}

}  // namespace ddp::kernels::cuda
