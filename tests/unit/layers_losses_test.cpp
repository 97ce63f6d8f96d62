// The everyday activations, layers and losses (runtime/nn/layers.h, autograd/functions.h):
// values against closed forms computed here in double (the formulas torch documents),
// gradients against central finite differences, the modules against their functional
// forms, and the errors for mismatched shapes.
#include "runtime/autograd/autograd.h"
#include "runtime/autograd/functions.h"
#include "runtime/nn/layers.h"
#include "runtime/ops/ops.h"
#include "tests/unit/gradcheck.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp {
namespace {

namespace F = functional;

const std::vector<float> kPoints = {-30.0f, -4.5f, -1.0f, -0.25f, 0.0f, 0.3f, 1.0f, 2.5f, 40.0f};

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

void expect_values(const Tensor& got, const std::vector<double>& want, const char* what) {
  const auto g = got.to_vector<float>();
  ASSERT_EQ(g.size(), want.size()) << what;
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_NEAR(g[i], want[i], 2e-7 * (1.0 + std::fabs(want[i]))) << what << " at " << kPoints[i];
  }
}

TEST(Activations, ValuesAndDerivativesAreTheClosedForms) {
  const Tensor x = from_vector(kPoints, {static_cast<int64_t>(kPoints.size())});
  std::vector<double> tanh_v, sig_v, silu_v, abs_v, tanh_d, sig_d, silu_d, abs_d;
  for (float p : kPoints) {
    const double v = p, s = sigmoid(v);
    tanh_v.push_back(std::tanh(v));
    sig_v.push_back(s);
    silu_v.push_back(v * s);
    abs_v.push_back(std::fabs(v));
    tanh_d.push_back(1.0 - std::tanh(v) * std::tanh(v));
    sig_d.push_back(s * (1.0 - s));
    silu_d.push_back(s * (1.0 + v * (1.0 - s)));
    abs_d.push_back(v > 0 ? 1.0 : (v < 0 ? -1.0 : 0.0));  // torch: sign, 0 at 0
  }
  expect_values(F::tanh(x), tanh_v, "tanh");
  expect_values(F::sigmoid(x), sig_v, "sigmoid");
  expect_values(F::silu(x), silu_v, "silu");
  expect_values(F::abs(x), abs_v, "abs");
  const Tensor ones_like_x = ones(x.shape());
  using kernels::UnaryOp;
  expect_values(unary_backward(UnaryOp::tanh, ones_like_x, x), tanh_d, "tanh'");
  expect_values(unary_backward(UnaryOp::sigmoid, ones_like_x, x), sig_d, "sigmoid'");
  expect_values(unary_backward(UnaryOp::silu, ones_like_x, x), silu_d, "silu'");
  expect_values(unary_backward(UnaryOp::abs, ones_like_x, x), abs_d, "abs'");
  // bf16: the f32 value rounded once (Note [16-bit on the cpu]).
  const Tensor xb = cast(x, DType::bf16);
  EXPECT_EQ(cast(F::silu(xb), DType::f32).to_vector<float>(),
            cast(cast(F::silu(cast(xb, DType::f32)), DType::bf16), DType::f32).to_vector<float>());
}

TEST(Activations, GradientsMatchFiniteDifferences) {
  using test_util::gradcheck;
  // abs away from its kink: inputs of |x| >= 0.1.
  const Tensor x = add(scale(rand({4, 5}, 3), 2.0f), full({4, 5}, 0.1));
  gradcheck([](const auto& in) { return F::tanh(in[0]); }, {randn({4, 5}, 1)});
  gradcheck([](const auto& in) { return F::sigmoid(in[0]); }, {randn({4, 5}, 2)});
  gradcheck([](const auto& in) { return F::silu(in[0]); }, {randn({4, 5}, 4)});
  gradcheck([](const auto& in) { return F::abs(in[0]); }, {sub(zeros({4, 5}), x)});
}

TEST(Losses, ValuesAreTorchsFormulas) {
  const std::vector<float> a = {0.5f, -2.0f, 3.0f, 0.0f, -0.75f, 12.0f};
  const std::vector<float> b = {1.0f, 0.0f, 1.0f, 0.5f, 0.25f, 0.0f};
  const Tensor x = from_vector(a, {2, 3}), y = from_vector(b, {2, 3});
  double mse = 0, l1 = 0, bce = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = a[i] - b[i];
    mse += d * d;
    l1 += std::fabs(d);
    // -[y log s(x) + (1 - y) log(1 - s(x))], in its stable form
    bce += std::max<double>(a[i], 0.0) - a[i] * b[i] + std::log1p(std::exp(-std::fabs(a[i])));
  }
  const double n = static_cast<double>(a.size());
  EXPECT_NEAR(F::mse_loss(x, y).item<float>(), mse / n, 1e-6);
  EXPECT_NEAR(F::l1_loss(x, y).item<float>(), l1 / n, 1e-6);
  EXPECT_NEAR(F::binary_cross_entropy_with_logits(x, y).item<float>(), bce / n, 1e-6);
  EXPECT_NEAR(nn::BCEWithLogitsLoss()(x, y).item<float>(), bce / n, 1e-6);
  // The textbook form agrees where it is stable.
  const double x0 = 0.5, y0 = 1.0;
  EXPECT_NEAR(std::max(x0, 0.0) - x0 * y0 + std::log1p(std::exp(-std::fabs(x0))),
              -(y0 * std::log(sigmoid(x0)) + (1 - y0) * std::log(1 - sigmoid(x0))), 1e-12);
}

TEST(Losses, GradientsMatchFiniteDifferences) {
  using test_util::gradcheck;
  const Tensor target = rand({3, 4}, 9);  // in [0, 1): a BCE target too
  gradcheck([&](const auto& in) { return F::mse_loss(in[0], in[1]); },
            {randn({3, 4}, 5), randn({3, 4}, 6)});
  gradcheck([&](const auto& in) { return F::l1_loss(in[0], target); },
            {add(target, add(scale(rand({3, 4}, 7), 1.0f), full({3, 4}, 0.2)))});
  gradcheck([&](const auto& in) { return F::binary_cross_entropy_with_logits(in[0], in[1]); },
            {scale(randn({3, 4}, 8), 3.0f), target});
}

TEST(Losses, MismatchedShapesNameBoth) {
  try {
    F::mse_loss(randn({4, 1}, 1), randn({4}, 2));
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("mse_loss: input [4, 1] and target [4] must have one "
                                         "shape"),
              std::string::npos)
        << e.what();
  }
}

TEST(Modules, LayerNormAndEmbeddingAreTheFunctionalOps) {
  nn::LayerNorm ln(6);
  EXPECT_EQ(ln.named_parameters().size(), 2u);
  EXPECT_EQ(ln.extra_repr(), "(6,), eps=1e-05");
  const Tensor x = randn({3, 6}, 11);
  EXPECT_EQ(ln.forward(x).to_vector<float>(),
            F::layer_norm(x, ln.weight, ln.bias).to_vector<float>());
  Generator gen(5);
  nn::Embedding emb(1000, 8, gen);
  const auto w = emb.weight.to_vector<float>();
  double mean = 0, sq = 0;
  for (float v : w) mean += v, sq += static_cast<double>(v) * v;
  mean /= static_cast<double>(w.size());
  EXPECT_NEAR(mean, 0.0, 0.03);  // N(0, 1), torch's default
  EXPECT_NEAR(sq / static_cast<double>(w.size()), 1.0, 0.05);
  const Tensor ids = from_vector<int64_t>({3, 999, 0}, {3});
  const Tensor rows = emb.forward(ids);
  EXPECT_EQ(rows.shape(), Shape({3, 8}));
  EXPECT_EQ(rows.slice(1, 2).to_vector<float>(), emb.weight.slice(999, 1000).to_vector<float>());
  nn::Sequential net;
  net.add(std::make_shared<nn::Tanh>()).add(std::make_shared<nn::SiLU>());
  net.add(std::make_shared<nn::Sigmoid>());
  EXPECT_EQ(net.forward(x).to_vector<float>(), F::sigmoid(F::silu(F::tanh(x))).to_vector<float>());
}

// Parity with PyTorch 1.13 (Debian's python3-torch): on x = [[-2, -0.5, 0], [0.3, 1.7,
// 3.1]] each op's value and the gradient of sum(op(x) * w) (losses: of the loss) as
// torch computes them, printed with 9 significant digits by
//   x.requires_grad_(); y = f(x); (y * w).sum().backward(); print(y, x.grad)
// w = [[0.5, -1, 2], [1.5, -0.25, 0.75]], targets t = [[0.1, -1.2, 0.5], [2, 0, 1]],
// BCE targets b = [[0, 1, 0.25], [0.5, 1, 0]]; LayerNorm(3) with weight [1, 0.5, -2]
// and bias [0.1, 0, -0.3].
struct TorchCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::vector<double> value, grad;
};

TEST(PyTorchParity, ActivationsLossesAndLayerNorm) {
  const Tensor w = from_vector<float>({0.5f, -1, 2, 1.5f, -0.25f, 0.75f}, {2, 3});
  const Tensor t = from_vector<float>({0.1f, -1.2f, 0.5f, 2, 0, 1}, {2, 3});
  const Tensor b = from_vector<float>({0, 1, 0.25f, 0.5f, 1, 0}, {2, 3});
  auto ln = std::make_shared<nn::LayerNorm>(3);
  copy_(ln->weight, from_vector<float>({1, 0.5f, -2}, {3}));
  copy_(ln->bias, from_vector<float>({0.1f, 0, -0.3f}, {3}));
  const std::vector<TorchCase> cases = {
      {"tanh",
       [](const Tensor& x) { return F::tanh(x); },
       {-0.964027584, -0.462117165, 0.0, 0.291312635, 0.935409069, 0.995949388},
       {0.035325408, -0.786447704, 2.0, 1.37270546, -0.0312524699, 0.00606361311}},
      {"sigmoid",
       [](const Tensor& x) { return F::sigmoid(x); },
       {0.119202919, 0.377540678, 0.5, 0.574442506, 0.845534801, 0.956892729},
       {0.0524967909, -0.23500371, 0.5, 0.366687477, -0.0326514244, 0.0309367757}},
      {"silu",
       [](const Tensor& x) { return F::silu(x); },
       {-0.238405839, -0.188770339, 0.0, 0.172332764, 1.43740916, 2.96636748},
       {-0.0453921258, -0.260038823, 1.0, 0.971670032, -0.266891122, 0.813573539}},
      {"abs",
       [](const Tensor& x) { return F::abs(x); },
       {2.0, 0.5, 0.0, 0.300000012, 1.70000005, 3.0999999},
       {-0.5, 1.0, 0.0, 1.5, -0.25, 0.75}},
      {"mse_loss",
       [&](const Tensor& x) { return F::mse_loss(x, t); },
       {2.55666661},
       {-0.699999988, 0.233333349, -0.166666672, -0.566666722, 0.566666722, 0.699999988}},
      {"l1_loss",
       [&](const Tensor& x) { return F::l1_loss(x, t); },
       {1.46666658},
       {-0.166666672, 0.166666672, -0.166666672, -0.166666672, 0.166666672, 0.166666672}},
      {"binary_cross_entropy_with_logits",
       [&](const Tensor& x) { return F::binary_cross_entropy_with_logits(x, b); },
       {0.968392909},
       {0.0198671538, -0.103743218, 0.0416666679, 0.012407084, -0.0257441998, 0.159482121}},
      {"LayerNorm",
       [&](const Tensor& x) { return (*ln)(x); },
       {-1.27280343, 0.196114808, -2.26114798, -1.12474024, -1.78858173e-08, -2.74948001},
       {-0.429908276, 1.71976566, -1.28985715, 0.0364607573, -0.0729012489, 0.0364403725}},
  };
  for (const auto& c : cases) {
    Tensor x = from_vector<float>({-2, -0.5f, 0, 0.3f, 1.7f, 3.1f}, {2, 3});
    set_requires_grad(x, true);
    const Tensor y = c.op(x);
    backward(y.dim() == 0 ? y : F::sum(F::mul(y, w)));
    const auto value = y.to_vector<float>();
    const auto g = grad(x).to_vector<float>();
    ASSERT_EQ(value.size(), c.value.size()) << c.name;
    for (size_t i = 0; i < value.size(); ++i) {
      EXPECT_NEAR(value[i], c.value[i], 1e-6 * (1 + std::fabs(c.value[i]))) << c.name << " " << i;
      EXPECT_NEAR(g[i], c.grad[i], 1e-6 * (1 + std::fabs(c.grad[i]))) << c.name << "' " << i;
    }
  }
  // LayerNorm's parameter gradients, torch's weight.grad and bias.grad.
  const auto wg = grad(ln->weight).to_vector<float>(), bg = grad(ln->bias).to_vector<float>();
  const std::vector<double> torch_wg = {-2.52351213, -0.392229617, 2.87970304};
  const std::vector<double> torch_bg = {2.0, -1.25, 2.75};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(wg[i], torch_wg[i], 1e-6 * (1 + std::fabs(torch_wg[i])));
    EXPECT_NEAR(bg[i], torch_bg[i], 1e-6 * (1 + std::fabs(torch_bg[i])));
  }
}

}  // namespace
}  // namespace ddp
