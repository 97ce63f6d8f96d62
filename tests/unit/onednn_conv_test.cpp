// oneDNN's CPU convolutions (Note [oneDNN convolutions]) against the im2col + GEMM
// path they replace: forward, input gradient, weight and bias gradients, for odd
// shapes, strides, padding, one input channel, rectangular kernels and batches of
// one and none; plus the gradient destination and the errors of the checked ops.
#include "runtime/autograd/autograd.h"
#include "runtime/autograd/functions.h"
#include "runtime/error.h"
#include "runtime/ops/nn_ops.h"
#include "runtime/ops/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace ddp {
namespace {

struct Case {
  int64_t n, c, h, w, c_out, kh, kw, stride, pad;
};

// max |a - b| over max(1, max |b|): both paths sum hundreds to thousands of f32
// products in different orders, so their rounding differs by a few ulp of the
// largest entries; a wrong tap or layout errs by O(1).
double max_rel_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const auto av = a.to_vector<float>(), bv = b.to_vector<float>();
  double worst = 0.0, scale = 1.0;
  for (size_t i = 0; i < av.size() && i < bv.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(av[i]) - bv[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(bv[i])));
  }
  return worst / scale;
}

class OneDnnConv : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!onednn_convolutions()) {
      GTEST_SKIP() << "this build has no oneDNN (configure found no libdnnl-dev; "
                      "deploy/install-deps.sh installs it) or DDP_ONEDNN=0 is set";
    }
  }
};

TEST_F(OneDnnConv, EveryDirectionEqualsIm2colAndGemm) {
  const Case cases[] = {
      {3, 2, 7, 5, 4, 3, 3, 1, 1},      // odd image, channel counts below oneDNN's block
      {2, 3, 9, 8, 5, 3, 3, 2, 0},      // stride 2, no padding
      {2, 3, 9, 8, 5, 3, 3, 2, 1},      // stride 2 with padding
      {4, 1, 28, 28, 32, 3, 3, 1, 1},   // the CNN's first layer (one input channel)
      {2, 32, 14, 14, 64, 3, 3, 1, 1},  // the CNN's second layer (blocked layouts)
      {1, 17, 6, 11, 19, 5, 3, 1, 2},   // rectangular kernel, one image, 17 and 19 channels
      {2, 4, 5, 5, 3, 1, 1, 1, 0},      // 1x1
  };
  uint64_t seed = 100;
  for (const Case& k : cases) {
    SCOPED_TRACE(fmt::format("x [{}, {}, {}, {}], c_out {}, kernel {}x{}, stride {}, pad {}", k.n,
                             k.c, k.h, k.w, k.c_out, k.kh, k.kw, k.stride, k.pad));
    const Tensor x = randn({k.n, k.c, k.h, k.w}, seed++);
    const Tensor weight = randn({k.c_out, k.c, k.kh, k.kw}, seed++);
    const Tensor bias = randn({k.c_out}, seed++);
    const auto g = conv_geometry(x, {k.kh, k.kw}, {k.stride, k.stride}, {k.pad, k.pad});
    const Tensor gy = randn({k.n, k.c_out, g.out_h(), g.out_w()}, seed++);

    // The reference: im2col rows [N*HW, K] times W^T, in [N, HW, C_out] order.
    const Tensor cols = im2col(x, g);
    const Tensor w2d = weight.reshape({k.c_out, k.c * k.kh * k.kw});
    const Tensor rows = add_bias_rows(matmul(cols, w2d, {.trans_b = true}), bias);
    const Tensor ref_y = permute4(rows.reshape({k.n, g.out_h(), g.out_w(), k.c_out}), {0, 3, 1, 2});
    const Tensor grows = permute4(gy, {0, 2, 3, 1}).reshape({cols.size(0), k.c_out});
    const Tensor ref_gx = col2im(matmul(grows, w2d), g);
    const Tensor ref_gw = matmul(grows, cols, {.trans_a = true}).reshape(weight.shape());
    const Tensor ref_gb = sum(grows, 0);

    EXPECT_LT(max_rel_diff(conv2d_onednn(x, weight, bias, g), ref_y), 1e-5);
    EXPECT_LT(
        max_rel_diff(
            conv2d_onednn(x, weight, Tensor(), g),
            permute4(
                matmul(cols, w2d, {.trans_b = true}).reshape({k.n, g.out_h(), g.out_w(), k.c_out}),
                {0, 3, 1, 2})),
        1e-5);
    EXPECT_LT(max_rel_diff(conv2d_backward_input_onednn(gy, weight, g), ref_gx), 1e-5);
    for (bool with_bias : {true, false}) {
      const auto grads = conv2d_backward_params_onednn(gy, x, weight.shape(), g, with_bias);
      EXPECT_LT(max_rel_diff(grads.weight, ref_gw), 1e-5);
      EXPECT_EQ(grads.bias.defined(), with_bias);
      if (with_bias) {
        EXPECT_LT(max_rel_diff(grads.bias, ref_gb), 1e-5);
      }
    }
  }
}

TEST_F(OneDnnConv, EmptyBatchGivesZeroParameterGradients) {
  const Tensor x = randn({0, 3, 6, 6}, 7), weight = randn({4, 3, 3, 3}, 8);
  const auto g = conv_geometry(x, 3, 1, 1);
  EXPECT_EQ(conv2d_onednn(x, weight, Tensor(), g).shape(), (Shape{0, 4, 6, 6}));
  const Tensor gy = randn({0, 4, 6, 6}, 9);
  EXPECT_EQ(conv2d_backward_input_onednn(gy, weight, g).shape(), x.shape());
  Tensor dirty = full({4, 3, 3, 3}, 5.0);  // a destination is overwritten, not accumulated
  const auto grads =
      conv2d_backward_params_onednn(gy, x, weight.shape(), g, true, {dirty, Tensor()});
  for (float v : grads.weight.to_vector<float>()) EXPECT_EQ(v, 0.0f);
  for (float v : grads.bias.to_vector<float>()) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(grads.weight.data_ptr(), dirty.data_ptr());
}

// Note [gradient destinations]: the weight gradient lands in DDP's bucket slice.
TEST_F(OneDnnConv, WeightGradientIsWrittenIntoItsDestination) {
  Tensor x = randn({2, 3, 8, 8}, 11), weight = randn({5, 3, 3, 3}, 12), bias = randn({5}, 13);
  set_requires_grad(weight, true);
  set_requires_grad(bias, true);
  const Tensor expected_gw = [&] {
    Tensor w2 = weight.clone();
    set_requires_grad(w2, true);
    backward(functional::sum(functional::conv2d(x, w2, bias, {1, 1})));
    return grad(w2);
  }();
  set_grad(bias, Tensor());
  Tensor destination = full({5, 3, 3, 3}, -1.0);
  set_gradient_destination(weight, destination);
  backward(functional::sum(functional::conv2d(x, weight, bias, {1, 1})));
  EXPECT_EQ(grad(weight).data_ptr(), destination.data_ptr());
  EXPECT_LT(max_rel_diff(destination, expected_gw), 1e-6);
}

TEST_F(OneDnnConv, BadShapesNameTheValues) {
  const Tensor x = randn({2, 3, 6, 6}, 1), weight = randn({4, 2, 3, 3}, 2);
  const auto g = conv_geometry(x, 3, 1, 1);
  try {
    conv2d_onednn(x, weight, Tensor(), g);
    FAIL() << "a weight with 2 input channels for a 3-channel input was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 2, 3, 3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 3, 6, 6]"), std::string::npos) << e.what();
  }
  const Tensor good_w = randn({4, 3, 3, 3}, 3);
  EXPECT_THROW(conv2d_onednn(x, good_w, randn({5}, 4), g), ValueError);  // bias of 5 for 4
  EXPECT_THROW(conv2d_backward_input_onednn(randn({2, 4, 5, 5}, 5), good_w, g), ValueError);
}

}  // namespace
}  // namespace ddp
