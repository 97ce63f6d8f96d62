// oneDNN on the CPU: the settings, the staging helpers (onednn_internal.h), sgemm
// and the bf16 matmul. Convolutions: onednn_conv.cpp.
#include "runtime/ops/cpu/onednn.h"
#include "runtime/ops/cpu/onednn_internal.h"

#include "runtime/env.h"
#include "runtime/error.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

// Note [oneDNN threads]
// Debian's libdnnl 2.6 runs on OpenMP (OMP_NUM_THREADS, which ddprun sets with
// OPENBLAS_NUM_THREADS: docs/ddprun.md) and is built without concurrent
// execution: a primitive with the library's scratchpad may only run on the thread
// that created it (dnnl.hpp), and DataParallel's replica threads share one cache of
// primitives. So every primitive and reorder here is made with a user scratchpad,
// allocated per execution from ddp's caching allocator, and runs on the calling
// thread's own stream, which it waits for before its staged buffers are freed:
// any thread may then run any cached primitive, several at once.
//
// Note [cpu bf16]
// set_bf16(true) (ddp::set_cpu_precision, train --precision bf16) makes every f32
// GEMM of gemm() and every convolution multiply in bf16: the staging reorders
// round the two operands to bf16 (round to nearest even), the primitive sums the
// products in f32 (AVX512_BF16's dot products) and writes f32. This is what
// torch.autocast("cpu", bfloat16) does to linear and conv layers; parameters,
// gradients, optimizer state and every other op stay f32 (docs/train.md
// "Precision"). Where oneDNN makes no bf16 primitives (an AVX2-only CPU:
// bf16_primitives()), the operands are rounded to bf16 values held in f32 first and
// the f32 primitives multiply them: the same products, summed in f32. Not covered:
// attention's batched products (cblas_sgemm in
// transformer.cpp) and 16-bit tensors' own matmuls, which stay as they were.
// The setting is process-wide and part of each primitive's cache key.
//
// Note [oneDNN and signals]
// Debian's oneDNN 2.6's f32 GEMM kernels (dnnl_sgemm, and the matmul, inner
// product and convolution primitives built on them) point the stack register
// into a heap work buffer while they run when the inner dimension is above 84
// (the MLP's k = 784): upstream oneDNN issue #4845, fixed in 3.11.2. A signal
// handled on that thread meanwhile pushes its frame into the heap, whatever the
// handler does: the flight recorder's SIGUSR1 dump aborted rank 1 with
// "malloc(): smallbin double linked list corrupted" in CI, and a signal every
// 3 ms to `ddprun -n 2 train` corrupted the heap in 8 runs of 8. So every oneDNN
// execution runs inside an AsyncSignalsBlocked: the asynchronous signals are
// blocked on the calling thread and a process-directed one (kill -USR1, ddprun's
// SIGTERM) goes to another thread or waits, at most one GEMM, until the mask is
// restored; a thread-directed one waits likewise. The synchronous signals (SEGV,
// BUS, FPE, ILL, TRAP, SYS, ABRT) stay unblocked: blocking them would not defer
// a fault, it would kill the process without its handler. OpenMP's worker
// threads, which run the same kernels, are created by oneDNN's first parallel
// region, which is inside an execution (creating a primitive starts no thread),
// and they keep the mask they inherit from it: blocked. That holds while
// nothing else in the process starts OpenMP's pool first: Debian's OpenBLAS
// (libopenblas0-pthread, what deploy/install-deps.sh installs) runs on threads
// of its own; its OpenMP build would start the pool unguarded in cblas_sgemm.
// Cost: two pthread_sigmask calls per execution, 0.54 us the pair on an AMD
// EPYC (AVX2), against at least 20 us for the smallest GEMM sent to oneDNN (Note
// [gemm choice]). Tests: unit.OneDnnSignalsDeathTest, and
// e2e.flight_recorder_shm and _gloo send their ranks a stream of SIGUSR1.

namespace ddp::kernels::cpu::onednn {

namespace detail {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

namespace {
Tensor bytes_buffer(size_t bytes) {
  return empty({static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float))},
               {.dtype = DType::f32});
}

// Blocks the asynchronous signals on the calling thread for its lifetime and
// restores the thread's mask after (Note [oneDNN and signals]).
class AsyncSignalsBlocked {
 public:
  AsyncSignalsBlocked() { pthread_sigmask(SIG_BLOCK, &asynchronous(), &previous_); }
  ~AsyncSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  AsyncSignalsBlocked(const AsyncSignalsBlocked&) = delete;
  AsyncSignalsBlocked& operator=(const AsyncSignalsBlocked&) = delete;

 private:
  // Every signal but the synchronous ones, which must reach their handlers.
  static const sigset_t& asynchronous() {
    static const sigset_t set = [] {
      sigset_t s;
      sigfillset(&s);
      for (const int synchronous : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT})
        sigdelset(&s, synchronous);
      return s;
    }();
    return set;
  }
  sigset_t previous_;
};

}  // namespace

void execute(const Prim& p, Args args) {
  Tensor scratch;
  if (p.scratchpad.get_size() > 0) {
    scratch = bytes_buffer(p.scratchpad.get_size());
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(p.scratchpad, engine(), scratch.data_ptr()));
  }
  const AsyncSignalsBlocked blocked;
  p.prim.execute(thread_stream(), args);
  thread_stream().wait();
}

Arg::Arg(const memory::desc& user_desc, const memory::desc& inner_desc, bool output)
    : user(user_desc), inner(inner_desc) {
  if (user == inner) return;
  const auto reorder = [](const memory::desc& from, const memory::desc& to) {
    const dnnl::reorder::primitive_desc pd(engine(), from, engine(), to, user_scratchpad());
    return make_prim<dnnl::reorder>(pd);
  };
  if (output) {
    to_user = reorder(inner, user);
  } else {
    to_inner = reorder(user, inner);
  }
}

Staged stage(const Arg& arg, void* data, bool input) {
  memory user_mem(arg.user, engine(), data);
  if (arg.user == arg.inner) return {Tensor(), user_mem};
  Tensor storage = bytes_buffer(arg.inner.get_size());
  memory inner_mem(arg.inner, engine(), storage.data_ptr());
  if (input) execute(*arg.to_inner, {{DNNL_ARG_FROM, user_mem}, {DNNL_ARG_TO, inner_mem}});
  return {std::move(storage), inner_mem};
}

void unstage(const Arg& arg, const Staged& staged, void* data) {
  if (!arg.to_user) return;
  execute(*arg.to_user,
          {{DNNL_ARG_FROM, staged.mem}, {DNNL_ARG_TO, memory(arg.user, engine(), data)}});
}

Tensor bf16_rounded(const float* data, int64_t rows, int64_t cols, int64_t ld) {
  Tensor out = empty({rows, cols}, {.dtype = DType::f32});
  float* dst = out.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      dst[r * cols + c] = bf16_to_float(float_to_bf16(data[r * ld + c]));
  return out;
}

}  // namespace detail

namespace {

using namespace detail;

std::atomic<bool> g_bf16{false};
std::atomic<bool> g_force_bf16_rounding{false};

// A bf16 matmul of one shape, transposition, alpha and beta (Note [cpu bf16]).
struct MatmulKey {
  int64_t m, n, k, lda, ldb, ldc;
  bool ta, tb;
  float alpha, beta;
  auto tie() const { return std::tie(m, n, k, lda, ldb, ldc, ta, tb, alpha, beta); }
  bool operator<(const MatmulKey& o) const { return tie() < o.tie(); }
};

struct Matmul {
  Prim prim;
  Arg a, b;
  memory::desc c;
};

Matmul make_matmul(const MatmulKey& k) {
  const auto f32 = memory::data_type::f32, bf16 = memory::data_type::bf16;
  // Row-major A [m, k] (or its transpose stored [k, m]) as strides over dims {m, k}.
  const memory::desc a_user({k.m, k.k}, f32,
                            k.ta ? memory::dims{1, k.lda} : memory::dims{k.lda, 1});
  const memory::desc b_user({k.k, k.n}, f32,
                            k.tb ? memory::dims{1, k.ldb} : memory::dims{k.ldb, 1});
  const memory::desc c_user({k.m, k.n}, f32, memory::dims{k.ldc, 1});
  dnnl::primitive_attr attr = user_scratchpad();
  if (k.alpha != 1.0f) attr.set_output_scales(0, {k.alpha});  // before the sum: alpha AB + beta C
  if (k.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(k.beta);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::desc desc(any({k.m, k.k}, bf16), any({k.k, k.n}, bf16), c_user);
  const dnnl::matmul::primitive_desc pd(desc, attr, engine());
  return {make_prim<dnnl::matmul>(pd), Arg(a_user, pd.src_desc(), false),
          Arg(b_user, pd.weights_desc(), false), c_user};
}

const Matmul& matmul_for(const MatmulKey& k) {
  static std::mutex mutex;
  static std::map<MatmulKey, std::unique_ptr<Matmul>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[k];
  if (!slot) slot = std::make_unique<Matmul>(make_matmul(k));
  return *slot;
}

}  // namespace

bool available() {
  static const bool on = env::get_int(env::kOneDnn).value_or(1) != 0;
  return on;
}

std::string version() {
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("{}.{}.{}", v->major, v->minor, v->patch);
}

void set_bf16(bool on) {
  g_bf16.store(on);
}

bool bf16() {
  return g_bf16.load(std::memory_order_relaxed);
}

bool bf16_primitives() {
  // Asked once, of a small matmul: oneDNN makes its bf16 convolutions on the same ISAs.
  static const bool made = [] {
    try {
      const auto bf16 = memory::data_type::bf16;
      const dnnl::matmul::desc desc(any({16, 16}, bf16), any({16, 16}, bf16),
                                    plain({16, 16}, Tag::ab));
      const dnnl::matmul::primitive_desc pd(desc, user_scratchpad(), engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return made && !g_force_bf16_rounding.load(std::memory_order_relaxed);
}

void force_bf16_rounding(bool on) {
  g_force_bf16_rounding.store(on);
}

bool bf16_native() {
  // The ISA values are bit sets (avx2_vnni is numerically above avx512_core_bf16).
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16_isa = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & bf16_isa) == bf16_isa;
}

std::string isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    default:
      return "other";
  }
}

void matmul_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  if (!bf16_primitives()) {  // rounded operands, multiplied in f32 (bf16_primitives())
    const int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
    const Tensor a16 = bf16_rounded(a, trans_a ? k : m, a_cols, lda);
    const Tensor b16 = bf16_rounded(b, trans_b ? n : k, b_cols, ldb);
    sgemm(trans_a, trans_b, m, n, k, alpha, a16.data<float>(), a_cols, b16.data<float>(), b_cols,
          beta, c, ldc);
    return;
  }
  try {
    const Matmul& mm = matmul_for({m, n, k, lda, ldb, ldc, trans_a, trans_b, alpha, beta});
    // Both operands differ in type from ours, so both are staged (and rounded).
    Staged a16 = stage(mm.a, const_cast<float*>(a), true);
    Staged b16 = stage(mm.b, const_cast<float*>(b), true);
    execute(mm.prim, {{DNNL_ARG_SRC, a16.mem},
                      {DNNL_ARG_WEIGHTS, b16.mem},
                      {DNNL_ARG_DST, memory(mm.c, engine(), c)}});
  } catch (const dnnl::error& e) {
    throw Error(fmt::format(
        "matmul: oneDNN's bf16 matmul failed ({}, status {}) for m={} n={} k={}; run with f32 "
        "precision (train --precision fp32)",
        e.what(), static_cast<int>(e.status), m, n, k));
  }
}

// Note [gemm choice]
// gemm() has one dispatch point for f32 products on the CPU: OpenBLAS's sgemm or
// oneDNN's. Measured one thread at a time on Zen 4 (AVX-512; docs/benchmarks.md
// "gemm choice"), oneDNN was 1.04-1.22x faster where C has 256 columns or more and
// the inner dimension is 64 or more (the MLP's first layer both ways, the CNN's
// classifier gradients, every GPT projection), and slower on the narrow ones
// (0.4x for the MLP's 10-column logits, 0.8x for k = 10, 0.9x for the CNN's
// 128-column classifier forward). The rule is fixed, not tuned at run time: the
// same shape always takes the same path, so runs stay reproducible and ranks agree.
bool sgemm_preferred(int64_t m, int64_t n, int64_t k) {
  return available() && m >= 64 && n >= 256 && k >= 64;
}

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const AsyncSignalsBlocked blocked;
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha,
                                          a, lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success) {
    throw Error(fmt::format(
        "matmul: oneDNN's sgemm failed (status {}) for m={} n={} k={}; set DDP_ONEDNN=0 to "
        "multiply with OpenBLAS only",
        static_cast<int>(status), m, n, k));
  }
}

}  // namespace ddp::kernels::cpu::onednn
