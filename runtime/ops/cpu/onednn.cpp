// oneDNN on the CPU: convolutions (forward, backward data, backward weights) and sgemm.
#include "runtime/ops/cpu/onednn.h"

#include "runtime/env.h"
#include "runtime/error.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>

// Note [oneDNN convolutions]
// oneDNN (the library behind PyTorch's CPU convolutions) runs a convolution
// directly, with JIT kernels for the CPU's vector ISA (jit:avx512_core on the
// Zen 4 / Cooper Lake machines, jit:avx2 elsewhere), where im2col + sgemm spends a
// third of the CNN's step building, packing and scattering column matrices. Its
// fast kernels want blocked layouts (nChw16c activations, OIhw16i16o weights), so
// each primitive is created with format `any` and its arguments are reordered from
// and to our NCHW / OIHW tensors around the call: with plain layouts forced it
// falls back to its own gemm-based convolution, no faster than ours. The reorders
// are a copy of each argument per call (included in docs/benchmarks.md's figures);
// the blocked buffers come from ddp's caching allocator, so no call page-faults.
//
// Primitive descriptors and primitives are made once per shape (batch, channels,
// image, kernel, stride, padding, bias) and direction and kept for the process:
// making one costs a JIT compilation (milliseconds), running it microseconds. Each
// thread executes on its own stream, so DataParallel's replica threads can run the
// same primitive at once (oneDNN primitives are thread-safe to execute).
//
// Threads: Debian's libdnnl runs on OpenMP; ddprun sets OMP_NUM_THREADS with
// OPENBLAS_NUM_THREADS (docs/ddprun.md), so oneDNN and OpenBLAS use the same count.
// Results equal im2col + sgemm's to rounding (f32 accumulation, other order):
// tests/unit/onednn_test.cpp compares the two paths.

namespace ddp::kernels::cpu::onednn {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

memory::desc plain(const memory::dims& dims, Tag tag) {
  return memory::desc(dims, memory::data_type::f32, tag);
}
memory::desc any(const memory::dims& dims, memory::data_type type = memory::data_type::f32) {
  return memory::desc(dims, type, Tag::any);
}

std::atomic<bool> g_bf16{false};

// One argument: our plain layout, the primitive's, and the reorder between them
// (none when they agree).
struct Arg {
  memory::desc user, inner;
  std::optional<dnnl::reorder> to_inner, to_user;

  Arg(const memory::desc& user_desc, const memory::desc& inner_desc, bool output)
      : user(user_desc), inner(inner_desc) {
    if (user == inner) return;
    if (output) {
      to_user = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), inner, engine(), user));
    } else {
      to_inner = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), user, engine(), inner));
    }
  }
};

// A blocked copy of an argument for one call, its storage from ddp's allocator.
struct Staged {
  Tensor storage;
  memory mem;
};

// The memory the primitive reads or writes for `arg`: t itself when the layouts
// agree, else a buffer of the primitive's layout (filled from t for an input).
Staged stage(const Arg& arg, const Tensor& t, bool input) {
  memory user_mem(arg.user, engine(), t.data_ptr());
  if (arg.user == arg.inner) return {Tensor(), user_mem};
  const auto floats =
      static_cast<int64_t>((arg.inner.get_size() + sizeof(float) - 1) / sizeof(float));
  Tensor storage = empty({floats}, {.dtype = DType::f32});
  memory inner_mem(arg.inner, engine(), storage.data_ptr());
  if (input) arg.to_inner->execute(thread_stream(), user_mem, inner_mem);
  return {std::move(storage), inner_mem};
}

// Copies a staged output back into t (nothing when it was t).
void unstage(const Arg& arg, const Staged& staged, const Tensor& t) {
  if (!arg.to_user) return;
  memory user_mem(arg.user, engine(), t.data_ptr());
  memory inner_mem = staged.mem;  // a handle: execute() takes non-const ones
  arg.to_user->execute(thread_stream(), inner_mem, user_mem);
}

// A convolution's shape; the bias is chosen per direction (Conv below).
struct Key {
  int64_t n, c, h, w, c_out, kh, kw, sh, sw, ph, pw;
  bool bf16;
  auto tie() const { return std::tie(n, c, h, w, c_out, kh, kw, sh, sw, ph, pw, bf16); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Dims {
  memory::dims src, weights, bias, dst, strides, padding;
  // The multiplied operands' type (src, weights, diff_dst): f32, or bf16 under
  // Note [cpu bf16]. Results (dst, diff_src, diff_weights, diff_bias) stay f32.
  memory::data_type in = memory::data_type::f32;
};

Dims dims_of(const Conv2dGeometry& g, int64_t c_out, bool bf16) {
  return {{g.n, g.c, g.h, g.w},
          {c_out, g.c, g.kernel_h, g.kernel_w},
          {c_out},
          {g.n, c_out, g.out_h(), g.out_w()},
          {g.stride_h, g.stride_w},
          {g.pad_h, g.pad_w},
          bf16 ? memory::data_type::bf16 : memory::data_type::f32};
}

using ForwardPd = dnnl::convolution_forward::primitive_desc;

ForwardPd forward_pd(const Dims& d, bool bias) {
  const auto prop = dnnl::prop_kind::forward_training;
  const auto algo = dnnl::algorithm::convolution_direct;
  const auto desc =
      bias ? dnnl::convolution_forward::desc(prop, algo, any(d.src, d.in), any(d.weights, d.in),
                                             plain(d.bias, Tag::x), any(d.dst), d.strides,
                                             d.padding, d.padding)
           : dnnl::convolution_forward::desc(prop, algo, any(d.src, d.in), any(d.weights, d.in),
                                             any(d.dst), d.strides, d.padding, d.padding);
  return ForwardPd(desc, engine());
}

struct Forward {
  dnnl::convolution_forward prim;
  Arg src, weights, dst;
};
struct BackwardData {
  dnnl::convolution_backward_data prim;
  Arg diff_dst, weights, diff_src;
};
struct BackwardWeights {
  dnnl::convolution_backward_weights prim;
  Arg diff_dst, src, diff_weights;
};

// The primitives of one shape, each made on first use; [bias] indexes the
// directions a bias changes.
struct Conv {
  Dims d;
  ForwardPd hint;  // the backward primitives' hint: the forward pass they belong to
  std::once_flag forward_once[2], data_once, weights_once[2];
  std::unique_ptr<Forward> forward[2];
  std::unique_ptr<BackwardData> data;
  std::unique_ptr<BackwardWeights> weights[2];

  explicit Conv(const Dims& dims) : d(dims), hint(forward_pd(dims, false)) {}
};

Conv& conv_for(const Conv2dGeometry& g, int64_t c_out) {
  static std::mutex mutex;
  static std::map<Key, std::unique_ptr<Conv>> cache;
  const bool bf16 = g_bf16.load(std::memory_order_relaxed);
  const Key k{g.n,        g.c,        g.h,        g.w,     c_out,   g.kernel_h,
              g.kernel_w, g.stride_h, g.stride_w, g.pad_h, g.pad_w, bf16};
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[k];
  if (!slot) slot = std::make_unique<Conv>(dims_of(g, c_out, bf16));
  return *slot;
}

Forward& forward(Conv& conv, bool bias) {
  std::call_once(conv.forward_once[bias], [&conv, bias] {
    const Dims& d = conv.d;
    const ForwardPd pd = forward_pd(d, bias);
    conv.forward[bias].reset(new Forward{dnnl::convolution_forward(pd),
                                         Arg(plain(d.src, Tag::nchw), pd.src_desc(), false),
                                         Arg(plain(d.weights, Tag::oihw), pd.weights_desc(), false),
                                         Arg(plain(d.dst, Tag::nchw), pd.dst_desc(), true)});
  });
  return *conv.forward[bias];
}

BackwardData& backward_data(Conv& conv) {
  std::call_once(conv.data_once, [&conv] {
    const Dims& d = conv.d;
    const dnnl::convolution_backward_data::desc desc(
        dnnl::algorithm::convolution_direct, any(d.src), any(d.weights, d.in), any(d.dst, d.in),
        d.strides, d.padding, d.padding);
    const dnnl::convolution_backward_data::primitive_desc pd(desc, engine(), conv.hint);
    conv.data.reset(new BackwardData{dnnl::convolution_backward_data(pd),
                                     Arg(plain(d.dst, Tag::nchw), pd.diff_dst_desc(), false),
                                     Arg(plain(d.weights, Tag::oihw), pd.weights_desc(), false),
                                     Arg(plain(d.src, Tag::nchw), pd.diff_src_desc(), true)});
  });
  return *conv.data;
}

BackwardWeights& backward_weights(Conv& conv, bool bias) {
  std::call_once(conv.weights_once[bias], [&conv, bias] {
    const Dims& d = conv.d;
    const auto algo = dnnl::algorithm::convolution_direct;
    const auto desc = bias ? dnnl::convolution_backward_weights::desc(
                                 algo, any(d.src, d.in), any(d.weights), plain(d.bias, Tag::x),
                                 any(d.dst, d.in), d.strides, d.padding, d.padding)
                           : dnnl::convolution_backward_weights::desc(
                                 algo, any(d.src, d.in), any(d.weights), any(d.dst, d.in),
                                 d.strides, d.padding, d.padding);
    const dnnl::convolution_backward_weights::primitive_desc pd(desc, engine(), conv.hint);
    conv.weights[bias].reset(
        new BackwardWeights{dnnl::convolution_backward_weights(pd),
                            Arg(plain(d.dst, Tag::nchw), pd.diff_dst_desc(), false),
                            Arg(plain(d.src, Tag::nchw), pd.src_desc(), false),
                            Arg(plain(d.weights, Tag::oihw), pd.diff_weights_desc(), true)});
  });
  return *conv.weights[bias];
}

// A bf16 matmul of one shape, transposition, alpha and beta (Note [cpu bf16]).
struct MatmulKey {
  int64_t m, n, k, lda, ldb, ldc;
  bool ta, tb;
  float alpha, beta;
  auto tie() const { return std::tie(m, n, k, lda, ldb, ldc, ta, tb, alpha, beta); }
  bool operator<(const MatmulKey& o) const { return tie() < o.tie(); }
};

struct Matmul {
  dnnl::matmul prim;
  Arg a, b, c;
};

std::unique_ptr<Matmul> make_matmul(const MatmulKey& k) {
  const auto f32 = memory::data_type::f32, bf16 = memory::data_type::bf16;
  // Row-major A [m, k] (or its transpose stored [k, m]) as strides over dims {m, k}.
  const memory::desc a_user({k.m, k.k}, f32,
                            k.ta ? memory::dims{1, k.lda} : memory::dims{k.lda, 1});
  const memory::desc b_user({k.k, k.n}, f32,
                            k.tb ? memory::dims{1, k.ldb} : memory::dims{k.ldb, 1});
  const memory::desc c_user({k.m, k.n}, f32, memory::dims{k.ldc, 1});
  dnnl::primitive_attr attr;
  if (k.alpha != 1.0f) attr.set_output_scales(0, {k.alpha});
  if (k.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(k.beta);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::desc desc(any({k.m, k.k}, bf16), any({k.k, k.n}, bf16), c_user);
  const dnnl::matmul::primitive_desc pd(desc, attr, engine());
  return std::make_unique<Matmul>(Matmul{dnnl::matmul(pd), Arg(a_user, pd.src_desc(), false),
                                         Arg(b_user, pd.weights_desc(), false),
                                         Arg(c_user, pd.dst_desc(), true)});
}

Matmul& matmul_for(const MatmulKey& k) {
  static std::mutex mutex;
  static std::map<MatmulKey, std::unique_ptr<Matmul>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[k];
  if (!slot) slot = make_matmul(k);
  return *slot;
}

// A memory of `desc` over the caller's buffer (a plain pointer, not a Tensor).
memory user_memory(const memory::desc& desc, const float* data) {
  return memory(desc, engine(), const_cast<float*>(data));
}

// oneDNN reports failures as dnnl::error; ddp's callers expect ddp errors.
template <class F>
void run(const char* op, const Conv2dGeometry& g, F&& f) {
  try {
    f();
    thread_stream().wait();
  } catch (const dnnl::error& e) {
    throw Error(fmt::format(
        "{}: oneDNN failed ({}, status {}) for input [{}, {}, {}, {}], kernel {}x{}, stride {}, "
        "padding {}; set DDP_ONEDNN=0 to run convolutions as im2col + OpenBLAS",
        op, e.what(), static_cast<int>(e.status), g.n, g.c, g.h, g.w, g.kernel_h, g.kernel_w,
        g.stride_h, g.pad_h));
  }
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

// Note [gemm choice]
// gemm() has one dispatch point for f32 products on the CPU: OpenBLAS's sgemm or
// oneDNN's. Measured one thread at a time on Zen 4 (AVX-512; docs/benchmarks.md
// "gemm choice"), oneDNN was 1.04-1.22x faster where C has 256 columns or more and
// the inner dimension is 64 or more (the MLP's first layer both ways, the CNN's
// classifier gradients, every GPT projection), and slower on the narrow ones
// (0.4x for the MLP's 10-column logits, 0.8x for k = 10, 0.9x for the CNN's
// 128-column classifier forward). The rule is fixed, not tuned at run time: the
// same shape always takes the same path, so runs stay reproducible and ranks agree.
void set_bf16(bool on) {
  g_bf16.store(on);
}

bool bf16() {
  return g_bf16.load(std::memory_order_relaxed);
}

bool bf16_native() {
  return dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core_bf16;
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
    default:
      return "other";
  }
}

void matmul_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  try {
    Matmul& mm = matmul_for({m, n, k, lda, ldb, ldc, trans_a, trans_b, alpha, beta});
    dnnl::stream& s = thread_stream();
    // Both operands differ in type from the user's, so both are staged.
    Tensor a16 = empty({static_cast<int64_t>((mm.a.inner.get_size() + 3) / 4)});
    Tensor b16 = empty({static_cast<int64_t>((mm.b.inner.get_size() + 3) / 4)});
    memory a_in(mm.a.inner, engine(), a16.data_ptr()), b_in(mm.b.inner, engine(), b16.data_ptr());
    memory a_user = user_memory(mm.a.user, a), b_user = user_memory(mm.b.user, b);
    mm.a.to_inner->execute(s, a_user, a_in);
    mm.b.to_inner->execute(s, b_user, b_in);
    memory c_mem = user_memory(mm.c.user, c);
    mm.prim.execute(s, {{DNNL_ARG_SRC, a_in}, {DNNL_ARG_WEIGHTS, b_in}, {DNNL_ARG_DST, c_mem}});
    s.wait();
  } catch (const dnnl::error& e) {
    throw Error(fmt::format(
        "matmul: oneDNN's bf16 matmul failed ({}, status {}) for m={} n={} k={}; run with f32 "
        "precision (train --precision fp32)",
        e.what(), static_cast<int>(e.status), m, n, k));
  }
}

bool sgemm_preferred(int64_t m, int64_t n, int64_t k) {
  return available() && m >= 64 && n >= 256 && k >= 64;
}

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha,
                                          a, lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success) {
    throw Error(fmt::format(
        "matmul: oneDNN's sgemm failed (status {}) for m={} n={} k={}; set DDP_ONEDNN=0 to "
        "multiply with OpenBLAS only",
        static_cast<int>(status), m, n, k));
  }
}

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dGeometry& g,
                    Tensor& y) {
  run("conv2d", g, [&] {
    Forward& f = forward(conv_for(g, w.size(0)), b.defined());
    Staged src = stage(f.src, x, true), wei = stage(f.weights, w, true);
    Staged dst = stage(f.dst, y, false);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, src.mem}, {DNNL_ARG_WEIGHTS, wei.mem}, {DNNL_ARG_DST, dst.mem}};
    if (b.defined())
      args.emplace(DNNL_ARG_BIAS, memory(plain({w.size(0)}, Tag::x), engine(), b.data_ptr()));
    f.prim.execute(thread_stream(), args);
    unstage(f.dst, dst, y);
  });
}

void conv2d_backward_data(const Tensor& grad_y, const Tensor& w, const Conv2dGeometry& g,
                          Tensor& grad_x) {
  run("conv2d backward (input)", g, [&] {
    BackwardData& bd = backward_data(conv_for(g, w.size(0)));
    Staged dy = stage(bd.diff_dst, grad_y, true), wei = stage(bd.weights, w, true);
    Staged dx = stage(bd.diff_src, grad_x, false);
    bd.prim.execute(
        thread_stream(),
        {{DNNL_ARG_DIFF_DST, dy.mem}, {DNNL_ARG_WEIGHTS, wei.mem}, {DNNL_ARG_DIFF_SRC, dx.mem}});
    unstage(bd.diff_src, dx, grad_x);
  });
}

void conv2d_backward_weights(const Tensor& grad_y, const Tensor& x, const Conv2dGeometry& g,
                             Tensor& grad_w, Tensor& grad_b) {
  run("conv2d backward (weights)", g, [&] {
    const bool bias = grad_b.defined();
    BackwardWeights& bw = backward_weights(conv_for(g, grad_w.size(0)), bias);
    Staged dy = stage(bw.diff_dst, grad_y, true), src = stage(bw.src, x, true);
    Staged dw = stage(bw.diff_weights, grad_w, false);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_DIFF_DST, dy.mem}, {DNNL_ARG_SRC, src.mem}, {DNNL_ARG_DIFF_WEIGHTS, dw.mem}};
    if (bias) {
      args.emplace(DNNL_ARG_DIFF_BIAS,
                   memory(plain({grad_w.size(0)}, Tag::x), engine(), grad_b.data_ptr()));
    }
    bw.prim.execute(thread_stream(), args);
    unstage(bw.diff_weights, dw, grad_w);
  });
}

}  // namespace ddp::kernels::cpu::onednn
