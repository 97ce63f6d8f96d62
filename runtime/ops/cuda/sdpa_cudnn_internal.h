// The parts of sdpa_cudnn.cpp that need no GPU, for its unit test
// (tests/unit/sdpa_cudnn_test.cpp): a graph of sdpa_graph.h turned into cuDNN
// backend descriptors, every tensor and operation finalized, and the operation graph.
// Without a device cuDNN checks little at that point: each attribute's type and
// count, and a matmul's shapes (not the data types, the mask or the strides of a
// reshape: the CPU interpreter in sdpa_graph_test checks those). Whether an engine
// takes the graph is known only on a GPU.
#pragma once

#include "runtime/cuda/cudnn_library.h"
#include "runtime/ops/cuda/sdpa_graph.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::kernels::cuda::sdpa_cudnn {

// A descriptor cuDNN refused: the call, the descriptor (an op's index and kind, or a
// tensor's name) and cuDNN's status and last error message.
struct GraphError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  Descriptor(const cuda_api::CudnnLibrary& lib, cudnnBackendDescriptorType_t type,
             const std::string& what);
  Descriptor(Descriptor&& o) noexcept : lib_(o.lib_), d_(o.d_) { o.d_ = nullptr; }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor& operator=(Descriptor&&) = delete;
  ~Descriptor();
  cudnnBackendDescriptor_t get() const { return d_; }
  // cudnnBackendSetAttribute; GraphError naming `what` when refused.
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
           const void* values, const std::string& what) const;
  void finalize(const std::string& what) const;

 private:
  const cuda_api::CudnnLibrary* lib_;
  cudnnBackendDescriptor_t d_ = nullptr;
};

// Every tensor and operation of `graph`, finalized in the graph's order.
class Operations {
 public:
  Operations(const cuda_api::CudnnLibrary& lib, const sdpa_graph::Graph& graph);
  // The operation descriptors, for CUDNN_ATTR_OPERATIONGRAPH_OPS.
  std::vector<cudnnBackendDescriptor_t> ops() const;

 private:
  std::vector<Descriptor> tensors_, attributes_, ops_;
};

// The operation graph of `operations`, finalized. handle may be null: cuDNN 9.8 and
// later finalize a graph without one, which is how the unit test checks the graphs'
// structure without a GPU.
Descriptor operation_graph(const cuda_api::CudnnLibrary& lib, const Operations& operations,
                           cudnnHandle_t handle);

// Whether a finalized engine carries CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC (false when
// cuDNN does not say): the plans skip those (Note [cudnn attention plans]).
bool nondeterministic_engine(const cuda_api::CudnnLibrary& lib, cudnnBackendDescriptor_t engine);

}  // namespace ddp::kernels::cuda::sdpa_cudnn
