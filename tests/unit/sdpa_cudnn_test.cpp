// The fused attention's graphs as cuDNN descriptors (runtime/ops/cuda/sdpa_cudnn.cpp,
// Note [cudnn attention plans]), built with the cuDNN this machine has. Without a GPU
// cuDNN checks each attribute's type and count and a matmul's shapes as it finalizes
// the descriptors and (9.8 and later) the operation graph; it accepts wrong data types
// or a reversed mask there (the CPU interpreter in sdpa_graph_test checks those). The
// engine and the plan need a device (cuDNN compiles the fused kernels for it): the
// gpu tests run those.
// Compiled where the build found cuDNN's headers (DDP_TEST_CUDNN); the CUDA toolkit on
// our machines brings the library too.
#if DDP_TEST_CUDNN

#include "runtime/ops/cuda/sdpa_cudnn_internal.h"

#include <gtest/gtest.h>

#include <string>

namespace ddp::kernels::cuda::sdpa_cudnn {
namespace {

namespace graph = sdpa_graph;

const cuda_api::CudnnLibrary& library() {
  std::string why;
  const cuda_api::CudnnLibrary* lib = cuda_api::try_cudnn(&why);
  if (lib == nullptr) throw std::runtime_error(why);
  return *lib;
}

TEST(SdpaCudnn, LibraryIsTheMajorVersionOfTheHeaders) {
  const cuda_api::CudnnLibrary& lib = library();
  EXPECT_EQ(lib.version / 10000, static_cast<size_t>(CUDNN_MAJOR)) << lib.path;
  EXPECT_FALSE(lib.path.empty());
}

// GPT-2's attention (12 heads of 64, T 1024) and a small odd one, bf16 and f16.
TEST(SdpaCudnn, EveryTensorAndOperationOfBothGraphsFinalizes) {
  const cuda_api::CudnnLibrary& lib = library();
  for (const graph::Geometry& g :
       {graph::Geometry{16, 1024, 12, 64}, graph::Geometry{3, 7, 2, 8}}) {
    for (graph::Type io : {graph::Type::bf16, graph::Type::f16}) {
      SCOPED_TRACE(::testing::Message() << "B " << g.batch << ", T " << g.t << ", H " << g.heads
                                        << ", D " << g.d << ", type " << static_cast<int>(io));
      const graph::Graph fwd = graph::forward_graph(g, io);
      const graph::Graph bwd = graph::backward_graph(g, io);
      try {
        const Operations f(lib, fwd);
        EXPECT_EQ(f.ops().size(), fwd.ops.size());
        const Operations b(lib, bwd);
        EXPECT_EQ(b.ops().size(), bwd.ops.size());
        // The whole graph too (cuDNN 9.8+ needs no handle for it).
        if (lib.version >= 90800) {
          (void)operation_graph(lib, f, nullptr);
          (void)operation_graph(lib, b, nullptr);
        }
      } catch (const GraphError& e) {
        ADD_FAILURE() << e.what();
      }
    }
  }
}

// cuDNN does check at finalize: a matmul whose operands do not multiply is refused,
// and the error names the operation.
TEST(SdpaCudnn, AMatmulThatDoesNotMultiplyIsRefusedNamingTheOp) {
  const graph::Geometry g{2, 8, 2, 16};
  graph::Graph bad = graph::forward_graph(g, graph::Type::bf16);
  for (graph::TensorSpec& t : bad.tensors) {
    if (t.uid == graph::kK) t.dims = {g.batch, g.heads, g.d / 2, g.t};  // k^T's D halved
  }
  try {
    const Operations ops(library(), bad);
    FAIL() << "cuDNN accepted q [.., T, 16] times k^T [.., 8, T]";
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("op 0 (matmul"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddp::kernels::cuda::sdpa_cudnn

#endif  // DDP_TEST_CUDNN
