// CPU kernels of the model zoo's layers and fused optimizer steps. A CNN trains
// on the CPU through im2col / col2im, so those walk the column matrix row by row
// (contiguous in cols), clipping each kernel row against the image once.
#include "runtime/ops/adamw_constants.h"
#include "runtime/ops/cpu/clones.h"
#include "runtime/ops/kernels.h"
#include "runtime/rng/philox.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ddp::kernels::cpu {
namespace {

// The kernel taps k in [begin, end) for which start + k lies inside [0, size).
struct Taps {
  int64_t begin, end;
};

inline Taps valid_taps(int64_t start, int64_t kernel, int64_t size) {
  const int64_t begin = start < 0 ? -start : 0, end = size - start;
  return {begin < kernel ? begin : kernel, end < 0 ? 0 : (end < kernel ? end : kernel)};
}

// One output position (n, oh, ow) of a window: where it starts in the input and
// which of its taps fall inside the image.
struct Window {
  int64_t h0, w0;
  Taps hs, ws;
};

Window window_at(const Conv2dGeometry& g, int64_t oh, int64_t ow) {
  const int64_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
  return {h0, w0, valid_taps(h0, g.kernel_h, g.h), valid_taps(w0, g.kernel_w, g.w)};
}

// Writes the C * kernel_h * kernel_w entries of one cols row from `image` [C, H, W].
// Plain loops rather than memcpy / fill: kernel rows are a few elements long.
// KW > 0 is the kernel width known at compile time (the loops unroll), 0 reads it from g.
template <int KW>
void im2col_row(const float* image, const Conv2dGeometry& g, const Window& win, float* row) {
  const int64_t kw_n = KW > 0 ? KW : g.kernel_w, plane = g.h * g.w;
  const bool full_width = win.ws.begin == 0 && win.ws.end == kw_n;
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t kh = 0; kh < g.kernel_h; ++kh, row += kw_n) {
      if (kh < win.hs.begin || kh >= win.hs.end) {
        for (int64_t kw = 0; kw < kw_n; ++kw) row[kw] = 0.0f;
        continue;
      }
      const float* src = image + c * plane + (win.h0 + kh) * g.w + win.w0;  // image row h0 + kh
      if (full_width) {
        for (int64_t kw = 0; kw < kw_n; ++kw) row[kw] = src[kw];
        continue;
      }
      for (int64_t kw = 0; kw < win.ws.begin; ++kw) row[kw] = 0.0f;
      for (int64_t kw = win.ws.begin; kw < win.ws.end; ++kw) row[kw] = src[kw];
      for (int64_t kw = win.ws.end; kw < kw_n; ++kw) row[kw] = 0.0f;
    }
  }
}

// Adds one cols row into `image` [C, H, W]: the adjoint of im2col_row.
template <int KW>
void col2im_row(const float* row, const Conv2dGeometry& g, const Window& win, float* image) {
  const int64_t kw_n = KW > 0 ? KW : g.kernel_w, plane = g.h * g.w;
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t kh = win.hs.begin; kh < win.hs.end; ++kh) {
      const float* src = row + (c * g.kernel_h + kh) * kw_n;
      float* dst = image + c * plane + (win.h0 + kh) * g.w;  // image row h0 + kh
      for (int64_t kw = win.ws.begin; kw < win.ws.end; ++kw) dst[win.w0 + kw] += src[kw];
    }
  }
}

// Calls f(std::integral_constant<int, KW>) with KW the kernel width for the
// common 3 and 5, 0 (read at run time) otherwise.
template <typename F>
void with_kernel_width(int64_t kernel_w, F&& f) {
  if (kernel_w == 3) return f(std::integral_constant<int, 3>{});
  if (kernel_w == 5) return f(std::integral_constant<int, 5>{});
  f(std::integral_constant<int, 0>{});
}

// out [cols, rows] = in [rows, cols] transposed, in square tiles that stay in L1.
template <typename T>
void transpose_2d(const T* in, int64_t rows, int64_t cols, T* out) {
  constexpr int64_t kTile = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = std::min(rows, r0 + kTile);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t r = r0; r < r1; ++r) out[c * rows + r] = in[r * cols + c];
      }
    }
  }
}

// {0, 3, 1, 2} (NHWC to NCHW) and {0, 2, 3, 1} (NCHW to NHWC) are a 2-D transpose
// per batch element: the layouts of a convolution's GEMM rows and of its output.
inline bool transposes_batches(const std::array<int, 4>& perm) {
  return perm == std::array<int, 4>{0, 3, 1, 2} || perm == std::array<int, 4>{0, 2, 3, 1};
}

// T is an unsigned integer of the element's width: a permutation only moves bits.
template <typename T>
void permute_loop(const T* in, const Shape& in_shape, const std::array<int, 4>& perm, T* out) {
  int64_t in_stride[4];
  in_stride[3] = 1;
  for (int i = 2; i >= 0; --i)
    in_stride[i] = in_stride[i + 1] * in_shape[static_cast<size_t>(i + 1)];
  int64_t size[4], stride[4];  // the output's dims and the input strides along them
  for (size_t i = 0; i < 4; ++i) {
    size[i] = in_shape[static_cast<size_t>(perm[i])];
    stride[i] = in_stride[perm[i]];
  }
  if (transposes_batches(perm)) {
    // {0, 3, 1, 2}: [H*W, C] to [C, H*W] per batch; {0, 2, 3, 1}: [C, H*W] to [H*W, C].
    const bool to_channels_first = perm[1] == 3;
    const int64_t rows = to_channels_first ? in_shape[1] * in_shape[2] : in_shape[1];
    const int64_t cols = to_channels_first ? in_shape[3] : in_shape[2] * in_shape[3];
    for (int64_t a = 0; a < size[0]; ++a) {
      transpose_2d(in + a * rows * cols, rows, cols, out + a * rows * cols);
    }
    return;
  }
  for (int64_t a = 0; a < size[0]; ++a) {
    for (int64_t b = 0; b < size[1]; ++b) {
      for (int64_t c = 0; c < size[2]; ++c) {
        const T* src = in + a * stride[0] + b * stride[1] + c * stride[2];
        for (int64_t d = 0; d < size[3]; ++d) *out++ = src[d * stride[3]];
      }
    }
  }
}

// The first maximum wins; a NaN beats every number (it propagates, as in PyTorch).
inline bool better(float candidate, float best) {
  return (candidate > best) | (std::isnan(candidate) & !std::isnan(best));
}

// take ? a : b without a branch. On real data "is this the new maximum" is a coin
// flip, and GCC compiles the plain conditional back into a branch (3-4x slower).
inline int64_t select(bool take, int64_t a, int64_t b) {
  const auto mask = static_cast<int64_t>(0) - static_cast<int64_t>(take);
  return (a & mask) | (b & ~mask);
}
inline float select(bool take, float a, float b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(take);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & mask) |
                              (std::bit_cast<uint32_t>(b) & ~mask));
}

// The first maximum of src over the image rows x columns given as [begin, end)
// (row length w), in (h, w) order.
inline void window_max(const float* src, int64_t w, Taps rows, Taps columns, float* best_out,
                       int64_t* index_out) {
  int64_t best_index = rows.begin * w + columns.begin;
  float best = src[best_index];
  for (int64_t h = rows.begin; h < rows.end; ++h) {
    for (int64_t index = h * w + columns.begin; index < h * w + columns.end; ++index) {
      const float v = src[index];
      const bool take = better(v, best);
      best = select(take, v, best);
      best_index = select(take, index, best_index);
    }
  }
  *best_out = best;
  *index_out = best_index;
}

// max_pool2d with a 2x2 kernel, stride 2, no padding (every CNN's pooling): the
// windows are never clipped, so the four taps are compared in (h, w) order with
// the same rule as window_max and no bounds arithmetic.
constexpr int64_t kMaxPoolRow = 256;  // output columns per pass (a stack buffer)

// True when x[0, n) holds a NaN. An integer count, so that GCC vectorizes it.
bool has_nan(const float* x, int64_t n) {
  int32_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += static_cast<int32_t>(x[i] != x[i]);
  return count != 0;
}

// One output row of 2x2 pooling, windows without NaN. The first maximum in (h, w)
// order wins, as in window_max: the maxima with plain > (no NaN to order), then
// the first tap equal to its window's maximum, as a float 0..3; then the taps as
// flat indices. GCC vectorizes the first loop only in this form: with the NaN rule
// of better() or with the int64 indices in the same loop it stayed scalar (19% of
// the CNN's step on one Zen 4 thread).
void max_pool_2x2_row(const float* top, const float* bottom, int64_t out_w, int64_t base, int64_t w,
                      float* best_out, int64_t* index_out) {
  float taps[kMaxPoolRow];
  for (int64_t ow0 = 0; ow0 < out_w; ow0 += kMaxPoolRow) {
    const int64_t len = std::min(kMaxPoolRow, out_w - ow0);
    const float* t = top + 2 * ow0;
    const float* b = bottom + 2 * ow0;
    float* out = best_out + ow0;
    for (int64_t j = 0; j < len; ++j) {
      const float t0 = t[2 * j], t1 = t[2 * j + 1], t2 = b[2 * j], t3 = b[2 * j + 1];
      float m = t0;
      m = t1 > m ? t1 : m;
      m = t2 > m ? t2 : m;
      m = t3 > m ? t3 : m;
      out[j] = m;
      float tap = 3.0f;
      tap = t2 == m ? 2.0f : tap;
      tap = t1 == m ? 1.0f : tap;
      tap = t0 == m ? 0.0f : tap;
      taps[j] = tap;
    }
    for (int64_t j = 0; j < len; ++j) {
      const auto tap = static_cast<int32_t>(taps[j]);
      index_out[ow0 + j] = base + (tap >> 1) * w + 2 * (ow0 + j) + (tap & 1);
    }
  }
}

// The same row with better()'s NaN rule (a NaN wins and propagates), one window at
// a time: for rows that hold a NaN.
void max_pool_2x2_row_exact(const float* top, const float* bottom, int64_t out_w, int64_t base,
                            int64_t w, float* best_out, int64_t* index_out) {
  for (int64_t ow = 0; ow < out_w; ++ow) {
    float best = top[2 * ow];
    int32_t which = 0;
    const float taps[3] = {top[2 * ow + 1], bottom[2 * ow], bottom[2 * ow + 1]};
    for (int32_t t = 0; t < 3; ++t) {
      const bool take = better(taps[t], best);
      best = take ? taps[t] : best;
      which = take ? t + 1 : which;
    }
    best_out[ow] = best;
    index_out[ow] = base + (which >> 1) * w + 2 * ow + (which & 1);
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DDP_POOL_AVX512 1
#define DDP_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

// Note [avx-512 pooling]
// max_pool_2x2_row for AVX-512, 16 windows per vector: the two input rows are
// loaded 32 floats at a time under a mask (a CNN's rows are short, 14 and 7
// windows: one masked iteration, no scalar tail), split into even and odd columns
// with two permutes, and reduced in max_pool_2x2_row's order: m = max(t1, m) is
// "t1 > m ? t1 : m" (MAXPS returns its second operand unless the first is larger),
// the tap is the first of t0, t1, t2 equal to m, else t3; the flat indices are
// built in two 8-lane int64 halves. So values and indices are those of the plain
// row, bit for bit (NnOps.MaxPool2d* compare both with the naive pooling, and
// NnOps.MaxPool2x2RowsAgreeOnEveryPath with the plain rows). A NaN in the row
// returns false (the windows before it may be written already): the caller then
// writes the whole row with the exact rule. Its own function with a target
// attribute, chosen at run time by use_avx512_pool(): GCC's own AVX-512 code for
// the plain row (max_pool2d under DDP_CPU_CLONES, Note [cpu kernel clones]) took
// 20.8% of the CNN's step on a Zen 4 against the plain x86-64 code's 10%, so
// max_pool2d is not cloned and the 2x2 rows are AVX-512 here or plain. On an
// AVX2-only CPU the plain row runs: an AVX2 row was tried (2026-11-26, measured on
// the Zen 4 with the AVX-512 row switched off) and dropped. With VMASKMOV for the
// short rows' tails it took 12.1% of the CNN's step against the plain row's
// 10.5% (AMD runs masked stores slowly); with whole vectors and the plain row for
// the tails (a CNN's 14- and 7-window rows are mostly tail) 10.3%: no gain.
// DDP_NO_AVX512_POOL=1 in the environment takes the plain rows on any CPU.
DDP_AVX512_TARGET bool max_pool_2x2_row_avx512(const float* top, const float* bottom, int64_t out_w,
                                               int64_t base, int64_t w, float* best_out,
                                               int64_t* index_out) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i lane2 = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
  const __m512i one = _mm512_set1_epi64(1), wide = _mm512_set1_epi64(w);
  for (int64_t ow0 = 0; ow0 < out_w; ow0 += 16) {
    const int64_t n = std::min<int64_t>(16, out_w - ow0);
    const auto mask = static_cast<__mmask16>((1u << n) - 1u);
    const auto lo = static_cast<__mmask16>(n >= 8 ? 0xffffu : (1u << (2 * n)) - 1u);
    const auto hi = static_cast<__mmask16>(n > 8 ? (1u << (2 * n - 16)) - 1u : 0u);
    const __m512 ta = _mm512_maskz_loadu_ps(lo, top + 2 * ow0);
    const __m512 tb = _mm512_maskz_loadu_ps(hi, top + 2 * ow0 + 16);
    const __m512 ba = _mm512_maskz_loadu_ps(lo, bottom + 2 * ow0);
    const __m512 bb = _mm512_maskz_loadu_ps(hi, bottom + 2 * ow0 + 16);
    const __m512 t0 = _mm512_permutex2var_ps(ta, even, tb);
    const __m512 t1 = _mm512_permutex2var_ps(ta, odd, tb);
    const __m512 t2 = _mm512_permutex2var_ps(ba, even, bb);
    const __m512 t3 = _mm512_permutex2var_ps(ba, odd, bb);
    // A NaN anywhere in the row: the caller redoes the whole row with the exact rule.
    if ((_mm512_cmp_ps_mask(t0, t1, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(t2, t3, _CMP_UNORD_Q)) !=
        0) {
      return false;
    }
    // maskz with every lane: the same VMAXPS; GCC 12 warns that _mm512_max_ps's
    // undefined pass-through "may be used uninitialized".
    __m512 m = _mm512_maskz_max_ps(0xffff, t1, t0);
    m = _mm512_maskz_max_ps(0xffff, t2, m);
    m = _mm512_maskz_max_ps(0xffff, t3, m);
    _mm512_mask_storeu_ps(best_out + ow0, mask, m);
    const __mmask16 eq0 = _mm512_cmp_ps_mask(t0, m, _CMP_EQ_OQ);
    const __mmask16 eq1 = _mm512_cmp_ps_mask(t1, m, _CMP_EQ_OQ);
    const __mmask16 eq2 = _mm512_cmp_ps_mask(t2, m, _CMP_EQ_OQ);
    const auto right = static_cast<__mmask16>((~eq0 & eq1) | (~eq0 & ~eq1 & ~eq2));  // tap 1, 3
    const auto below = static_cast<__mmask16>(~eq0 & ~eq1);                          // tap 2, 3
    for (int half = 0; half < 2; ++half) {
      const auto lanes = static_cast<__mmask8>(mask >> (8 * half));
      if (lanes == 0) break;
      __m512i at = _mm512_add_epi64(_mm512_set1_epi64(base + 2 * (ow0 + 8 * half)), lane2);
      at = _mm512_mask_add_epi64(at, static_cast<__mmask8>(right >> (8 * half)), at, one);
      at = _mm512_mask_add_epi64(at, static_cast<__mmask8>(below >> (8 * half)), at, wide);
      _mm512_mask_storeu_epi64(index_out + ow0 + 8 * half, lanes, at);
    }
  }
  return true;
}

// The AVX-512 rows where the CPU has them, unless DDP_NO_AVX512_POOL is set (read
// per call, so that a test can compare both paths in one process).
bool use_avx512_pool() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }();
  return has && std::getenv("DDP_NO_AVX512_POOL") == nullptr;
}
#endif

void max_pool_2x2(const float* in, int64_t planes, int64_t h, int64_t w, float* best_out,
                  int64_t* index_out) {
  const int64_t out_h = h / 2, out_w = w / 2;
#ifdef DDP_POOL_AVX512
  const bool avx512 = use_avx512_pool();
#endif
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float* src = in + plane * h * w;
    for (int64_t oh = 0; oh < out_h; ++oh, best_out += out_w, index_out += out_w) {
      const float* top = src + 2 * oh * w;
      const float* bottom = top + w;
      const int64_t base = 2 * oh * w;
#ifdef DDP_POOL_AVX512
      if (avx512) {
        if (!max_pool_2x2_row_avx512(top, bottom, out_w, base, w, best_out, index_out)) {
          max_pool_2x2_row_exact(top, bottom, out_w, base, w, best_out, index_out);
        }
        continue;
      }
#endif
      if (has_nan(top, 2 * out_w) || has_nan(bottom, 2 * out_w)) {
        max_pool_2x2_row_exact(top, bottom, out_w, base, w, best_out, index_out);
      } else {
        max_pool_2x2_row(top, bottom, out_w, base, w, best_out, index_out);
      }
    }
  }
}

template <bool kFirstStep, bool kNesterov>
void sgd_momentum_loop(float* p, const float* g, float* buf, int64_t n, const SgdStep& s) {
  const float lr = s.lr, mu = s.momentum, wd = s.weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    const float d = g[i] + wd * p[i];
    const float b = kFirstStep ? d : mu * buf[i] + d;
    buf[i] = b;
    p[i] -= lr * (kNesterov ? d + mu * b : b);
  }
}

}  // namespace

void im2col(const Tensor& x, const Conv2dGeometry& g, Tensor& cols) {
  const float* in = x.data<float>();
  float* row = cols.data<float>();
  const int64_t out_h = g.out_h(), out_w = g.out_w(), row_len = g.c * g.kernel_h * g.kernel_w;
  with_kernel_width(g.kernel_w, [&](auto kw) {
    for (int64_t n = 0; n < g.n; ++n) {
      const float* image = in + n * g.c * g.h * g.w;
      for (int64_t oh = 0; oh < out_h; ++oh) {
        for (int64_t ow = 0; ow < out_w; ++ow, row += row_len) {
          im2col_row<decltype(kw)::value>(image, g, window_at(g, oh, ow), row);
        }
      }
    }
  });
}

// Each pixel sums its entries in row order (n, oh, ow), as the CUDA gather does.
void col2im(const Tensor& cols, const Conv2dGeometry& g, Tensor& grad_x) {
  const float* row = cols.data<float>();
  float* out = grad_x.data<float>();
  std::fill(out, out + grad_x.numel(), 0.0f);
  const int64_t out_h = g.out_h(), out_w = g.out_w(), row_len = g.c * g.kernel_h * g.kernel_w;
  with_kernel_width(g.kernel_w, [&](auto kw) {
    for (int64_t n = 0; n < g.n; ++n) {
      float* image = out + n * g.c * g.h * g.w;
      for (int64_t oh = 0; oh < out_h; ++oh) {
        for (int64_t ow = 0; ow < out_w; ++ow, row += row_len) {
          col2im_row<decltype(kw)::value>(row, g, window_at(g, oh, ow), image);
        }
      }
    }
  });
}

void permute4(const Tensor& x, const std::array<int, 4>& perm, Tensor& out) {
  switch (element_size(x.dtype())) {
    case 1:
      return permute_loop(static_cast<const uint8_t*>(x.data_ptr()), x.shape(), perm,
                          static_cast<uint8_t*>(out.data_ptr()));
    case 2:
      return permute_loop(static_cast<const uint16_t*>(x.data_ptr()), x.shape(), perm,
                          static_cast<uint16_t*>(out.data_ptr()));
    case 4:
      return permute_loop(static_cast<const uint32_t*>(x.data_ptr()), x.shape(), perm,
                          static_cast<uint32_t*>(out.data_ptr()));
    case 8:
      return permute_loop(static_cast<const uint64_t*>(x.data_ptr()), x.shape(), perm,
                          static_cast<uint64_t*>(out.data_ptr()));
  }
  DDP_ASSERT(false, "permute4: no kernel for elements of {} bytes", element_size(x.dtype()));
}

void max_pool2d(const Tensor& x, const Conv2dGeometry& g, Tensor& out, Tensor& indices) {
  const float* in = x.data<float>();
  float* best_out = out.data<float>();
  int64_t* index_out = indices.data<int64_t>();
  const int64_t out_h = g.out_h(), out_w = g.out_w();
  if (g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 &&
      g.pad_w == 0) {
    return max_pool_2x2(in, g.n * g.c, g.h, g.w, best_out, index_out);
  }
  for (int64_t plane = 0; plane < g.n * g.c; ++plane) {
    const float* src = in + plane * g.h * g.w;
    for (int64_t oh = 0; oh < out_h; ++oh) {
      const int64_t h0 = oh * g.stride_h - g.pad_h;
      const Taps hs = valid_taps(h0, g.kernel_h, g.h);
      for (int64_t ow = 0; ow < out_w; ++ow, ++best_out, ++index_out) {
        const int64_t w0 = ow * g.stride_w - g.pad_w;
        const Taps ws = valid_taps(w0, g.kernel_w, g.w);
        // Padding is at most half the kernel (checked by the op): the window is never empty.
        window_max(src, g.w, {h0 + hs.begin, h0 + hs.end}, {w0 + ws.begin, w0 + ws.end}, best_out,
                   index_out);
      }
    }
  }
}

// Each pixel sums its gradients in output order (oh, ow), as the CUDA gather does.
DDP_CPU_CLONES
void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Conv2dGeometry& g,
                         Tensor& grad_x) {
  const float* grad = grad_out.data<float>();
  const int64_t* index = indices.data<int64_t>();
  float* out = grad_x.data<float>();
  std::fill(out, out + grad_x.numel(), 0.0f);
  const int64_t plane_in = g.h * g.w, plane_out = g.out_h() * g.out_w();
  for (int64_t plane = 0; plane < g.n * g.c; ++plane) {
    float* dst = out + plane * plane_in;
    for (int64_t o = plane * plane_out; o < (plane + 1) * plane_out; ++o) {
      DDP_CHECK(
          index[o] >= 0 && index[o] < plane_in,
          "max_pool2d_backward: index {} at element {} is outside the {}x{} input plane; pass "
          "the indices max_pool2d returned with the same geometry",
          index[o], o, g.h, g.w);
      dst[index[o]] += grad[o];
    }
  }
}

// See Note [rng stream] in rng/philox.h: the draws of fill_uniform, thresholded.
void dropout_mask(Tensor& mask, uint64_t seed, uint64_t offset, float p) {
  float* out = mask.data<float>();
  const int64_t n = mask.numel();
  const float keep_scale = 1.0f / (1.0f - p);
  for (int64_t g = 0; g * 4 < n; ++g) {
    const rng::Philox4 block = rng::philox_block(seed, offset + static_cast<uint64_t>(g));
    for (int64_t j = 0; j < 4 && g * 4 + j < n; ++j) {
      out[g * 4 + j] = rng::uniform_from_word(block.v[j]) >= p ? keep_scale : 0.0f;
    }
  }
}

DDP_CPU_CLONES
void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdStep& step) {
  SgdStep s = step;  // Note [captured optimizer steps]: the lr where it is kept
  if (s.lr_on_device != nullptr) s.lr = *s.lr_on_device;
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  const int64_t n = param.numel();
  if (s.momentum == 0.0f) {
    const float lr = s.lr, wd = s.weight_decay;
    for (int64_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
    return;
  }
  float* b = buf.data<float>();
  // Loop-invariant branches hoisted into template arguments so the loops vectorize.
  if (s.first_step && s.nesterov) return sgd_momentum_loop<true, true>(p, g, b, n, s);
  if (s.first_step) return sgd_momentum_loop<true, false>(p, g, b, n, s);
  if (s.nesterov) return sgd_momentum_loop<false, true>(p, g, b, n, s);
  sgd_momentum_loop<false, false>(p, g, b, n, s);
}

namespace {

// scale: nullptr, or the factor each gradient element is multiplied by as it is read
// (Note [clipping in the step]).
DDP_CPU_INLINE void adamw_loop(const math::AdamWConstants& k, Tensor& param, const Tensor& grad,
                               Tensor& m, Tensor& v, const float* scale = nullptr) {
  const float decay = k.decay, step_size = k.step_size, bc2_sqrt = k.bc2_sqrt;
  const float b1 = k.b1, b2 = k.b2, c1 = k.c1, c2 = k.c2, eps = k.eps;
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  float* m1 = m.data<float>();
  float* m2 = v.data<float>();
  const float s = scale != nullptr ? *scale : 1.0f;
  for (int64_t i = 0, n = param.numel(); i < n; ++i) {
    const float gi = scale != nullptr ? g[i] * s : g[i];
    const float mi = b1 * m1[i] + c1 * gi;
    const float vi = b2 * m2[i] + c2 * gi * gi;
    m1[i] = mi;
    m2[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
  }
}

}  // namespace

// The constants in double, rounded once (adamw_constants), as the CUDA kernels use them.
DDP_CPU_CLONES
void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s) {
  adamw_loop(kernels::adamw_constants(s), param, grad, m, v);
}

DDP_CPU_CLONES
void adamw_update_multi(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                        std::vector<Tensor>& m, std::vector<Tensor>& v,
                        const std::vector<AdamWStep>& steps, const Tensor& constants,
                        const Tensor& grad_scale) {
  const float* scale = grad_scale.defined() ? grad_scale.data<float>() : nullptr;
  const auto* table = constants.defined()
                          ? reinterpret_cast<const math::AdamWConstants*>(constants.data<float>())
                          : nullptr;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel() == 0) continue;
    adamw_loop(table != nullptr ? table[i] : kernels::adamw_constants(steps[i]), params[i],
               grads[i], m[i], v[i], scale);
  }
}

}  // namespace ddp::kernels::cpu

namespace ddp::kernels {

math::AdamWConstants adamw_constants(const AdamWStep& s) {
  const double t = static_cast<double>(s.step);
  return {static_cast<float>(1.0 - static_cast<double>(s.lr) * s.weight_decay),
          static_cast<float>(s.lr / (1.0 - std::pow(double{s.beta1}, t))),
          static_cast<float>(std::sqrt(1.0 - std::pow(double{s.beta2}, t))),
          s.beta1,
          s.beta2,
          static_cast<float>(1.0 - s.beta1),
          static_cast<float>(1.0 - s.beta2),
          s.eps};
}

}  // namespace ddp::kernels
