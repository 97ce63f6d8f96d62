// CPU convolutions through oneDNN: forward, backward data, backward weights.
#include "runtime/ops/cpu/onednn.h"
#include "runtime/ops/cpu/onednn_internal.h"

#include "runtime/error.h"

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

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
// Under Note [cpu bf16] the same reorders convert the multiplied operands (input,
// weights, output gradient) to bf16; results stay f32.
//
// Primitives are made once per shape (batch, channels, image, kernel, stride,
// padding, precision) and direction (with or without bias) and kept for the
// process: making one costs a JIT compilation (milliseconds), running it
// microseconds. Any thread may run them (Note [oneDNN threads] in onednn.cpp).
//
// Results equal im2col + sgemm's to rounding (f32 accumulation, other order):
// tests/unit/onednn_test.cpp compares the two paths.

namespace ddp::kernels::cpu::onednn {
namespace {

using namespace detail;

// A convolution's shape and precision; the bias is chosen per direction (Conv).
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
  return ForwardPd(desc, user_scratchpad(), engine());
}

// One direction: the primitive and its three tensor arguments.
struct Direction {
  Prim prim;
  Arg in0, in1, out;
};

Direction make_forward(const Dims& d, bool bias) {
  const ForwardPd pd = forward_pd(d, bias);
  return {make_prim<dnnl::convolution_forward>(pd),
          Arg(plain(d.src, Tag::nchw), pd.src_desc(), false),
          Arg(plain(d.weights, Tag::oihw), pd.weights_desc(), false),
          Arg(plain(d.dst, Tag::nchw), pd.dst_desc(), true)};
}

// in0 diff_dst, in1 weights, out diff_src.
Direction make_backward_data(const Dims& d, const ForwardPd& hint) {
  const dnnl::convolution_backward_data::desc desc(dnnl::algorithm::convolution_direct, any(d.src),
                                                   any(d.weights, d.in), any(d.dst, d.in),
                                                   d.strides, d.padding, d.padding);
  const dnnl::convolution_backward_data::primitive_desc pd(desc, user_scratchpad(), engine(), hint);
  return {make_prim<dnnl::convolution_backward_data>(pd),
          Arg(plain(d.dst, Tag::nchw), pd.diff_dst_desc(), false),
          Arg(plain(d.weights, Tag::oihw), pd.weights_desc(), false),
          Arg(plain(d.src, Tag::nchw), pd.diff_src_desc(), true)};
}

// in0 diff_dst, in1 src, out diff_weights (diff_bias is plain f32, never staged).
Direction make_backward_weights(const Dims& d, bool bias, const ForwardPd& hint) {
  const auto algo = dnnl::algorithm::convolution_direct;
  const auto desc = bias ? dnnl::convolution_backward_weights::desc(
                               algo, any(d.src, d.in), any(d.weights), plain(d.bias, Tag::x),
                               any(d.dst, d.in), d.strides, d.padding, d.padding)
                         : dnnl::convolution_backward_weights::desc(
                               algo, any(d.src, d.in), any(d.weights), any(d.dst, d.in), d.strides,
                               d.padding, d.padding);
  const dnnl::convolution_backward_weights::primitive_desc pd(desc, user_scratchpad(), engine(),
                                                              hint);
  return {make_prim<dnnl::convolution_backward_weights>(pd),
          Arg(plain(d.dst, Tag::nchw), pd.diff_dst_desc(), false),
          Arg(plain(d.src, Tag::nchw), pd.src_desc(), false),
          Arg(plain(d.weights, Tag::oihw), pd.diff_weights_desc(), true)};
}

// The directions of one shape, each made on first use under the cache's lock (a
// failed make leaves its slot empty, to fail again with the same error next time).
struct Conv {
  Dims d;
  std::optional<ForwardPd> hint;  // the backward primitives' hint: their forward pass
  std::unique_ptr<Direction> forward[2], data, weights[2];  // [bias]
};

enum class Kind { forward, data, weights };

// A direction to run, and whether its operands are rounded to bf16 first (Note [cpu
// bf16] without bf16 primitives: bf16_primitives()), decided together.
struct Chosen {
  const Direction& dir;
  bool round_operands;
};

// The direction `kind` (with or without bias) of the convolution of g, made on
// first use, for the precision now. Entries are never erased, so the reference stays
// valid.
Chosen direction(const Conv2dGeometry& g, int64_t c_out, Kind kind, bool bias) {
  static std::mutex mutex;
  static std::map<Key, Conv> cache;
  // Without bf16 primitives the operands come rounded (run_direction), and the
  // primitives are the f32 ones.
  const bool primitives = bf16_primitives();
  const bool bf16 = onednn::bf16() && primitives;
  const bool round_operands = onednn::bf16() && !primitives;
  const Key k{g.n,        g.c,        g.h,        g.w,     c_out,   g.kernel_h,
              g.kernel_w, g.stride_h, g.stride_w, g.pad_h, g.pad_w, bf16};
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = cache.try_emplace(k);
  Conv& conv = it->second;
  if (fresh) conv.d = dims_of(g, c_out, bf16);
  if (kind != Kind::forward && !conv.hint) conv.hint = forward_pd(conv.d, false);
  std::unique_ptr<Direction>& slot = kind == Kind::forward ? conv.forward[bias]
                                     : kind == Kind::data  ? conv.data
                                                           : conv.weights[bias];
  if (!slot) {
    slot = std::make_unique<Direction>(kind == Kind::forward ? make_forward(conv.d, bias)
                                       : kind == Kind::data
                                           ? make_backward_data(conv.d, *conv.hint)
                                           : make_backward_weights(conv.d, bias, *conv.hint));
  }
  return {*slot, round_operands};
}

// Stages in0 and in1, runs the direction with `extra` arguments (bias), unstages out.
// Under Note [cpu bf16] without bf16 primitives (bf16_primitives()), in0 and in1 are
// rounded to bf16 values first, as the staging would have rounded them.
void run_direction(const Chosen& chosen, int in0_arg, const Tensor& in0, int in1_arg,
                   const Tensor& in1, int out_arg, Tensor& out, Args extra) {
  const Direction& dir = chosen.dir;
  Tensor rounded0, rounded1;
  if (chosen.round_operands) {
    rounded0 = bf16_rounded(in0.data<float>(), 1, in0.numel(), in0.numel());
    rounded1 = bf16_rounded(in1.data<float>(), 1, in1.numel(), in1.numel());
  }
  const Tensor& x0 = rounded0.defined() ? rounded0 : in0;
  const Tensor& x1 = rounded1.defined() ? rounded1 : in1;
  Staged a = stage(dir.in0, x0.data_ptr(), true), b = stage(dir.in1, x1.data_ptr(), true);
  Staged o = stage(dir.out, out.data_ptr(), false);
  extra.emplace(in0_arg, a.mem);
  extra.emplace(in1_arg, b.mem);
  extra.emplace(out_arg, o.mem);
  execute(dir.prim, std::move(extra));
  unstage(dir.out, o, out.data_ptr());
}

memory bias_memory(const Tensor& b) {
  return memory(plain({b.size(0)}, Tag::x), engine(), b.data_ptr());
}

// oneDNN reports failures as dnnl::error; ddp's callers expect ddp errors.
template <class F>
void guarded(const char* op, const Conv2dGeometry& g, int64_t c_out, F&& f) {
  try {
    f();
  } catch (const dnnl::error& e) {
    throw Error(fmt::format(
        "{}: oneDNN failed ({}, status {}) for input [{}, {}, {}, {}], {} output channels, "
        "kernel {}x{}, stride {}x{}, padding {}x{}, {} precision; set DDP_ONEDNN=0 to run "
        "convolutions as im2col + OpenBLAS{}",
        op, e.what(), static_cast<int>(e.status), g.n, g.c, g.h, g.w, c_out, g.kernel_h, g.kernel_w,
        g.stride_h, g.stride_w, g.pad_h, g.pad_w, bf16() ? "bf16" : "f32",
        bf16() ? ", or train with --precision fp32" : ""));
  }
}

}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dGeometry& g,
                    Tensor& y) {
  guarded("conv2d", g, w.size(0), [&] {
    const Chosen dir = direction(g, w.size(0), Kind::forward, b.defined());
    Args extra;
    if (b.defined()) extra.emplace(DNNL_ARG_BIAS, bias_memory(b));
    run_direction(dir, DNNL_ARG_SRC, x, DNNL_ARG_WEIGHTS, w, DNNL_ARG_DST, y, std::move(extra));
  });
}

void conv2d_backward_data(const Tensor& grad_y, const Tensor& w, const Conv2dGeometry& g,
                          Tensor& grad_x) {
  guarded("conv2d backward (input)", g, w.size(0), [&] {
    const Chosen dir = direction(g, w.size(0), Kind::data, false);
    run_direction(dir, DNNL_ARG_DIFF_DST, grad_y, DNNL_ARG_WEIGHTS, w, DNNL_ARG_DIFF_SRC, grad_x,
                  {});
  });
}

void conv2d_backward_weights(const Tensor& grad_y, const Tensor& x, const Conv2dGeometry& g,
                             Tensor& grad_w, Tensor& grad_b) {
  guarded("conv2d backward (weights)", g, grad_w.size(0), [&] {
    const bool bias = grad_b.defined();
    const Chosen dir = direction(g, grad_w.size(0), Kind::weights, bias);
    Args extra;
    if (bias) extra.emplace(DNNL_ARG_DIFF_BIAS, bias_memory(grad_b));
    run_direction(dir, DNNL_ARG_DIFF_DST, grad_y, DNNL_ARG_SRC, x, DNNL_ARG_DIFF_WEIGHTS, grad_w,
                  std::move(extra));
  });
}

}  // namespace ddp::kernels::cpu::onednn
