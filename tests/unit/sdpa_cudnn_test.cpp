// The fused attention's graphs as cuDNN descriptors (runtime/ops/cuda/sdpa_cudnn.cpp,
// Note [cudnn attention plans]), built with the cuDNN this machine has. Without a GPU
// cuDNN checks each attribute's type and count and a matmul's shapes as it finalizes
// the descriptors and (9.8 and later) the operation graph; it accepts wrong data types
// or a reversed mask there (the CPU interpreter in sdpa_graph_test checks those).
// Given a GPU's properties instead of the GPU, cuDNN also says which engines take the
// graphs (Note [deviceless engine check]); the plans need the device (cuDNN compiles
// the fused kernels for it and loads them through the driver): the gpu tests run those.
// Compiled where the build found cuDNN's headers (DDP_TEST_CUDNN); the CUDA toolkit on
// our machines brings the library too.
#if DDP_TEST_CUDNN

#include "runtime/ops/cuda/sdpa_cudnn_internal.h"

#include "runtime/fmt.h"

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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

// Note [deviceless engine check]: cuDNN 9.8 and later take a GPU's properties as JSON
// (a DEVICEPROP descriptor) in place of the GPU. An engine configuration finalized
// for that device checks whether its engine takes the graph's pattern, then compiles
// its kernels with NVRTC and loads them through the driver: with no driver that last
// part fails as CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING, which so
// means "this engine takes the graph" (a pattern it refuses is CUDNN_STATUS_NOT_SUPPORTED
// and its kin). On a machine with a driver the same configuration finalizes.
struct Profile {
  const char* name;
  int compute_capability;  // 900 for sm_90
  int sms;
  int64_t shared_memory_optin, l2_bytes, memory_bytes;
  int sm_khz, memory_khz;
};
constexpr Profile kH100{
    "NVIDIA H100 80GB HBM3", 900, 132, 232448, 52428800, 85520809984, 1980000, 2619000};
constexpr Profile kA100{
    "NVIDIA A100-SXM4-80GB", 800, 108, 166912, 41943040, 85899345920, 1410000, 1593000};

// The profile as cuDNN 9.19 reads it (every key is required).
std::string device_json(const Profile& p) {
  return fmt::format(
      R"({{"deviceName":"{}","deviceVer":{},"multiProcessorCount":{},)"
      R"("maxSharedMemoryPerBlockOptin":{},"l2CacheSize":{},"totalGlobalMem":{},)"
      R"("smClockRateKHz":{},"memClockRateKHz":{},"maxGridSize":[2147483647,65535,65535],)"
      R"("maxBlockSize":[1024,1024,64],"regsPerBlock":65536,"warpSize":32,)"
      R"("maxSharedMemoryPerBlock":49152,"reservedSharedMemoryPerBlock":1024,)"
      R"("maxRegistersPerSM":65536,"maxCtasPerSM":32,"maxThreadsPerBlock":1024,)"
      R"("maxThreadsPerSM":2048,"pciDeviceId":0,"isTccDriver":0,"supportCoopLaunch":1,)"
      R"("cudaDeviceId":0,"driverVer":13000}})",
      p.name, p.compute_capability, p.sms, p.shared_memory_optin, p.l2_bytes, p.memory_bytes,
      p.sm_khz, p.memory_khz);
}

struct KnobRange {
  int64_t low = 0, high = -1, stride = 1;  // high < low: the engine has no such knob
};

// The range of `engine`'s kernel-configuration knob.
KnobRange kernel_configs(const cuda_api::CudnnLibrary& lib, const Descriptor& engine) {
  std::vector<Descriptor> infos;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int i = 0; i < CUDNN_KNOB_TYPE_COUNTS; ++i) {
    raw.push_back(infos.emplace_back(lib, CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR, "knob").get());
  }
  int64_t knobs = 0, n = 0;
  EXPECT_EQ(
      lib.get_attribute(engine.get(), CUDNN_ATTR_ENGINE_KNOB_INFO, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                        static_cast<int64_t>(raw.size()), &knobs, raw.data()),
      CUDNN_STATUS_SUCCESS);
  KnobRange r;
  for (int64_t i = 0; i < std::min<int64_t>(knobs, static_cast<int64_t>(raw.size())); ++i) {
    cudnnBackendKnobType_t type{};
    EXPECT_EQ(
        lib.get_attribute(raw[i], CUDNN_ATTR_KNOB_INFO_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &n, &type),
        CUDNN_STATUS_SUCCESS);
    if (type != CUDNN_KNOB_TYPE_KERNEL_CFG) continue;
    for (auto [attribute, value] : {std::pair{CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE, &r.low},
                                    std::pair{CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE, &r.high},
                                    std::pair{CUDNN_ATTR_KNOB_INFO_STRIDE, &r.stride}}) {
      EXPECT_EQ(lib.get_attribute(raw[i], attribute, CUDNN_TYPE_INT64, 1, &n, value),
                CUDNN_STATUS_SUCCESS);
    }
  }
  return r;
}

// Whether one configuration of `engine` (its knob at `value`, if it has one) gets past
// the pattern check (Note [deviceless engine check]).
bool configuration_takes(const cuda_api::CudnnLibrary& lib, const Descriptor& engine, bool has_knob,
                         int64_t value) {
  const Descriptor config(lib, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
  const cudnnBackendDescriptor_t e = engine.get();
  config.set(CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e, "config");
  const Descriptor choice(lib, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, "knob choice");
  if (has_knob) {
    const cudnnBackendKnobType_t type = CUDNN_KNOB_TYPE_KERNEL_CFG;
    choice.set(CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &type, "knob");
    choice.set(CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &value, "knob");
    choice.finalize("knob choice");
    const cudnnBackendDescriptor_t c = choice.get();
    config.set(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "config");
  }
  const cudnnStatus_t status = lib.finalize(config.get());
  return status == CUDNN_STATUS_SUCCESS ||
         status == CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING;
}

// The global indices of the engines that take `graph` on `device` (Note [deviceless
// engine check]) and that the plans would not skip as nondeterministic: each engine
// with each value of its kernel-configuration knob until one configuration gets past
// the pattern check. A graph cuDNN refuses whole takes none.
std::vector<int64_t> engines_taking(const cuda_api::CudnnLibrary& lib, const graph::Graph& g,
                                    const Descriptor& device) {
  std::unique_ptr<Operations> ops;
  std::unique_ptr<Descriptor> op_graph;
  try {
    ops = std::make_unique<Operations>(lib, g);
    op_graph = std::make_unique<Descriptor>(operation_graph(lib, *ops, nullptr));
  } catch (const GraphError&) {
    return {};
  }
  int64_t n = 0, engines = 0;
  EXPECT_EQ(lib.get_attribute(op_graph->get(), CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT,
                              CUDNN_TYPE_INT64, 1, &n, &engines),
            CUDNN_STATUS_SUCCESS);
  std::vector<int64_t> taking;
  for (int64_t index = 0; index < engines; ++index) {
    const Descriptor engine(lib, CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
    const cudnnBackendDescriptor_t og = op_graph->get(), dp = device.get();
    engine.set(CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og, "engine");
    engine.set(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index, "engine");
    engine.set(CUDNN_ATTR_ENGINE_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &dp, "engine");
    if (lib.finalize(engine.get()) != CUDNN_STATUS_SUCCESS) continue;  // not for this graph
    if (nondeterministic_engine(lib, engine.get())) continue;
    const KnobRange r = kernel_configs(lib, engine);
    const bool has_knob = r.high >= r.low;
    for (int64_t value = has_knob ? r.low : 0; value <= (has_knob ? r.high : 0);
         value += std::max<int64_t>(r.stride, 1)) {
      if (configuration_takes(lib, engine, has_knob, value)) {
        taking.push_back(index);
        break;
      }
    }
  }
  return taking;
}

// Whether cuDNN's engines take our graphs on an H100 and an A100, without either GPU:
// at GPT-2's attention (T 1024, 12 heads of 64), gpt-mini's (T 256, 6 heads of 64) and
// an odd one (T 17, 2 heads of 16; from cuDNN 9.16, which the runtime needs for a T
// not a multiple of 128), bf16, both directions. With cuDNN 9.19 the forward goes to
// its fused flash-attention engines and the backward to its fused-attention backward
// engines (6 and 7 on the H100). A graph whose softmax lost its exp is taken by none:
// the check can fail. Only engines without a nondeterministic note count (the plans
// skip those): none of these carries one, so neither GPU's fused attention is refused
// for that. Where there is a driver cuDNN would compile and load every configuration
// it takes (minutes, and the A100's kernels do not load on another GPU): the gpu tests
// build the real plans there instead.
TEST(SdpaCudnn, CudnnsEnginesTakeBothGraphsOnAnH100AndAnA100WithoutTheGpu) {
  const cuda_api::CudnnLibrary& lib = library();
  if (lib.version < 91002) {
    GTEST_SKIP() << lib.path << " is cuDNN " << lib.version_text()
                 << ": the fused attention needs 9.10.2 or newer, and the runtime does not try "
                    "an older one";
  }
  if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY); driver != nullptr) {
    dlclose(driver);
    GTEST_SKIP() << "this machine has the CUDA driver: cuDNN would compile every "
                    "configuration it takes; the gpu tests build the real plans";
  }
  for (const Profile& profile : {kH100, kA100}) {
    const std::string json = device_json(profile);
    const Descriptor device(lib, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "device properties");
    device.set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
               static_cast<int64_t>(json.size()), json.data(), "device properties");
    if (lib.finalize(device.get()) != CUDNN_STATUS_SUCCESS) {
      GTEST_SKIP() << "cuDNN " << lib.version_text()
                   << " reads device properties with other keys than 9.19's";
    }
    for (const graph::Geometry& g :
         {graph::Geometry{16, 1024, 12, 64}, graph::Geometry{8, 256, 6, 64},
          graph::Geometry{3, 17, 2, 16}}) {
      if (g.t % 128 != 0 && lib.version < 91600) continue;  // the runtime refuses it there
      SCOPED_TRACE(
          fmt::format("{}, B {}, T {}, {} heads of {}", profile.name, g.batch, g.t, g.heads, g.d));
      for (const bool forward : {true, false}) {
        const graph::Graph whole = forward ? graph::forward_graph(g, graph::Type::bf16)
                                           : graph::backward_graph(g, graph::Type::bf16);
        const std::vector<int64_t> taking = engines_taking(lib, whole, device);
        std::printf("%s, T %lld, %s: cuDNN %s engines %s\n", profile.name,
                    static_cast<long long>(g.t), forward ? "forward" : "backward",
                    lib.version_text().c_str(), fmt::format("{}", fmt::join(taking, ", ")).c_str());
        EXPECT_FALSE(taking.empty())
            << (forward ? "forward" : "backward") << ": no engine of cuDNN " << lib.version_text()
            << " takes the graph (CUDNN_LOGWARN_DBG=1 says why)";
        graph::Graph broken = whole;
        const auto exp = std::find_if(broken.ops.begin(), broken.ops.end(),
                                      [](const auto& op) { return op.mode == graph::Mode::exp; });
        ASSERT_NE(exp, broken.ops.end());
        broken.ops.erase(exp);
        EXPECT_EQ(engines_taking(lib, broken, device), std::vector<int64_t>{})
            << (forward ? "forward" : "backward") << " without its exp was taken";
      }
    }
  }
}

}  // namespace
}  // namespace ddp::kernels::cuda::sdpa_cudnn

#endif  // DDP_TEST_CUDNN
