// The layer and optimizer ops on the CPU against plain double-precision references
// written here: direct convolution loops, adjoint identities, naive pooling, the
// Philox stream of rand(), and torch.optim's update rules.
#include "runtime/ops/nn_ops.h"
#include "runtime/ops/ops.h"
#include "runtime/rng/philox.h"
#include "tests/unit/error_text.h"
#include "tests/unit/expect_close.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace ddp {
namespace {

using kernels::Conv2dGeometry;

using test_util::as_double;
using test_util::expect_close;

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

size_t at(int64_t i) {
  return static_cast<size_t>(i);
}

// {n, c, h, w, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w}: odd sizes,
// rectangular windows, stride != kernel, padding wider than the stride, 1x1 images.
const std::vector<Conv2dGeometry> kConvCases = {
    {2, 3, 7, 6, 3, 3, 1, 1, 1, 1}, {1, 2, 8, 9, 3, 2, 2, 3, 0, 1}, {2, 1, 5, 5, 5, 5, 1, 1, 0, 0},
    {1, 3, 6, 7, 2, 2, 2, 2, 0, 0}, {1, 2, 4, 5, 3, 3, 2, 2, 2, 1}, {3, 4, 1, 1, 1, 1, 1, 1, 0, 0},
};

std::string describe(const Conv2dGeometry& g) {
  return fmt::format("input [{}, {}, {}, {}] kernel {}x{} stride {}x{} padding {}x{}", g.n, g.c,
                     g.h, g.w, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w, g.pad_h, g.pad_w);
}

Conv2dGeometry geometry_for(const Tensor& x, const Conv2dGeometry& g) {
  return conv_geometry(x, {g.kernel_h, g.kernel_w}, {g.stride_h, g.stride_w}, {g.pad_h, g.pad_w});
}

// x[n, c, ih, iw] with zero padding outside the image.
double pixel(const std::vector<double>& x, const Conv2dGeometry& g, int64_t n, int64_t c,
             int64_t ih, int64_t iw) {
  if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) return 0.0;
  return x[at(((n * g.c + c) * g.h + ih) * g.w + iw)];
}

// y [N, C_out, out_h, out_w] = sum over (c, kh, kw) of weight[co, c, kh, kw] * x[...].
std::vector<double> direct_conv(const std::vector<double>& x, const std::vector<double>& weight,
                                const Conv2dGeometry& g, int64_t c_out) {
  const int64_t oh_n = g.out_h(), ow_n = g.out_w();
  std::vector<double> y(at(g.n * c_out * oh_n * ow_n));
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t co = 0; co < c_out; ++co)
      for (int64_t oh = 0; oh < oh_n; ++oh)
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          double acc = 0;
          for (int64_t c = 0; c < g.c; ++c)
            for (int64_t kh = 0; kh < g.kernel_h; ++kh)
              for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
                const double wv = weight[at(((co * g.c + c) * g.kernel_h + kh) * g.kernel_w + kw)];
                acc += wv * pixel(x, g, n, c, oh * g.stride_h - g.pad_h + kh,
                                  ow * g.stride_w - g.pad_w + kw);
              }
          y[at(((n * c_out + co) * oh_n + oh) * ow_n + ow)] = acc;
        }
  return y;
}

TEST(NnOps, Im2colMatchesDirectIndexing) {
  for (const Conv2dGeometry& c : kConvCases) {
    SCOPED_TRACE(describe(c));
    const Tensor x = randn({c.n, c.c, c.h, c.w}, 11);
    const Conv2dGeometry g = geometry_for(x, c);
    const Tensor cols = im2col(x, g);
    const int64_t taps = g.kernel_h * g.kernel_w, rows = g.n * g.out_h() * g.out_w();
    ASSERT_EQ(cols.shape(), (Shape{rows, g.c * taps}));
    const auto xv = as_double(x);
    std::vector<double> expected;
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t oh = 0; oh < g.out_h(); ++oh)
        for (int64_t ow = 0; ow < g.out_w(); ++ow)
          for (int64_t ch = 0; ch < g.c; ++ch)
            for (int64_t kh = 0; kh < g.kernel_h; ++kh)
              for (int64_t kw = 0; kw < g.kernel_w; ++kw)
                expected.push_back(pixel(xv, g, n, ch, oh * g.stride_h - g.pad_h + kh,
                                         ow * g.stride_w - g.pad_w + kw));
    expect_close(expected, cols, 0.0, 0.0);  // a copy: exact
  }
}

TEST(NnOps, Im2colTimesWeightIsTheDirectConvolution) {
  for (const Conv2dGeometry& c : kConvCases) {
    SCOPED_TRACE(describe(c));
    const int64_t c_out = 5;
    const Tensor x = randn({c.n, c.c, c.h, c.w}, 12);
    const Tensor weight = randn({c_out, c.c, c.kernel_h, c.kernel_w}, 13);
    const Conv2dGeometry g = geometry_for(x, c);
    const Tensor rows = matmul(im2col(x, g), weight.reshape({c_out, -1}), {.trans_b = true});
    const Tensor y = permute4(rows.reshape({g.n, g.out_h(), g.out_w(), c_out}), {0, 3, 1, 2});
    expect_close(direct_conv(as_double(x), as_double(weight), g, c_out), y, 1e-4, 1e-4);
  }
}

TEST(NnOps, Col2imIsTheAdjointOfIm2col) {
  uint64_t seed = 20;
  for (const Conv2dGeometry& c : kConvCases) {
    SCOPED_TRACE(describe(c));
    const Tensor x = randn({c.n, c.c, c.h, c.w}, ++seed);
    const Conv2dGeometry g = geometry_for(x, c);
    const Tensor cols = im2col(x, g);
    const Tensor y = randn(cols.shape(), ++seed);
    const Tensor back = col2im(y, g);
    ASSERT_EQ(back.shape(), x.shape());
    const double lhs = dot(as_double(cols), as_double(y));
    const double rhs = dot(as_double(x), as_double(back));
    EXPECT_NEAR(lhs, rhs, 1e-4 * std::max(1.0, std::fabs(lhs)));
  }
}

TEST(NnOps, Col2imSumsEveryEntryThatReadsAPixel) {
  for (const Conv2dGeometry& c : kConvCases) {
    SCOPED_TRACE(describe(c));
    const Conv2dGeometry g = geometry_for(empty({c.n, c.c, c.h, c.w}), c);
    const Tensor y = randn({g.n * g.out_h() * g.out_w(), g.c * g.kernel_h * g.kernel_w}, 30);
    const auto yv = as_double(y);
    std::vector<double> expected(at(g.n * g.c * g.h * g.w), 0.0);
    size_t k = 0;
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t oh = 0; oh < g.out_h(); ++oh)
        for (int64_t ow = 0; ow < g.out_w(); ++ow)
          for (int64_t ch = 0; ch < g.c; ++ch)
            for (int64_t kh = 0; kh < g.kernel_h; ++kh)
              for (int64_t kw = 0; kw < g.kernel_w; ++kw, ++k) {
                const int64_t ih = oh * g.stride_h - g.pad_h + kh,
                              iw = ow * g.stride_w - g.pad_w + kw;
                if (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w) {
                  expected[at(((n * g.c + ch) * g.h + ih) * g.w + iw)] += yv[k];
                }
              }
    expect_close(expected, col2im(y, g), 1e-5, 1e-5);
  }
}

// out[o0, o1, o2, o3] == x[i] where i_perm[d] = o_d.
template <typename T>
void expect_permuted(const Tensor& x, const std::array<int, 4>& perm) {
  const Tensor out = permute4(x, perm);
  const Shape& s = x.shape();
  ASSERT_EQ(out.shape(), (Shape{s[at(perm[0])], s[at(perm[1])], s[at(perm[2])], s[at(perm[3])]}));
  const auto in = x.to_vector<T>(), got = out.to_vector<T>();
  size_t k = 0;
  int64_t idx[4];
  for (idx[0] = 0; idx[0] < out.size(0); ++idx[0])
    for (idx[1] = 0; idx[1] < out.size(1); ++idx[1])
      for (idx[2] = 0; idx[2] < out.size(2); ++idx[2])
        for (idx[3] = 0; idx[3] < out.size(3); ++idx[3], ++k) {
          int64_t src[4];
          for (int d = 0; d < 4; ++d) src[perm[at(d)]] = idx[d];
          const int64_t i = ((src[0] * s[1] + src[1]) * s[2] + src[2]) * s[3] + src[3];
          ASSERT_EQ(got[k], in[at(i)]) << "output element " << k;
        }
}

TEST(NnOps, Permute4MovesEveryElement) {
  const Tensor x = randn({2, 3, 4, 5}, 40);
  for (const std::array<int, 4>& perm : std::vector<std::array<int, 4>>{
           {0, 1, 2, 3}, {0, 3, 1, 2}, {0, 2, 3, 1}, {3, 2, 1, 0}, {1, 0, 3, 2}, {2, 0, 3, 1}}) {
    SCOPED_TRACE(fmt::format("perm [{}, {}, {}, {}]", perm[0], perm[1], perm[2], perm[3]));
    expect_permuted<float>(x, perm);
  }
}

// Larger than the CPU's 16x16 transpose tiles and no multiple of them: the
// convolution's layouts {0, 3, 1, 2} and {0, 2, 3, 1} are tiled transposes there.
TEST(NnOps, Permute4TransposesAcrossTileEdges) {
  const Tensor x = randn({2, 19, 5, 37}, 41);
  for (const std::array<int, 4>& perm :
       std::vector<std::array<int, 4>>{{0, 3, 1, 2}, {0, 2, 3, 1}}) {
    SCOPED_TRACE(fmt::format("perm [{}, {}, {}, {}]", perm[0], perm[1], perm[2], perm[3]));
    expect_permuted<float>(x, perm);
  }
  expect_permuted<int64_t>(cast(x, DType::i64), {0, 3, 1, 2});
}

TEST(NnOps, Permute4TakesEveryElementWidth) {
  const Tensor x = arange(0.0, 120.0, 1.0).reshape({5, 1, 4, 6});
  expect_permuted<int64_t>(cast(x, DType::i64), {2, 0, 3, 1});
  expect_permuted<uint8_t>(cast(x, DType::u8), {3, 1, 0, 2});
  const Tensor half = permute4(cast(x, DType::bf16), {0, 3, 1, 2});  // small integers: exact
  EXPECT_EQ(cast(half, DType::f32).to_vector<float>(),
            permute4(x, {0, 3, 1, 2}).to_vector<float>());
}

struct PoolRef {
  std::vector<double> out;
  std::vector<int64_t> indices;
};

// The first maximum in (h, w) order over the taps inside the image.
PoolRef naive_pool(const std::vector<double>& x, const Conv2dGeometry& g) {
  PoolRef r;
  for (int64_t plane = 0; plane < g.n * g.c; ++plane)
    for (int64_t oh = 0; oh < g.out_h(); ++oh)
      for (int64_t ow = 0; ow < g.out_w(); ++ow) {
        double best = -INFINITY;
        int64_t best_index = -1;
        for (int64_t h = oh * g.stride_h - g.pad_h; h < oh * g.stride_h - g.pad_h + g.kernel_h; ++h)
          for (int64_t w = ow * g.stride_w - g.pad_w; w < ow * g.stride_w - g.pad_w + g.kernel_w;
               ++w) {
            if (h < 0 || h >= g.h || w < 0 || w >= g.w) continue;
            const double v = x[at(plane * g.h * g.w + h * g.w + w)];
            if (best_index < 0 || v > best) {
              best = v;
              best_index = h * g.w + w;
            }
          }
        r.out.push_back(best);
        r.indices.push_back(best_index);
      }
  return r;
}

// The first three take the CPU's 2x2 stride-2 fast path (the second with odd sizes,
// the third with rows longer than its 256-column passes).
const std::vector<Conv2dGeometry> kPoolCases = {
    {2, 3, 8, 8, 2, 2, 2, 2, 0, 0},    {1, 2, 7, 9, 2, 2, 2, 2, 0, 0},
    {1, 1, 4, 1031, 2, 2, 2, 2, 0, 0}, {1, 2, 7, 9, 3, 3, 2, 2, 0, 0},
    {2, 2, 6, 5, 3, 3, 1, 1, 1, 1},    {1, 1, 5, 6, 2, 3, 1, 2, 1, 1},
    {1, 2, 4, 4, 4, 4, 1, 1, 0, 0},
};

TEST(NnOps, MaxPool2dMatchesNaiveIncludingTies) {
  for (const Conv2dGeometry& c : kPoolCases) {
    SCOPED_TRACE(describe(c));
    // Values in {0, 1, 2}: most windows hold ties, and the first maximum must win.
    const Tensor u = rand({c.n, c.c, c.h, c.w}, 50);
    std::vector<float> v = u.to_vector<float>();
    for (float& e : v) e = std::floor(3.0f * e);
    const Tensor x = from_vector(v, u.shape());
    const Conv2dGeometry g = geometry_for(x, c);
    const MaxPoolResult r = max_pool2d(x, g);
    const PoolRef ref = naive_pool(as_double(x), g);
    ASSERT_EQ(r.out.shape(), (Shape{g.n, g.c, g.out_h(), g.out_w()}));
    expect_close(ref.out, r.out, 0.0, 0.0);
    EXPECT_EQ(r.indices.dtype(), DType::i64);
    EXPECT_EQ(r.indices.to_vector<int64_t>(), ref.indices);
  }
}

TEST(NnOps, MaxPool2dPropagatesNaN) {
  std::vector<float> v(16, 1.0f);
  v[5] = NAN;
  const Tensor x = from_vector(v, {1, 1, 4, 4});
  const MaxPoolResult r = max_pool2d(x, conv_geometry(x, 2, 2, 0));
  const auto out = r.out.to_vector<float>();
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(r.indices.to_vector<int64_t>()[0], 5);
  EXPECT_EQ(out[1], 1.0f);
}

// NaNs in rows longer than one vector (40 columns: windows 0-15 and 16-19 of the
// AVX-512 row, Note [avx-512 pooling]): the rows holding one take the exact path;
// a NaN wins its window like +inf would, and every other window is unchanged.
TEST(NnOps, MaxPool2dNaNInLongRowsMatchesNaive) {
  const Shape shape{1, 2, 6, 40};
  std::vector<float> v = rand(shape, 51).to_vector<float>();
  for (const int64_t i : {int64_t{35}, int64_t{3 * 40 + 2}, int64_t{240 + 5 * 40 + 39}}) {
    v[at(i)] = NAN;
  }
  const Tensor x = from_vector(v, shape);
  const Conv2dGeometry g = conv_geometry(x, 2, 2, 0);
  const MaxPoolResult r = max_pool2d(x, g);
  std::vector<double> as_inf = as_double(x);
  for (double& e : as_inf) e = std::isnan(e) ? INFINITY : e;
  const PoolRef ref = naive_pool(as_inf, g);
  const std::vector<float> out = r.out.to_vector<float>();
  EXPECT_EQ(r.indices.to_vector<int64_t>(), ref.indices);
  int nans = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::isinf(ref.out[i])) {
      EXPECT_TRUE(std::isnan(out[i])) << "window " << i;
      ++nans;
    } else {
      EXPECT_EQ(static_cast<double>(out[i]), ref.out[i]) << "window " << i;
    }
  }
  EXPECT_EQ(nans, 3);
}

// Note [avx-512 pooling]: the AVX-512 rows (where the CPU has them) and the plain
// rows (DDP_NO_AVX512_POOL) give the same values and indices, bit for bit, with
// ties, -0.0 next to +0.0, NaNs, and rows of 1 to 37 windows.
TEST(NnOps, MaxPool2x2RowsAgreeOnEveryPath) {
  for (const int64_t w : {int64_t{2}, int64_t{15}, int64_t{28}, int64_t{33}, int64_t{74}}) {
    SCOPED_TRACE("width " + std::to_string(w));
    const Shape shape{2, 3, 6, w};
    std::vector<float> v = rand(shape, 52 + static_cast<uint64_t>(w)).to_vector<float>();
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = std::floor(3.0f * v[i]) - 1.0f;  // -1, 0, 1: ties everywhere
      if (v[i] == 0.0f && i % 2 == 0) v[i] = -0.0f;
    }
    v[at(w + 1)] = NAN;
    const Tensor x = from_vector(v, shape);
    const Conv2dGeometry g = conv_geometry(x, 2, 2, 0);
    const MaxPoolResult fast = max_pool2d(x, g);
    ASSERT_EQ(setenv("DDP_NO_AVX512_POOL", "1", 1), 0);
    const MaxPoolResult plain = max_pool2d(x, g);
    unsetenv("DDP_NO_AVX512_POOL");
    const std::vector<float> a = fast.out.to_vector<float>(), b = plain.out.to_vector<float>();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i])) << "window " << i;
    }
    EXPECT_EQ(fast.indices.to_vector<int64_t>(), plain.indices.to_vector<int64_t>());
  }
}

// Distinct values 0.01 apart in a scrambled order: a 1e-3 nudge never changes a maximum.
Tensor distinct_values(const Shape& shape) {
  const int64_t n = shape_numel(shape);
  std::vector<float> v(at(n));
  for (int64_t i = 0; i < n; ++i) v[at(i)] = 0.01f * static_cast<float>((i * 37) % n);
  return from_vector(v, shape);
}

TEST(NnOps, MaxPool2dBackwardMatchesFiniteDifferences) {
  for (const Conv2dGeometry& c : kPoolCases) {
    SCOPED_TRACE(describe(c));
    const Tensor x = distinct_values({c.n, c.c, c.h, c.w});
    ASSERT_NE(x.numel() % 37, 0);
    const Conv2dGeometry g = geometry_for(x, c);
    const MaxPoolResult r = max_pool2d(x, g);
    const Tensor grad_out = randn(r.out.shape(), 60);
    const auto gv = as_double(grad_out);
    const auto grad_x = as_double(max_pool2d_backward(grad_out, r.indices, g));
    std::vector<float> xv = x.to_vector<float>();
    for (size_t j = 0; j < xv.size(); ++j) {
      const float x0 = xv[j];
      xv[j] = x0 + 1e-3f;
      const double up = dot(as_double(max_pool2d(from_vector(xv, x.shape()), g).out), gv);
      xv[j] = x0 - 1e-3f;
      const double down = dot(as_double(max_pool2d(from_vector(xv, x.shape()), g).out), gv);
      const double step = static_cast<double>(x0 + 1e-3f) - static_cast<double>(x0 - 1e-3f);
      xv[j] = x0;
      ASSERT_NEAR(grad_x[j], (up - down) / step, 1e-4) << "pixel " << j;
    }
  }
}

TEST(NnOps, DropoutMaskThresholdsTheRandStream) {
  const Shape shape{7, 11, 13};  // 1001 elements: the last Philox counter is partial
  const uint64_t seed = 77, offset = 5;
  const float p = 0.3f;
  const auto mask = dropout_mask(shape, seed, offset, p, Device::cpu()).to_vector<float>();
  const auto u = rand(shape, seed, {}, offset).to_vector<float>();
  const float keep = 1.0f / (1.0f - p);
  for (size_t i = 0; i < mask.size(); ++i) {
    ASSERT_TRUE(mask[i] == 0.0f || mask[i] == keep) << "element " << i << " is " << mask[i];
    ASSERT_EQ(mask[i] == keep, u[i] >= p) << "element " << i << ", uniform " << u[i];
  }
}

TEST(NnOps, DropoutMaskKeepsOneMinusP) {
  const int64_t n = 200003;
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const auto mask = dropout_mask({n}, 3, 0, p, Device::cpu()).to_vector<float>();
    double kept = 0;
    for (float m : mask) kept += m != 0.0f ? 1.0 : 0.0;
    const double sigma = std::sqrt(n * p * (1.0 - p));
    EXPECT_NEAR(kept, n * (1.0 - p), 5 * sigma) << "p " << p;
  }
  const auto all = dropout_mask({9}, 3, 0, 0.0f, Device::cpu()).to_vector<float>();
  EXPECT_EQ(all, std::vector<float>(9, 1.0f));
}

struct SgdCase {
  float momentum, weight_decay;
  bool nesterov;
};

TEST(NnOps, SgdUpdateMatchesTorchRule) {
  for (const SgdCase& c :
       {SgdCase{0.0f, 0.0f, false}, SgdCase{0.0f, 0.01f, false}, SgdCase{0.9f, 0.0f, false},
        SgdCase{0.9f, 0.05f, false}, SgdCase{0.9f, 0.05f, true}}) {
    SCOPED_TRACE(fmt::format("momentum {} weight_decay {} nesterov {}", c.momentum, c.weight_decay,
                             c.nesterov));
    Tensor param = randn({37}, 70);
    Tensor buf = full({37}, 123.0);  // garbage: the first step must overwrite it
    auto p = as_double(param), b = as_double(buf);
    const auto buf_before = b;
    for (int step = 0; step < 3; ++step) {
      const Tensor grad = randn({37}, 71 + static_cast<uint64_t>(step));
      const auto g = as_double(grad);
      const kernels::SgdStep s{.lr = 0.1f,
                               .momentum = c.momentum,
                               .weight_decay = c.weight_decay,
                               .nesterov = c.nesterov,
                               .first_step = step == 0};
      sgd_update_(param, grad, buf, s);
      for (size_t i = 0; i < p.size(); ++i) {
        double d = g[i] + double{s.weight_decay} * p[i];
        if (s.momentum != 0.0f) {
          b[i] = step == 0 ? d : double{s.momentum} * b[i] + d;
          d = s.nesterov ? d + double{s.momentum} * b[i] : b[i];
        }
        p[i] -= double{s.lr} * d;
      }
      expect_close(p, param, 1e-5, 1e-6);
      expect_close(c.momentum == 0.0f ? buf_before : b, buf, 1e-5, 1e-6);
    }
  }
}

TEST(NnOps, SgdUpdateWithoutMomentumAcceptsNoBuffer) {
  Tensor param = ones({3}), none;
  sgd_update_(param, full({3}, 2.0), none, {.lr = 0.5f});
  EXPECT_EQ(param.to_vector<float>(), std::vector<float>(3, 0.0f));
}

TEST(NnOps, AdamWUpdateMatchesTorchRuleOverThreeSteps) {
  const int64_t n = 41;
  Tensor param = randn({n}, 80), m = zeros({n}), v = zeros({n});
  auto p = as_double(param);
  std::vector<double> m1(at(n), 0.0), m2(at(n), 0.0);
  const kernels::AdamWStep base{
      .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f};
  for (int64_t t = 1; t <= 3; ++t) {
    const Tensor grad = randn({n}, 81 + static_cast<uint64_t>(t));
    const auto g = as_double(grad);
    kernels::AdamWStep s = base;
    s.step = t;
    adamw_update_(param, grad, m, v, s);
    const double b1 = s.beta1, b2 = s.beta2, lr = s.lr;
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1.0 - lr * double{s.weight_decay};
      m1[i] = b1 * m1[i] + (1.0 - b1) * g[i];
      m2[i] = b2 * m2[i] + (1.0 - b2) * g[i] * g[i];
      const double m_hat = m1[i] / (1.0 - std::pow(b1, t)), v_hat = m2[i] / (1.0 - std::pow(b2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + double{s.eps});
    }
    SCOPED_TRACE(fmt::format("step {}", t));
    expect_close(m1, m, 1e-5, 1e-6);
    expect_close(m2, v, 1e-5, 1e-6);
    expect_close(p, param, 1e-5, 1e-6);
  }
}

// ---- errors ----------------------------------------------------------------

using test_util::message_of;

TEST(NnOps, ConvGeometryErrorsNameOpShapeAndParameters) {
  const Tensor x = randn({1, 2, 4, 4}, 1);
  std::string msg = message_of<ValueError>([&] { conv_geometry(x, 0, 1, 0); });
  EXPECT_NE(msg.find("conv_geometry"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[1, 2, 4, 4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("kernel [0, 0]"), std::string::npos) << msg;
  msg = message_of<ValueError>([&] { conv_geometry(x, {3, 3}, {0, 1}, {0, 0}); });
  EXPECT_NE(msg.find("stride [0, 1]"), std::string::npos) << msg;
  msg = message_of<ValueError>([&] { conv_geometry(x, 3, 1, -1); });
  EXPECT_NE(msg.find("padding [-1, -1]"), std::string::npos) << msg;
  msg = message_of<ValueError>([&] { conv_geometry(x, {5, 3}, {2, 2}, {0, 0}); });
  EXPECT_NE(msg.find("does not fit"), std::string::npos) << msg;
  EXPECT_NE(msg.find("kernel [5, 3]"), std::string::npos) << msg;
  // (4 - 5) / 2 + 1 rounds to 1 in C++: the fit check must not trust out_h().
  EXPECT_THROW(conv_geometry(randn({1, 1, 4, 4}, 2), 5, 2, 0), ValueError);
  EXPECT_NO_THROW(conv_geometry(randn({1, 1, 4, 4}, 2), 5, 2, 1));
  msg = message_of<ValueError>([&] { conv_geometry(randn({2, 4, 4}, 3), 3, 1, 0); });
  EXPECT_NE(msg.find("[2, 4, 4]"), std::string::npos) << msg;
  msg = message_of<ValueError>([&] { conv_geometry(cast(x, DType::i64), 3, 1, 0); });
  EXPECT_NE(msg.find("dtype f32, got i64"), std::string::npos) << msg;
}

TEST(NnOps, OpsRejectWrongDtypesShapesAndParameters) {
  const Tensor x = randn({1, 2, 4, 4}, 1);
  const Conv2dGeometry g = conv_geometry(x, 3, 1, 1);
  std::string msg = message_of<ValueError>([&] { im2col(cast(x, DType::f16), g); });
  EXPECT_NE(msg.find("im2col: input must have dtype f32, got f16"), std::string::npos) << msg;
  msg = message_of<ValueError>([&] { im2col(randn({1, 2, 5, 4}, 2), g); });
  EXPECT_NE(msg.find("[1, 2, 5, 4]"), std::string::npos) << msg;
  msg = message_of<ValueError>([&] { col2im(randn({16, 17}, 3), g); });
  EXPECT_NE(msg.find("col2im: cols has shape [16, 17], expected [16, 18]"), std::string::npos)
      << msg;
  msg = message_of<ValueError>([&] { permute4(x, {0, 1, 1, 2}); });
  EXPECT_NE(msg.find("not a permutation"), std::string::npos) << msg;
  EXPECT_THROW(permute4(randn({2, 3}, 4), {0, 1, 2, 3}), ValueError);
  msg = message_of<ValueError>([&] { max_pool2d(x, conv_geometry(x, 2, 2, 2)); });
  EXPECT_NE(msg.find("at most half the kernel"), std::string::npos) << msg;
  const Conv2dGeometry pool = conv_geometry(x, 2, 2, 0);
  const MaxPoolResult r = max_pool2d(x, pool);
  msg = message_of<ValueError>([&] { max_pool2d_backward(r.out, r.out, pool); });
  EXPECT_NE(msg.find("indices must have dtype i64"), std::string::npos) << msg;
  Tensor bad = full(r.indices.shape(), 16.0, {.dtype = DType::i64});
  EXPECT_THROW(max_pool2d_backward(r.out, bad, pool), ValueError);
  EXPECT_THROW(dropout_mask({4}, 0, 0, 1.0f, Device::cpu()), ValueError);
  EXPECT_THROW(dropout_mask({4}, 0, 0, -0.5f, Device::cpu()), ValueError);
  Tensor param = randn({4}, 5), buf = zeros({4}), m = zeros({4}), v = zeros({3});
  msg = message_of<ValueError>([&] { sgd_update_(param, randn({5}, 6), buf, {}); });
  EXPECT_NE(msg.find("sgd_update_: shapes [4] and [5]"), std::string::npos) << msg;
  EXPECT_THROW(sgd_update_(param, randn({4}, 6), buf, {.nesterov = true}), ValueError);
  msg = message_of<ValueError>([&] { adamw_update_(param, randn({4}, 6), m, v, {}); });
  EXPECT_NE(msg.find("adamw_update_: shapes [4] and [3]"), std::string::npos) << msg;
  EXPECT_THROW(adamw_update_(param, randn({4}, 6), m, buf, {.step = 0}), ValueError);
  EXPECT_THROW(adamw_update_(param, randn({4}, 6), m, buf, {.beta1 = 1.0f}), ValueError);
}

TEST(NnOps, MixedDevicesUsePyTorchsMessage) {
  // Tensors that claim cuda:0 (never touched: the device check comes first), so the
  // message is tested on machines without a GPU too.
  float fake[64] = {};
  const Tensor gpu = from_blob(fake, {1, 1, 4, 4}, {.device = Device::cuda(0)});
  const Tensor cpu = randn({1, 1, 4, 4}, 1);
  // PyTorch's sentence, then the op (as torch names the method) and the fix.
  const auto expected = [](const char* op) {
    return fmt::format(
        "Expected all tensors to be on the same device, but found at least two devices, cuda:0 "
        "and cpu! (in {}; move the tensors to one device with .to(device))",
        op);
  };
  const Conv2dGeometry pool = conv_geometry(cpu, 2, 2, 0);
  const Tensor indices = zeros({1, 1, 2, 2}, {.dtype = DType::i64});
  const Tensor gpu_grad = from_blob(fake, {1, 1, 2, 2}, {.device = Device::cuda(0)});
  EXPECT_EQ(message_of<DeviceError>([&] { max_pool2d_backward(gpu_grad, indices, pool); }),
            expected("max_pool2d_backward"));
  Tensor gpu_param = gpu, buf = zeros({1, 1, 4, 4}), m = zeros({1, 1, 4, 4});
  EXPECT_EQ(message_of<DeviceError>([&] { sgd_update_(gpu_param, cpu, buf, {}); }),
            expected("sgd_update_"));
  EXPECT_EQ(message_of<DeviceError>([&] { adamw_update_(gpu_param, cpu, m, buf, {}); }),
            expected("adamw_update_"));
}

}  // namespace
}  // namespace ddp
