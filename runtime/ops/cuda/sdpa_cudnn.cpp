// cuDNN's fused causal attention (sdpa_cudnn.h; the graphs and their CPU replay in
// sdpa_graph.h, Note [cudnn attention graphs]) through cuDNN's backend API.
//
// Note [cudnn attention plans]: a graph becomes backend descriptors (its tensors and
// operations, then the operation graph), cuDNN's heuristic (mode A) lists engine
// configurations for it, and the first one that is deterministic and finalizes into
// an execution plan is kept. Building a plan compiles kernels (slow: warm up before
// timing), so plans are cached per thread with the cuDNN handle, keyed by device,
// direction, shape and dtype; a shape cuDNN cannot run is remembered too, with its
// reason, and falls back every time without asking again. Each call binds the
// tensors' addresses in a variant pack, with a workspace from the caching allocator
// on the call's stream.
#include "runtime/ops/cuda/sdpa_cudnn.h"

#include "runtime/cuda/cuda_api.h"
#include "runtime/error.h"
#include "runtime/ops/cuda/sdpa_cudnn_internal.h"
#include "runtime/stream.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

namespace ddp::kernels::cuda {
namespace sdpa_cudnn {

namespace {

std::string status_text(const cuda_api::CudnnLibrary& lib, cudnnStatus_t status) {
  char last[1024] = {0};
  lib.last_error_string(last, sizeof(last));
  std::string text = fmt::format("{} ({})", lib.error_string(status), static_cast<int>(status));
  if (last[0] != '\0') text += fmt::format(": {}", last);
  return text;
}

cudnnDataType_t data_type(sdpa_graph::Type type) {
  switch (type) {
    case sdpa_graph::Type::f32:
      return CUDNN_DATA_FLOAT;
    case sdpa_graph::Type::bf16:
      return CUDNN_DATA_BFLOAT16;
    case sdpa_graph::Type::f16:
      return CUDNN_DATA_HALF;
    case sdpa_graph::Type::i32:
      return CUDNN_DATA_INT32;
    case sdpa_graph::Type::boolean:
      return CUDNN_DATA_BOOLEAN;
  }
  return CUDNN_DATA_FLOAT;
}

cudnnPointwiseMode_t pointwise_mode(sdpa_graph::Mode mode) {
  using sdpa_graph::Mode;
  switch (mode) {
    case Mode::mul:
      return CUDNN_POINTWISE_MUL;
    case Mode::add:
      return CUDNN_POINTWISE_ADD;
    case Mode::sub:
      return CUDNN_POINTWISE_SUB;
    case Mode::div:
      return CUDNN_POINTWISE_DIV;
    case Mode::exp:
      return CUDNN_POINTWISE_EXP;
    case Mode::log:
      return CUDNN_POINTWISE_LOG;
    case Mode::identity:
      return CUDNN_POINTWISE_IDENTITY;
    case Mode::gen_index:
      return CUDNN_POINTWISE_GEN_INDEX;
    case Mode::cmp_ge:
      return CUDNN_POINTWISE_CMP_GE;
    case Mode::binary_select:
      return CUDNN_POINTWISE_BINARY_SELECT;
    default:
      throw GraphError(
          fmt::format("sdpa graph: mode {} is not a pointwise mode", static_cast<int>(mode)));
  }
}

const char* kind_name(sdpa_graph::OpKind kind) {
  switch (kind) {
    case sdpa_graph::OpKind::matmul:
      return "matmul";
    case sdpa_graph::OpKind::pointwise:
      return "pointwise";
    case sdpa_graph::OpKind::reduction:
      return "reduction";
    case sdpa_graph::OpKind::reshape:
      return "reshape";
  }
  return "?";
}

}  // namespace

Descriptor::Descriptor(const cuda_api::CudnnLibrary& lib, cudnnBackendDescriptorType_t type,
                       const std::string& what)
    : lib_(&lib) {
  const cudnnStatus_t status = lib.create_descriptor(type, &d_);
  if (status != CUDNN_STATUS_SUCCESS) {
    d_ = nullptr;
    throw GraphError(fmt::format("cudnnBackendCreateDescriptor for {} failed: {}", what,
                                 status_text(lib, status)));
  }
}

Descriptor::~Descriptor() {
  if (d_ != nullptr) (void)lib_->destroy_descriptor(d_);
}

void Descriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                     int64_t count, const void* values, const std::string& what) const {
  const cudnnStatus_t status = lib_->set_attribute(d_, name, type, count, values);
  if (status != CUDNN_STATUS_SUCCESS) {
    throw GraphError(fmt::format("cudnnBackendSetAttribute({}, attribute {}) failed: {}", what,
                                 static_cast<int>(name), status_text(*lib_, status)));
  }
}

void Descriptor::finalize(const std::string& what) const {
  const cudnnStatus_t status = lib_->finalize(d_);
  if (status != CUDNN_STATUS_SUCCESS) {
    throw GraphError(
        fmt::format("cudnnBackendFinalize({}) failed: {}", what, status_text(*lib_, status)));
  }
}

Operations::Operations(const cuda_api::CudnnLibrary& lib, const sdpa_graph::Graph& graph) {
  std::unordered_map<int64_t, cudnnBackendDescriptor_t> by_uid;
  for (const sdpa_graph::TensorSpec& t : graph.tensors) {
    const std::string what = fmt::format("tensor '{}' (uid {})", t.name, t.uid);
    Descriptor& d = tensors_.emplace_back(lib, CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
    const cudnnDataType_t type = data_type(t.type);
    const int64_t alignment = 16;  // every address the caller binds is checked for it
    d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, what);
    d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, t.dims.data(), what);
    d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, t.strides.data(), what);
    d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t.uid, what);
    d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, what);
    if (t.is_virtual) {
      const bool yes = true;
      d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, what);
    }
    if (t.by_value) {
      const bool yes = true;
      d.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, what);
    }
    d.finalize(what);
    by_uid[t.uid] = d.get();
  }
  const auto tensor = [&](int64_t uid, const std::string& what) {
    const auto it = by_uid.find(uid);
    if (it == by_uid.end()) {
      throw GraphError(
          fmt::format("sdpa graph: {} names tensor uid {}, which it lacks", what, uid));
    }
    return it->second;
  };
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    const sdpa_graph::OpSpec& op = graph.ops[i];
    const std::string what =
        fmt::format("op {} ({}, writing '{}')", i, kind_name(op.kind), graph.tensor(op.y).name);
    const cudnnBackendDescriptor_t x = tensor(op.x, what), y = tensor(op.y, what);
    const cudnnDataType_t precision = data_type(op.precision);
    switch (op.kind) {
      case sdpa_graph::OpKind::matmul: {
        Descriptor& m = attributes_.emplace_back(lib, CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
        m.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &precision, what);
        m.finalize(what);
        const cudnnBackendDescriptor_t mdesc = m.get(), b = tensor(op.b, what);
        Descriptor& d = ops_.emplace_back(lib, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
        d.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
        d.set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what);
        d.set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
        d.set(CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mdesc, what);
        d.finalize(what);
        break;
      }
      case sdpa_graph::OpKind::pointwise: {
        Descriptor& p = attributes_.emplace_back(lib, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
        const cudnnPointwiseMode_t mode = pointwise_mode(op.mode);
        p.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
        p.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision, what);
        if (op.mode == sdpa_graph::Mode::gen_index) {
          p.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &op.axis, what);
        }
        p.finalize(what);
        const cudnnBackendDescriptor_t pdesc = p.get();
        Descriptor& d = ops_.emplace_back(lib, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
        d.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
              &pdesc, what);
        d.set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
        if (op.b != 0) {
          const cudnnBackendDescriptor_t b = tensor(op.b, what);
          d.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, what);
        }
        if (op.t != 0) {
          const cudnnBackendDescriptor_t t = tensor(op.t, what);
          d.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, what);
        }
        d.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
        const float one = 1.0f;
        d.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, what);
        d.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, what);
        d.finalize(what);
        break;
      }
      case sdpa_graph::OpKind::reduction: {
        Descriptor& r = attributes_.emplace_back(lib, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
        const cudnnReduceTensorOp_t reduce = op.mode == sdpa_graph::Mode::reduce_max
                                                 ? CUDNN_REDUCE_TENSOR_MAX
                                                 : CUDNN_REDUCE_TENSOR_ADD;
        r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce, what);
        r.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &precision, what);
// The enumerator exists in cudnn_graph.h from 9.11 on: a build against older headers
// leaves the attribute at its default on any library.
#if CUDNN_VERSION >= 91100
        if (lib.version >= 91100) {  // as cuDNN's frontend sets it from 9.11 on
          const bool deterministic = false;
          r.set(CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic, what);
        }
#endif
        r.finalize(what);
        const cudnnBackendDescriptor_t rdesc = r.get();
        Descriptor& d = ops_.emplace_back(lib, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
        d.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
        d.set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
        d.set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rdesc, what);
        d.finalize(what);
        break;
      }
      case sdpa_graph::OpKind::reshape: {
        Descriptor& d = ops_.emplace_back(lib, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what);
        d.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
        d.set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
        d.finalize(what);
        break;
      }
    }
  }
}

std::vector<cudnnBackendDescriptor_t> Operations::ops() const {
  std::vector<cudnnBackendDescriptor_t> out;
  out.reserve(ops_.size());
  for (const Descriptor& d : ops_) out.push_back(d.get());
  return out;
}

bool nondeterministic_engine(const cuda_api::CudnnLibrary& lib, cudnnBackendDescriptor_t engine) {
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t count = 0;
  if (lib.get_attribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                        CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, notes) != CUDNN_STATUS_SUCCESS) {
    return false;
  }
  count = std::min<int64_t>(count, CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  return std::find(notes, notes + count, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) != notes + count;
}

Descriptor operation_graph(const cuda_api::CudnnLibrary& lib, const Operations& operations,
                           cudnnHandle_t handle) {
  const std::vector<cudnnBackendDescriptor_t> ops = operations.ops();
  Descriptor graph(lib, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
            static_cast<int64_t>(ops.size()), ops.data(), "operation graph");
  if (handle != nullptr) {
    // Required before 9.8; deprecated but accepted since, and still set by cuDNN's
    // frontend whenever it has one: the device the heuristic and the plans target.
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "operation graph");
  }
  graph.finalize("operation graph");
  return graph;
}

}  // namespace sdpa_cudnn

namespace {

using sdpa_cudnn::Descriptor;
using sdpa_cudnn::GraphError;
namespace graph = sdpa_graph;

// One cuDNN handle per (thread, device), like the cuBLAS handle.
class Handle {
 public:
  Handle(const cuda_api::CudnnLibrary& lib, int device) : lib_(&lib) {
    cuda_api::DeviceGuard guard(device);
    const cudnnStatus_t status = lib.create(&handle_);
    if (status != CUDNN_STATUS_SUCCESS) {
      handle_ = nullptr;
      throw GraphError(fmt::format("cudnnCreate on cuda:{} failed: {}", device,
                                   sdpa_cudnn::status_text(lib, status)));
    }
  }
  ~Handle() {
    if (handle_ != nullptr) (void)lib_->destroy(handle_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  cudnnHandle_t get() const { return handle_; }

 private:
  const cuda_api::CudnnLibrary* lib_;
  cudnnHandle_t handle_ = nullptr;
};

// A graph's execution plan, or why there is none.
struct Plan {
  graph::Graph spec;
  std::unique_ptr<sdpa_cudnn::Operations> operations;
  // Destroyed in reverse: the plan before the engine configuration it was built from,
  // that before the operation graph.
  std::unique_ptr<Descriptor> op_graph, config, plan;
  int64_t workspace = 0;
  std::string why;  // set when unusable
  bool usable() const { return plan != nullptr; }
};

// Whether an engine configuration's engine carries CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC.
bool nondeterministic(const cuda_api::CudnnLibrary& lib, cudnnBackendDescriptor_t config) {
  Descriptor engine(lib, CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
  cudnnBackendDescriptor_t e = engine.get();
  int64_t count = 0;
  if (lib.get_attribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                        &count, &e) != CUDNN_STATUS_SUCCESS) {
    return false;  // unknown: cuDNN's own order decides
  }
  return sdpa_cudnn::nondeterministic_engine(lib, e);
}

// Note [cudnn attention plans]: the operation graph, the heuristic's configurations
// in order, the first deterministic one that finalizes.
void make_plan(const cuda_api::CudnnLibrary& lib, cudnnHandle_t handle, Plan& p) {
  p.operations = std::make_unique<sdpa_cudnn::Operations>(lib, p.spec);
  p.op_graph =
      std::make_unique<Descriptor>(sdpa_cudnn::operation_graph(lib, *p.operations, handle));
  Descriptor heuristics(lib, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
  const cudnnBackendDescriptor_t og = p.op_graph->get();
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og,
                 "engine heuristics");
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "engine heuristics");
  heuristics.finalize("engine heuristics");
  int64_t count = 0;
  cudnnStatus_t status = lib.get_attribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
  if (status != CUDNN_STATUS_SUCCESS || count <= 0) {
    p.why = status != CUDNN_STATUS_SUCCESS
                ? fmt::format("cuDNN's heuristic failed: {}", sdpa_cudnn::status_text(lib, status))
                : "cuDNN has no engine for the graph";
    return;
  }
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    raw.push_back(
        configs.emplace_back(lib, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config").get());
  }
  status = lib.get_attribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                             CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, raw.data());
  if (status != CUDNN_STATUS_SUCCESS) {
    p.why =
        fmt::format("cuDNN's heuristic results failed: {}", sdpa_cudnn::status_text(lib, status));
    return;
  }
  count = std::min(count, static_cast<int64_t>(raw.size()));  // never past the descriptors made
  std::string refusals;
  for (int64_t i = 0; i < count; ++i) {
    if (nondeterministic(lib, raw[i])) {
      refusals += fmt::format("; config {} is nondeterministic", i);
      continue;
    }
    try {
      auto plan = std::make_unique<Descriptor>(lib, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                                               "execution plan");
      // Required before 9.8; deprecated but accepted since: set as the graph's is.
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "execution plan");
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw[i],
                "execution plan");
      plan->finalize("execution plan");
      int64_t workspace = 0, n = 0;
      status = lib.get_attribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                 CUDNN_TYPE_INT64, 1, &n, &workspace);
      if (status != CUDNN_STATUS_SUCCESS) {
        throw GraphError(fmt::format("reading the plan's workspace size failed: {}",
                                     sdpa_cudnn::status_text(lib, status)));
      }
      p.workspace = workspace;
      p.config = std::make_unique<Descriptor>(std::move(configs[static_cast<size_t>(i)]));
      p.plan = std::move(plan);
      return;
    } catch (const GraphError& e) {
      refusals += fmt::format("; config {}: {}", i, e.what());
    }
  }
  p.why = fmt::format("none of cuDNN's {} engine configurations could be used{}", count, refusals);
}

enum class Direction : uint8_t { forward, backward };

struct SdpaKey {
  int device;
  Direction direction;
  int64_t batch, t, heads, d;
  DType dtype;
  bool operator==(const SdpaKey& o) const {
    return std::tie(device, direction, batch, t, heads, d, dtype) ==
           std::tie(o.device, o.direction, o.batch, o.t, o.heads, o.d, o.dtype);
  }
};
struct SdpaKeyHash {
  size_t operator()(const SdpaKey& k) const {
    size_t h = std::hash<int64_t>()(k.batch);
    for (int64_t v : {k.t, k.heads, k.d, static_cast<int64_t>(k.dtype),
                      static_cast<int64_t>(k.direction), static_cast<int64_t>(k.device)}) {
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    }
    return h;
  }
};

// Why the fused attention cannot run on `device` at all, or "": the library and the
// GPU, asked once per device.
std::string unsupported_device(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, std::string> reasons;
  const std::lock_guard lock(mutex);
  const auto it = reasons.find(device);
  if (it != reasons.end()) return it->second;
  std::string why;
  const cuda_api::CudnnLibrary* lib = cuda_api::try_cudnn(&why);
  if (lib != nullptr && lib->version < 91002) {
    // Older ones fill the mask with the lowest float instead of -inf, and 9.10.0 and
    // 9.10.1 have known fused-attention bugs for 16-bit inputs.
    why = fmt::format("{} is cuDNN {}; ddp's fused attention graphs need 9.10.2 or newer",
                      lib->path, lib->version_text());
  } else if (lib != nullptr) {
    const cuda_api::Properties props = cuda_api::properties(device);
    if (props.major < 8) {
      why = fmt::format("{} has compute capability {}.{}; the fused attention needs 8.0 or newer",
                        props.name, props.major, props.minor);
    } else if (props.major >= 10) {
      // cuDNN's frontend pins a deterministic backward engine and its knobs there;
      // the heuristic's choice may not be deterministic.
      why = fmt::format(
          "{} has compute capability {}.{}: a deterministic fused backward there "
          "needs engine pinning ddp does not do yet",
          props.name, props.major, props.minor);
    }
  }
  return reasons[device] = why;
}

// Why the fused attention cannot take these tensors, or "" (before any plan is built):
// the device, the head size, the sequence, the addresses.
std::string unsupported(const Tensor& qkv, int64_t heads,
                        std::initializer_list<const Tensor*> bound) {
  const int64_t c = qkv.size(2) / 3, d = c / heads, t = qkv.size(1);
  if (d % 8 != 0 || d > 128) {
    return fmt::format(
        "head size {} (C {} / {} heads): ddp's fused attention takes a multiple "
        "of 8 up to 128 (cuDNN's limit on sm_80; 256 on sm_90)",
        d, c, heads);
  }
  if (t < 2) return "a sequence of one token (cuDNN's backward needs at least two)";
  for (const Tensor* bound_tensor : bound) {
    if (reinterpret_cast<uintptr_t>(bound_tensor->data_ptr()) % 16 != 0) {
      return "a tensor not 16-byte aligned (a view into the middle of a buffer)";
    }
  }
  std::string why = unsupported_device(qkv.device().index);
  if (why.empty() && t % 128 != 0 && cuda_api::cudnn().version < 91600) {
    // Before 9.16 cuDNN's backward needs a padding mask there (its frontend adds one).
    why = fmt::format("T {} is not a multiple of 128, which cuDNN before 9.16 needs (this is {})",
                      t, cuda_api::cudnn().version_text());
  }
  return why;
}

graph::Geometry geometry(const Tensor& qkv, int64_t heads) {
  return {qkv.size(0), qkv.size(1), heads, qkv.size(2) / 3 / heads};
}

graph::Type io_type(DType dtype) {
  return dtype == DType::bf16 ? graph::Type::bf16 : graph::Type::f16;
}

// The cached plan for (device, direction, shape, dtype) on this thread, built on
// first use; nullptr with *why set when the graph cannot run.
struct Context {
  const cuda_api::CudnnLibrary* lib = nullptr;
  cudnnHandle_t handle = nullptr;
  Plan* plan = nullptr;
};
Context plan_for(const Tensor& qkv, int64_t heads, Direction direction, std::string* why) {
  const cuda_api::CudnnLibrary& lib = cuda_api::cudnn();
  const int device = qkv.device().index;
  const graph::Geometry g = geometry(qkv, heads);
  thread_local std::unordered_map<int, std::unique_ptr<Handle>> handles;
  thread_local std::unordered_map<int, std::string> handle_errors;  // asked once
  thread_local std::unordered_map<SdpaKey, std::unique_ptr<Plan>, SdpaKeyHash> plans;
  if (const auto failed = handle_errors.find(device); failed != handle_errors.end()) {
    *why = failed->second;
    return {&lib, nullptr, nullptr};
  }
  auto h = handles.find(device);
  if (h == handles.end()) {
    try {
      h = handles.emplace(device, std::make_unique<Handle>(lib, device)).first;
    } catch (const GraphError& e) {
      *why = handle_errors[device] = e.what();
      return {&lib, nullptr, nullptr};
    }
  }
  const SdpaKey key{device, direction, g.batch, g.t, g.heads, g.d, qkv.dtype()};
  auto it = plans.find(key);
  if (it == plans.end()) {
    auto p = std::make_unique<Plan>();
    p->spec = direction == Direction::forward ? graph::forward_graph(g, io_type(qkv.dtype()))
                                              : graph::backward_graph(g, io_type(qkv.dtype()));
    try {
      make_plan(lib, h->second->get(), *p);
    } catch (const GraphError& e) {
      p->why = e.what();
    }
    if (!p->usable()) {
      p->why = fmt::format(
          "cuDNN cannot run the {} attention graph for {} qkv [{}, {}, {}] with "
          "{} heads: {}",
          direction == Direction::forward ? "forward" : "backward", dtype_name(qkv.dtype()),
          g.batch, g.t, 3 * g.c(), heads, p->why);
    }
    it = plans.emplace(key, std::move(p)).first;
  }
  if (!it->second->usable()) {
    *why = it->second->why;
    return {&lib, h->second->get(), nullptr};
  }
  return {&lib, h->second->get(), it->second.get()};
}

// Binds each of the plan's bound tensors (base + its offset, or the scalar's value)
// and runs it on the current stream of `on`.
void execute(const Context& ctx, const Tensor& on,
             const std::unordered_map<int64_t, const void*>& bases, const graph::Geometry& g) {
  const cuda_api::CudnnLibrary& lib = *ctx.lib;
  const Plan& p = *ctx.plan;
  std::vector<int64_t> uids;
  std::vector<void*> pointers;
  for (const graph::TensorSpec& t : p.spec.tensors) {
    if (t.is_virtual) continue;
    uids.push_back(t.uid);
    if (t.by_value) {
      pointers.push_back(const_cast<float*>(&t.value));  // a host pointer, read at execute
      continue;
    }
    const auto base = bases.find(t.uid);
    DDP_ASSERT(base != bases.end(), "fused attention: no address bound for '{}'", t.name);
    const size_t element = t.type == graph::Type::f32 ? 4 : 2;
    pointers.push_back(const_cast<char*>(static_cast<const char*>(base->second)) +
                       graph::offset_in_buffer(t.uid, g) * static_cast<int64_t>(element));
  }
  const Tensor workspace = p.workspace > 0
                               ? empty({p.workspace}, {.dtype = DType::u8, .device = on.device()})
                               : Tensor();
  void* ws = workspace.defined() ? workspace.data_ptr() : nullptr;
  const auto stream = static_cast<cudaStream_t>(current_stream(on.device()).handle());
  cudnnStatus_t status = lib.set_stream(ctx.handle, stream);
  if (status != CUDNN_STATUS_SUCCESS) {
    throw CudaError(fmt::format("cudnnSetStream failed: {}", sdpa_cudnn::status_text(lib, status)));
  }
  try {
    Descriptor pack(lib, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
    pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws, "variant pack");
    pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
             static_cast<int64_t>(pointers.size()), pointers.data(), "variant pack");
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
             static_cast<int64_t>(uids.size()), uids.data(), "variant pack");
    pack.finalize("variant pack");
    status = lib.execute(ctx.handle, p.plan->get(), pack.get());
  } catch (const GraphError& e) {
    throw CudaError(fmt::format("fused attention: {}", e.what()));
  }
  if (status != CUDNN_STATUS_SUCCESS) {
    throw CudaError(fmt::format("cudnnBackendExecute (fused attention) failed: {}",
                                sdpa_cudnn::status_text(lib, status)));
  }
}

// The plan of `direction` for qkv, or none with *why (if given) set: the tensors'
// checks first, and for the forward the backward's plan too (a forward that ran
// fused while its backward cannot would pay for the packed forward again in the
// backward, so then neither runs fused).
Context usable_plan(const Tensor& qkv, int64_t heads, Direction direction,
                    std::initializer_list<const Tensor*> bound, std::string* why) {
  std::string reason = unsupported(qkv, heads, bound);
  Context ctx;
  if (reason.empty() && (direction == Direction::backward ||
                         plan_for(qkv, heads, Direction::backward, &reason).plan != nullptr)) {
    ctx = plan_for(qkv, heads, direction, &reason);
  }
  if (ctx.plan == nullptr && why != nullptr) *why = reason;
  return ctx;
}

}  // namespace

bool fused_attention_forward(const Tensor& qkv, int64_t heads, Tensor& y, Tensor& stats,
                             std::string* why) {
  cuda_api::DeviceGuard guard(qkv.device().index);
  const Context ctx = usable_plan(qkv, heads, Direction::forward, {&qkv, &y, &stats}, why);
  if (ctx.plan == nullptr) return false;
  execute(ctx, y,
          {{graph::kQ, qkv.data_ptr()},
           {graph::kK, qkv.data_ptr()},
           {graph::kV, qkv.data_ptr()},
           {graph::kO, y.data_ptr()},
           {graph::kStats, stats.data_ptr()}},
          geometry(qkv, heads));
  return true;
}

bool fused_attention_backward(const Tensor& grad_y, const Tensor& qkv, const Tensor& y,
                              const Tensor& stats, int64_t heads, Tensor& grad_qkv,
                              std::string* why) {
  cuda_api::DeviceGuard guard(qkv.device().index);
  const Context ctx =
      usable_plan(qkv, heads, Direction::backward, {&grad_y, &qkv, &y, &stats, &grad_qkv}, why);
  if (ctx.plan == nullptr) return false;
  const graph::Geometry g = geometry(qkv, heads);
  // rowsum(dO * O): a graph tensor the caller provides (f32 [B, H, T, 1]).
  const Tensor softmax_sum = empty({g.batch, g.heads, g.t, 1}, {.device = qkv.device()});
  execute(ctx, grad_qkv,
          {{graph::kQ, qkv.data_ptr()},
           {graph::kK, qkv.data_ptr()},
           {graph::kV, qkv.data_ptr()},
           {graph::kO, y.data_ptr()},
           {graph::kDO, grad_y.data_ptr()},
           {graph::kStats, stats.data_ptr()},
           {graph::kDQ, grad_qkv.data_ptr()},
           {graph::kDK, grad_qkv.data_ptr()},
           {graph::kDV, grad_qkv.data_ptr()},
           {graph::kSoftmaxSum, softmax_sum.data_ptr()}},
          g);
  return true;
}

}  // namespace ddp::kernels::cuda
