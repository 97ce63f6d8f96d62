// Every CPU op against a plain double-precision reference written here.
#include "runtime/ops/ops.h"
#include "runtime/ops/nn_ops.h"
#include "tests/unit/expect_close.h"

#include <gtest/gtest.h>

#include <cmath>

namespace ddp {
namespace {

using test_util::as_double;
using test_util::expect_close;

std::vector<double> ref_gemm(const std::vector<double>& a, const std::vector<double>& b, int64_t m,
                             int64_t n, int64_t k, bool ta, bool tb) {
  std::vector<double> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = ta ? a[static_cast<size_t>(p * m + i)] : a[static_cast<size_t>(i * k + p)];
        const double y = tb ? b[static_cast<size_t>(j * k + p)] : b[static_cast<size_t>(p * n + j)];
        acc += x * y;
      }
      c[static_cast<size_t>(i * n + j)] = acc;
    }
  }
  return c;
}

class MatmulTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(MatmulTest, MatchesReferenceForEveryTransposition) {
  const auto [ta, tb] = GetParam();
  const int64_t m = 13, n = 7, k = 29;
  const Tensor a = randn(ta ? Shape{k, m} : Shape{m, k}, 1);
  const Tensor b = randn(tb ? Shape{n, k} : Shape{k, n}, 2);
  const Tensor c = matmul(a, b, {.trans_a = ta, .trans_b = tb});
  EXPECT_EQ(c.shape(), (Shape{m, n}));
  expect_close(ref_gemm(as_double(a), as_double(b), m, n, k, ta, tb), c, 1e-5, 1e-5);
}

// Note [gemm choice]: a shape wide enough for oneDNN's sgemm (when the build has
// it), every transposition, with alpha and beta.
TEST_P(MatmulTest, WideShapesMatchTheReferenceOnEitherLibrary) {
  const auto [ta, tb] = GetParam();
  const int64_t m = 70, n = 260, k = 66;
  EXPECT_EQ(onednn_gemm(m, n, k), onednn_convolutions());
  const Tensor a = randn(ta ? Shape{k, m} : Shape{m, k}, 11);
  const Tensor b = randn(tb ? Shape{n, k} : Shape{k, n}, 12);
  Tensor out = randn({m, n}, 13);
  auto expected = ref_gemm(as_double(a), as_double(b), m, n, k, ta, tb);
  const auto before = as_double(out);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = 2.0 * expected[i] + 0.5 * before[i];
  matmul_out(a, b, out, {.trans_a = ta, .trans_b = tb, .alpha = 2.0f, .beta = 0.5f});
  expect_close(expected, out, 1e-4, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Transpose, MatmulTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

TEST(Ops, MatmulOutAccumulatesWithAlphaBeta) {
  const Tensor a = randn({5, 3}, 3), b = randn({3, 4}, 4);
  Tensor out = randn({5, 4}, 5);
  const auto before = as_double(out);
  auto expected = ref_gemm(as_double(a), as_double(b), 5, 4, 3, false, false);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = 2.0 * expected[i] + 0.5 * before[i];
  matmul_out(a, b, out, {.alpha = 2.0f, .beta = 0.5f});
  expect_close(expected, out, 1e-5, 1e-5);
}

TEST(Ops, MatmulBf16AndF16AreCloseToF32) {
  const Tensor a = randn({8, 16}, 6), b = randn({16, 5}, 7);
  const auto ref = ref_gemm(as_double(a), as_double(b), 8, 5, 16, false, false);
  for (DType d : {DType::bf16, DType::f16}) {
    const Tensor c = matmul(cast(a, d), cast(b, d));
    EXPECT_EQ(c.dtype(), d);
    expect_close(ref, cast(c, DType::f32), d == DType::bf16 ? 3e-2 : 3e-3, 5e-2);
  }
}

TEST(Ops, MatmulShapeErrorsNameOpAndShapes) {
  try {
    matmul(empty({2, 3}), empty({4, 5}));
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("matmul: shapes [2, 3] and [4, 5] cannot be multiplied"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(matmul(empty({2, 3}), empty({3, 4}, {.dtype = DType::bf16})), ValueError);
  EXPECT_THROW(matmul(empty({2, 3, 1}), empty({3, 4})), ValueError);
  EXPECT_THROW(matmul(empty({2, 3}, {.dtype = DType::i32}), empty({3, 4}, {.dtype = DType::i32})),
               ValueError);
}

// linear's parameter gradients: grad^T x and grad's column sums (on the CPU a matmul
// and a sum; CUDA's one-matmul form is a gpu test), into the memory handed in.
TEST(Ops, LinearParamGradsAreTheProductAndTheColumnSums) {
  const Tensor g = randn({6, 4}, 12), x = randn({6, 3}, 13);
  const auto ref_w = ref_gemm(as_double(g), as_double(x), 4, 3, 6, true, false);
  std::vector<double> ref_b(4, 0.0);
  const auto gv = as_double(g);
  for (size_t i = 0; i < gv.size(); ++i) ref_b[i % 4] += gv[i];
  Tensor into = empty({4, 3});
  const LinearParamGrads p = linear_param_grads(g, x, DType::f32, true, into);
  EXPECT_EQ(p.weight.data_ptr(), into.data_ptr());
  expect_close(ref_w, p.weight, 1e-5);
  expect_close(ref_b, p.bias, 1e-5);
  const LinearParamGrads q = linear_param_grads(g, x, DType::f32, false);
  expect_close(ref_w, q.weight, 1e-5);
  EXPECT_FALSE(q.bias.defined());
  // bf16 operands into f32, as a weight's gradient under autocast.
  const LinearParamGrads h =
      linear_param_grads(cast(g, DType::bf16), cast(x, DType::bf16), DType::f32, true);
  EXPECT_EQ(h.weight.dtype(), DType::f32);
  EXPECT_EQ(h.bias.dtype(), DType::f32);
  expect_close(ref_w, h.weight, 3e-2, 5e-2);
}

TEST(Ops, LinearParamGradsNameBadShapes) {
  try {
    linear_param_grads(empty({6, 4}), empty({5, 3}), DType::f32, true);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("the output's gradient [6, 4] and the input [5, 3]"),
              std::string::npos)
        << e.what();
  }
  try {
    Tensor into = empty({3, 4});
    linear_param_grads(empty({6, 4}), empty({6, 3}), DType::f32, true, into);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("memory is f32 [3, 4], expected f32 [4, 3]"),
              std::string::npos)
        << e.what();
  }
}

TEST(Ops, ElementwiseMatchReference) {
  const Tensor a = randn({6, 5}, 10), b = randn({6, 5}, 11);
  const auto x = as_double(a), y = as_double(b);
  std::vector<double> sum_ref(x.size()), diff(x.size()), prod(x.size()), scaled(x.size()),
      relu_ref(x.size()), relu_grad(x.size()), axpy_ref(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    sum_ref[i] = x[i] + y[i];
    diff[i] = x[i] - y[i];
    prod[i] = x[i] * y[i];
    scaled[i] = -1.5 * x[i];
    relu_ref[i] = x[i] > 0 ? x[i] : 0;
    relu_grad[i] = x[i] > 0 ? y[i] : 0;
    axpy_ref[i] = y[i] + 0.25 * x[i];
  }
  expect_close(sum_ref, add(a, b), 1e-6);
  expect_close(diff, sub(a, b), 1e-6);
  expect_close(prod, mul(a, b), 1e-6);
  expect_close(scaled, scale(a, -1.5f), 1e-6);
  expect_close(relu_ref, relu(a), 0);
  expect_close(relu_grad, relu_backward(b, a), 0);
  Tensor y2 = b.clone();
  axpy_(0.25f, a, y2);
  expect_close(axpy_ref, y2, 1e-6);
}

TEST(Ops, BiasAddAlongRows) {
  const Tensor x = randn({4, 3}, 12), bias = randn({3}, 13);
  const auto xv = as_double(x), bv = as_double(bias);
  std::vector<double> ref(xv.size());
  for (size_t r = 0; r < 4; ++r) {
    for (size_t c = 0; c < 3; ++c) ref[r * 3 + c] = xv[r * 3 + c] + bv[c];
  }
  expect_close(ref, add_bias_rows(x, bias), 1e-6);
  EXPECT_THROW(add_bias_rows(x, randn({4}, 1)), ValueError);
}

TEST(Ops, ExpandScalarRepeatsTheOneElement) {
  const Tensor s = full({}, 1.75);
  const Tensor e = expand_scalar(s, {2, 3});
  EXPECT_EQ(e.shape(), (Shape{2, 3}));
  EXPECT_EQ(e.to_vector<float>(), std::vector<float>(6, 1.75f));
  EXPECT_EQ(expand_scalar(from_vector<float>({-4.0f}, {1, 1}), {3}).to_vector<float>(),
            std::vector<float>(3, -4.0f));
  EXPECT_EQ(expand_scalar(s, {0, 4}).numel(), 0);
  EXPECT_THROW(expand_scalar(ones({2}), {2}), ValueError);  // two elements
  EXPECT_THROW(expand_scalar(full({}, 1, {.dtype = DType::i64}), {2}), ValueError);
}

TEST(Ops, ReductionsMatchReference) {
  const Tensor x = randn({3, 4, 5}, 14);
  const auto v = as_double(x);
  double total = 0;
  for (double e : v) total += e;
  expect_close({total}, sum(x), 1e-6, 1e-5);
  expect_close({total / 60.0}, mean(x), 1e-6, 1e-6);
  for (int64_t dim : {0, 1, 2, -1}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    const int64_t sizes[3] = {3, 4, 5};
    Shape out_shape;
    for (int64_t i = 0; i < 3; ++i) {
      if (i != d) out_shape.push_back(sizes[i]);
    }
    std::vector<double> ref(static_cast<size_t>(60 / sizes[d]), 0.0), best(ref.size(), -1e30);
    std::vector<double> arg(ref.size(), 0);
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t j = 0; j < 4; ++j) {
        for (int64_t k = 0; k < 5; ++k) {
          const int64_t idx[3] = {i, j, k};
          int64_t o = 0;
          for (int64_t q = 0; q < 3; ++q) {
            if (q != d) o = o * sizes[q] + idx[q];
          }
          const double e = v[static_cast<size_t>((i * 4 + j) * 5 + k)];
          ref[static_cast<size_t>(o)] += e;
          if (e > best[static_cast<size_t>(o)]) {
            best[static_cast<size_t>(o)] = e;
            arg[static_cast<size_t>(o)] = static_cast<double>(idx[d]);
          }
        }
      }
    }
    const Tensor s = sum(x, dim);
    EXPECT_EQ(s.shape(), out_shape);
    expect_close(ref, s, 1e-6, 1e-5);
    std::vector<double> mean_ref(ref);
    for (double& e : mean_ref) e /= static_cast<double>(sizes[d]);
    expect_close(mean_ref, mean(x, dim), 1e-6, 1e-6);
    const auto am = argmax(x, dim).to_vector<int64_t>();
    for (size_t i = 0; i < am.size(); ++i) EXPECT_EQ(am[i], static_cast<int64_t>(arg[i])) << i;
  }
  EXPECT_EQ(sum(x, 1, true).shape(), (Shape{3, 1, 5}));
  EXPECT_THROW(sum(x, 3), ValueError);
}

TEST(Ops, SoftmaxCrossEntropyForwardAndBackward) {
  const int64_t n = 6, c = 4;
  const Tensor logits = scale(randn({n, c}, 15), 3.0f);
  const Tensor labels = from_vector<int64_t>({0, 3, 1, 2, 3, 0}, {n});
  const auto x = as_double(logits);
  const auto y = labels.to_vector<int64_t>();
  double loss = 0;
  std::vector<double> probs(x.size()), grad(x.size());
  for (int64_t r = 0; r < n; ++r) {
    double denom = 0;
    for (int64_t k = 0; k < c; ++k) denom += std::exp(x[static_cast<size_t>(r * c + k)]);
    for (int64_t k = 0; k < c; ++k) {
      probs[static_cast<size_t>(r * c + k)] = std::exp(x[static_cast<size_t>(r * c + k)]) / denom;
    }
    loss += -std::log(probs[static_cast<size_t>(r * c + y[static_cast<size_t>(r)])]);
  }
  loss /= n;
  const auto result = softmax_cross_entropy(logits, labels);
  expect_close({loss}, result.loss, 1e-5);
  expect_close(probs, result.probs, 1e-5);
  // Backward against the closed form (p - onehot) / N * g, and against finite differences.
  const float g = 0.7f;
  const Tensor grad_logits = softmax_cross_entropy_backward(result.probs, labels, full({}, g));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t k = 0; k < c; ++k) {
      const size_t i = static_cast<size_t>(r * c + k);
      grad[i] = g * (probs[i] - (k == y[static_cast<size_t>(r)] ? 1.0 : 0.0)) / n;
    }
  }
  expect_close(grad, grad_logits, 1e-5);
  const double h = 1e-2;
  const auto gl = grad_logits.to_vector<float>();
  for (size_t i = 0; i < x.size(); i += 5) {
    auto plus = logits.to_vector<float>(), minus = plus;
    plus[i] += static_cast<float>(h);
    minus[i] -= static_cast<float>(h);
    const double lp = softmax_cross_entropy(from_vector(plus, {n, c}), labels).loss.item<float>();
    const double lm = softmax_cross_entropy(from_vector(minus, {n, c}), labels).loss.item<float>();
    EXPECT_NEAR(g * (lp - lm) / (2 * h), gl[i], 2e-3) << "finite difference at " << i;
  }
}

TEST(Ops, CrossEntropyIsStableForHugeLogits) {
  const Tensor logits = from_vector<float>({1000.0f, 0.0f, -1000.0f, 1000.0f}, {2, 2});
  const Tensor labels = from_vector<int64_t>({0, 1}, {2});
  const float loss = softmax_cross_entropy(logits, labels).loss.item<float>();
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, 0.0, 1e-6);
}

TEST(Ops, CrossEntropyRejectsBadLabels) {
  const Tensor logits = randn({2, 3}, 1);
  try {
    softmax_cross_entropy(logits, from_vector<int64_t>({0, 3}, {2}));
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("label 3 of row 1 is out of range for 3 classes"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(softmax_cross_entropy(logits, from_vector<int32_t>({0, 1}, {2})), ValueError);
}

// torch refuses a fill value outside the dtype ("value cannot be converted to type
// uint8_t without overflow"); converting it was undefined and wrapped silently
// (300 -> 44 in u8, 3e9 -> -2147483648 in i32, nan -> INT64_MIN in i64).
TEST(Ops, FillValuesOutsideTheDtypeAreRefused) {
  const auto refused = [](double value, DType dtype) {
    try {
      full({2}, value, {.dtype = dtype});
    } catch (const ValueError& e) {
      return std::string(e.what()).find(fmt::format("out of the range of {}", dtype_name(dtype))) !=
             std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(refused(300.0, DType::u8));
  EXPECT_TRUE(refused(-1.0, DType::u8));
  EXPECT_TRUE(refused(3e9, DType::i32));
  EXPECT_TRUE(refused(std::nan(""), DType::i64));
  EXPECT_TRUE(refused(INFINITY, DType::i32));
  EXPECT_TRUE(refused(9223372036854775808.0, DType::i64));
  EXPECT_TRUE(refused(1e39, DType::f32));
  EXPECT_TRUE(refused(70000.0, DType::f16));
  EXPECT_TRUE(refused(-3.4e38, DType::bf16));
  Tensor t = zeros({2}, {.dtype = DType::u8});
  EXPECT_THROW(fill_(t, 256.0), ValueError);
  // The edges and the specials of the float dtypes still fill.
  EXPECT_EQ(full({1}, 255.0, {.dtype = DType::u8}).item<uint8_t>(), 255);
  EXPECT_EQ(full({1}, -2147483648.0, {.dtype = DType::i32}).item<int32_t>(), INT32_MIN);
  EXPECT_EQ(full({1}, -9223372036854775808.0, {.dtype = DType::i64}).item<int64_t>(), INT64_MIN);
  EXPECT_EQ(full({1}, 2.9, {.dtype = DType::i32}).item<int32_t>(), 2);
  EXPECT_EQ(full({1}, 65504.0, {.dtype = DType::f16}).item_double(), 65504.0);
  EXPECT_TRUE(std::isinf(full({1}, -INFINITY, {.dtype = DType::bf16}).item_double()));
  EXPECT_TRUE(std::isnan(full({1}, std::nan("")).item<float>()));
}

TEST(Ops, CastsRoundTrip) {
  const Tensor x = randn({100}, 16);
  const auto v = x.to_vector<float>();
  const auto bf = cast(x, DType::bf16).to_vector<BFloat16>();
  const auto hf = cast(x, DType::f16).to_vector<Half>();
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(bf[i].bits, float_to_bf16(v[i]));
    EXPECT_EQ(hf[i].bits, float_to_f16(v[i]));
  }
  const Tensor back = cast(cast(x, DType::bf16), DType::f32);
  expect_close(std::vector<double>(v.begin(), v.end()), back, 1.0 / 128);
  EXPECT_EQ(cast(from_vector<float>({2.7f, -1.2f}, {2}), DType::i32).to_vector<int32_t>(),
            (std::vector<int32_t>{2, -1}));
  EXPECT_EQ(cast(from_vector<int64_t>({5, 255}, {2}), DType::u8).to_vector<uint8_t>(),
            (std::vector<uint8_t>{5, 255}));
}

TEST(Ops, DeviceMismatchUsesPyTorchsMessage) {
  // A tensor that claims cuda:0 (never touched: the device check comes first), so
  // the message is tested on machines without a GPU too.
  float fake[4] = {};
  const Tensor gpu = from_blob(fake, {4}, {.device = Device::cuda(0)});
  const Tensor cpu = randn({4}, 1);
  // PyTorch's sentence, then the op (as torch names the method) and the fix.
  const auto expected = [](const char* devices, const char* op) {
    return fmt::format(
        "Expected all tensors to be on the same device, but found at least two devices, {}! (in "
        "{}; move the tensors to one device with .to(device))",
        devices, op);
  };
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const DeviceError& e) {
      return std::string(e.what());
    }
    return std::string("no DeviceError");
  };
  EXPECT_EQ(message([&] { add(gpu, cpu); }), expected("cuda:0 and cpu", "add"));
  EXPECT_EQ(message([&] { mul(gpu, cpu); }), expected("cuda:0 and cpu", "mul"));
  EXPECT_EQ(message([&] {
              matmul(gpu.reshape({2, 2}), cpu.reshape({2, 2}));
            }),
            expected("cuda:0 and cpu", "matmul"));
  EXPECT_EQ(message([&] { relu_backward(gpu, cpu); }), expected("cuda:0 and cpu", "relu_backward"));
  EXPECT_EQ(message([&] { add(cpu, gpu); }), expected("cpu and cuda:0", "add"));
  int64_t fake_labels[2] = {};
  const Tensor gpu_labels =
      from_blob(fake_labels, {2}, {.dtype = DType::i64, .device = Device::cuda(0)});
  EXPECT_EQ(message([&] {
              softmax_cross_entropy(cpu.reshape({2, 2}), gpu_labels);
            }),
            expected("cpu and cuda:0", "softmax_cross_entropy"));
  const Tensor a = randn({2}, 1), b = randn({2}, 2);
  EXPECT_NO_THROW(check_same_device({&a, &b}));
}

}  // namespace
}  // namespace ddp
