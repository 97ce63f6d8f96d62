// The environment contract: every variable ddp reads, its default and who sets it.
//
// Set by ddprun (as torchrun does) for each rank:
//   RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
//   MASTER_PORT, DDPRUN_RESTART_COUNT, DDPRUN_RUN_ID, OMP_NUM_THREADS,
//   DDPRUN_STORE=agent (the launcher hosts the store; rank 0 must not),
//   DDPRUN_STORE_ADDR=host:port (where; default MASTER_ADDR:MASTER_PORT),
//   DDPRUN_STORE_BACKUP=host:port (its backup, --rdzv-backup; empty: none),
//   TORCHELASTIC_{RESTART_COUNT,MAX_RESTARTS,RUN_ID,USE_AGENT_STORE}, ROLE_*,
//   GROUP_WORLD_SIZE (torchrun's, read by PyTorch programs, not by ddp),
//   DDP_STORE_SECRET (the store rejects clients without it; empty: no check),
//   DDPRUN_ON_FAILURE (restart|continue|stop: docs/elastic.md), and in a
//   replacement rank DDPRUN_JOIN=1 and DDPRUN_REPLACEMENT=N
// Set by other launchers and understood by the bootstrap:
//   OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}, PMI_RANK, PMI_SIZE,
//   SLURM_{PROCID,NTASKS,LOCALID,NTASKS_PER_NODE}
// ddp's own knobs, set by the user:
//   DDP_DEVICE     default device, e.g. "cpu", "cuda:1"       (default: cuda, then mps, then cpu)
//   DDP_LOG_LEVEL  trace|debug|info|warn|error|off             (default: info)
//   DDP_BACKEND    auto|local|shm|gloo|mpi|nccl                (default: auto)
//   DDP_TIMEOUT_S  collective and rendezvous timeout, seconds  (default: 300)
//   DDP_DEBUG      off|detail                                  (default: off)
//   DDP_GLOO_HOSTNAME  address gloo ranks listen on (default: the address that
//                      reaches MASTER_ADDR, else the host name; Note [gloo address])
//   DDP_CPU_CACHE_MB   MiB of freed large CPU blocks kept for reuse (default: 1024;
//                      0: off; Note [cpu block cache] in memory/cpu_allocator.h)
//   DDP_MEMORY_LIMIT   bytes ("512MiB", "2GB") each device allocator may hold
//                      allocated; past it an allocation is an OutOfMemoryError
//                      (default: none; Note [memory limit] in memory/allocator.cpp)
//   DDP_NO_CUDA_MEMORY_CACHING  1: every CUDA allocation its own cudaMalloc of its exact
//                      size, cudaFree'd when freed, for compute-sanitizer; slow; no
//                      CUDA graphs (default: 0; Note [no caching] in memory/caching_allocator.h)
//   DDP_VIRTUAL_CPU_DEVICES  N distinct CPU devices cpu:0..cpu:N-1 for testing
//                      multi-device code without a GPU (default: 1; Note [virtual cpu devices])
//   DDP_NCCL_ASYNC_ERROR_HANDLING  0: a failed or timed-out nccl collective is logged,
//                      recorded and aborts the communicator (default); 1: the watchdog
//                      also ends the process after logging (Note [nccl watchdog])
//   DDP_FLIGHT_RECORDER_SIZE  collectives each rank's flight recorder keeps (default:
//                      2000; 0: no recorder; Note [flight recorder])
//   DDP_FLIGHT_DIR     where flight recorder dumps go (default: $TMPDIR/ddp_flight-<uid>, else
//                      /tmp/ddp_flight-<uid>; ddprun sets it for its ranks:
//                      docs/flight_recorder.md)
//   DDPRUN_FLIGHT_SHM  set by ddprun: the directory of the ranks' flight recorder
//                      regions, which ddprun reads (Note [flight region])
//   DDP_TEST_SLOW_RANK, DDP_TEST_SKIP_ALLREDUCE, DDP_TEST_BF16_EMULATE  testing aids of
//                  `train` (docs/train.md)
//   DDP_TEST_SHM_CHECK_DELAY_MS  a testing aid of the shm backend (Note [gone before
//                  arriving] in collectives/shm_communicator.cpp; default: 0)
//   DDPRUN_TEST_NODE_CHECK_MS  a testing aid of ddprun across nodes (Note [the last
//                  events] in launcher/group.cpp; default: 100)
//   DDPRUN_TEST_STOP_READ_GAP_MS  a testing aid of ddprun across nodes (Note [stop
//                  before failure] in launcher/group.cpp; default: 0)
//   DDP_TRACE      DIR: record the timeline and write DIR/rank_<R>.json at exit
//                  (default: unset, off; set by `ddprun --trace DIR`; read by
//                  trace::start_from_env(), which init_process_group, train and
//                  bench call, never ddprun; must be alike on every rank: Note
//                  [timeline] in runtime/trace.h, docs/observability.md)
//   DDP_TRACE_MAX_EVENTS  records kept per thread while tracing (default: 1000000)
//   DDP_TRACE_TEST_SKEW_NS  for tests of the clock alignment: rank R's trace file
//                  reads as if its clock ran R x N ns ahead (default: 0)
//   DDP_ONEDNN     0: no oneDNN even in a build with it: CPU convolutions as
//                  im2col + OpenBLAS, every GEMM on OpenBLAS, no bf16 precision
//                  (default: 1; read once; Note [oneDNN convolutions],
//                  docs/building.md)
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ddp::env {

inline constexpr const char* kDevice = "DDP_DEVICE";
inline constexpr const char* kLogLevel = "DDP_LOG_LEVEL";
inline constexpr const char* kBackend = "DDP_BACKEND";
inline constexpr const char* kTimeoutS = "DDP_TIMEOUT_S";
inline constexpr const char* kDebug = "DDP_DEBUG";
inline constexpr const char* kMemoryLimit = "DDP_MEMORY_LIMIT";
inline constexpr const char* kNoCudaMemoryCaching = "DDP_NO_CUDA_MEMORY_CACHING";
inline constexpr const char* kRank = "RANK";
inline constexpr const char* kLocalRank = "LOCAL_RANK";
inline constexpr const char* kWorldSize = "WORLD_SIZE";
inline constexpr const char* kLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr const char* kGroupRank = "GROUP_RANK";
inline constexpr const char* kMasterAddr = "MASTER_ADDR";
inline constexpr const char* kMasterPort = "MASTER_PORT";
inline constexpr const char* kRestartCount = "DDPRUN_RESTART_COUNT";
inline constexpr const char* kOnFailure = "DDPRUN_ON_FAILURE";
inline constexpr const char* kJoin = "DDPRUN_JOIN";                // 1: a replacement that joins
inline constexpr const char* kReplacement = "DDPRUN_REPLACEMENT";  // which one (1, 2, ...)
inline constexpr const char* kHangTimeoutS = "DDPRUN_HANG_TIMEOUT_S";  // ddprun --hang-timeout
inline constexpr const char* kRunId = "DDPRUN_RUN_ID";
inline constexpr const char* kStore = "DDPRUN_STORE";
inline constexpr const char* kStoreAddr = "DDPRUN_STORE_ADDR";
inline constexpr const char* kStoreBackup = "DDPRUN_STORE_BACKUP";
inline constexpr const char* kStoreSecret = "DDP_STORE_SECRET";
inline constexpr const char* kGlooHostname = "DDP_GLOO_HOSTNAME";
inline constexpr const char* kCpuCacheMb = "DDP_CPU_CACHE_MB";
inline constexpr const char* kVirtualCpuDevices = "DDP_VIRTUAL_CPU_DEVICES";
inline constexpr const char* kNcclAsyncErrorHandling = "DDP_NCCL_ASYNC_ERROR_HANDLING";
inline constexpr const char* kFlightRecorderSize = "DDP_FLIGHT_RECORDER_SIZE";
inline constexpr const char* kFlightDir = "DDP_FLIGHT_DIR";
inline constexpr const char* kFlightShm = "DDPRUN_FLIGHT_SHM";
inline constexpr const char* kTrace = "DDP_TRACE";
inline constexpr const char* kTraceMaxEvents = "DDP_TRACE_MAX_EVENTS";
inline constexpr const char* kTraceTestSkewNs = "DDP_TRACE_TEST_SKEW_NS";
inline constexpr const char* kOneDnn = "DDP_ONEDNN";
// "0": bf16 / f16 attention on CUDA keeps the packed kernels instead of cuDNN's fused
// attention (Note [fused attention] in ops/transformer_ops.h).
inline constexpr const char* kCudnnAttention = "DDP_CUDNN_ATTENTION";
// "0": a 16-bit linear layer's bias gradient on CUDA is a column-sum kernel after the
// weight gradient's cublasGemmEx instead of cuBLASLt's BGRADB epilogue on one matmul
// (Note [weight gradient epilogue] in ops/cuda/lt_plan.h).
inline constexpr const char* kLtBiasGrad = "DDP_LT_BIAS_GRAD";
// "1": under bf16 autocast on CUDA, a GPT MLP's c_fc matmul applies the GELU in its
// epilogue and c_proj's input gradient applies GELU's derivative in its own (Note
// [gelu epilogues] in ops/cuda/lt_plan.h); default 0 until measured.
inline constexpr const char* kLtGelu = "DDP_LT_GELU";
// "0": the autograd engine sums every gradient of a tensor used twice with an add,
// instead of letting a LayerNorm's backward add x's into the waiting one in its kernel
// (Note [accumulating into a pending gradient] in runtime/autograd/autograd.h).
inline constexpr const char* kPendingGradients = "DDP_PENDING_GRADIENTS";
inline constexpr const char* kTestBf16Emulate = "DDP_TEST_BF16_EMULATE";
// Testing aid: "1" makes `train --precision bf16` on the CPU run CUDA's autocast rules
// (Note [autocast]; the CPU widens 16-bit tensors, so it is slow) instead of oneDNN's bf16
// matmuls, so DDP, ZeRO and DataParallel under autocast are tested on CPU ranks.
inline constexpr const char* kTestCpuAutocast = "DDP_TEST_CPU_AUTOCAST";
// Testing aid: "1" lets `train --cuda-graph` run on the CPU, where every capture fails
// (the CPU has no graphs): the run takes the failed capture's eager path (Note [graphed
// steps] in trainer/epoch.cpp), whose numbers a test compares with a run without it.
inline constexpr const char* kTestCudaGraphOnCpu = "DDP_TEST_CUDA_GRAPH_ON_CPU";
// Testing aid: DEVICE:OP:ARG:MODE corrupts op OP's tensor ARG on that device type after
// every call, so a test can be seen failing without a rebuild (Note [planted faults]
// in runtime/planted_fault.h; bench/gpu/planted_faults.sh).
inline constexpr const char* kTestPlantFault = "DDP_TEST_PLANT_FAULT";

// The value of a variable, or nullopt when unset or empty.
std::optional<std::string> get(const char* name);
// An integer variable; throws ValueError naming the variable and the text when it
// is set but not an integer.
std::optional<int64_t> get_int(const char* name);
// A number variable (seconds, ...); ValueError naming it when it is not one.
std::optional<double> get_double(const char* name);

}  // namespace ddp::env
