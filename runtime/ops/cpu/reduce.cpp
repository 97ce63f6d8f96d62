// CPU reductions, accumulated in double so they also serve as references.
#include "runtime/ops/cpu/clones.h"
#include "runtime/ops/kernels.h"
#include "runtime/ops/mixed_math.h"

#include <cmath>
#include <limits>
#include <vector>

namespace ddp::kernels::cpu {

void sum_all(const Tensor& x, Tensor& out) {
  const float* p = x.data<float>();
  double acc = 0.0;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) acc += p[i];
  *out.data<float>() = static_cast<float>(acc);
}

DDP_CPU_CLONES
void sum_dim(const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& out) {
  const float* p = x.data<float>();
  float* z = out.data<float>();
  std::vector<double> acc(static_cast<size_t>(inner));
  for (int64_t o = 0; o < outer; ++o) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < n; ++j) {
      const float* row = p + (o * n + j) * inner;
      for (int64_t i = 0; i < inner; ++i) acc[static_cast<size_t>(i)] += row[i];
    }
    for (int64_t i = 0; i < inner; ++i)
      z[o * inner + i] = static_cast<float>(acc[static_cast<size_t>(i)]);
  }
}

void argmax_dim(const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& out) {
  const float* p = x.data<float>();
  int64_t* z = out.data<int64_t>();
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      int64_t best = 0;
      float best_value = p[o * n * inner + i];
      for (int64_t j = 1; j < n; ++j) {
        const float v = p[(o * n + j) * inner + i];
        if (v > best_value || (std::isnan(v) && !std::isnan(best_value))) {
          best = j;
          best_value = v;
        }
      }
      z[o * inner + i] = best;
    }
  }
}

DDP_CPU_CLONES
void softmax_xent_forward(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& probs) {
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const float* x = logits.data<float>();
  const int64_t* y = labels.data<int64_t>();
  float* pr = probs.data<float>();
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t label = y[r];
    DDP_CHECK(label >= 0 && label < classes,
              "cross_entropy: label {} of row {} is out of range for {} classes (valid: 0 to {})",
              label, r, classes, classes - 1);
    const float* row = x + r * classes;
    float max_value = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < classes; ++c) max_value = std::max(max_value, row[c]);
    double denom = 0.0;
    for (int64_t c = 0; c < classes; ++c)
      denom += std::exp(static_cast<double>(row[c] - max_value));
    for (int64_t c = 0; c < classes; ++c) {
      pr[r * classes + c] =
          static_cast<float>(std::exp(static_cast<double>(row[c] - max_value)) / denom);
    }
    total += std::log(denom) - static_cast<double>(row[label] - max_value);
  }
  *loss.data<float>() = static_cast<float>(total / static_cast<double>(rows));
}

DDP_CPU_CLONES
void softmax_xent_backward(const Tensor& probs, const Tensor& labels, const Tensor& grad_loss,
                           Tensor& grad_logits) {
  const int64_t rows = probs.size(0), classes = probs.size(1);
  const float* pr = probs.data<float>();
  const int64_t* y = labels.data<int64_t>();
  float* g = grad_logits.data<float>();
  const float scale = *grad_loss.data<float>() / static_cast<float>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    DDP_CHECK(y[r] >= 0 && y[r] < classes,
              "cross_entropy_backward: label {} of row {} is out of range for {} classes", y[r], r,
              classes);
    for (int64_t c = 0; c < classes; ++c) {
      const float onehot = c == y[r] ? 1.0f : 0.0f;
      g[r * classes + c] = scale * (pr[r * classes + c] - onehot);
    }
  }
}

namespace {

// Element i of a 16-bit tensor as f32.
float load16(const Tensor& t, const uint16_t* p, int64_t i) {
  return t.dtype() == DType::bf16 ? bf16_to_float(p[i]) : f16_to_float(p[i]);
}
uint16_t round16(DType dtype, float v) {
  return dtype == DType::bf16 ? float_to_bf16(v) : float_to_f16(v);
}

}  // namespace

// Note [fused classifier] (ops.h): the row's maximum and sum of exponentials in double,
// as softmax_xent_forward, keeping only lse = max + log(sum).
void softmax_xent_lse_forward(const Tensor& logits, const Tensor& labels, Tensor& loss,
                              Tensor& lse) {
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const auto* x = static_cast<const uint16_t*>(logits.data_ptr());
  const int64_t* y = labels.data<int64_t>();
  float* row_lse = lse.data<float>();
  double total = 0.0;
  std::vector<float> row(static_cast<size_t>(classes));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t label = y[r];
    DDP_CHECK(label >= 0 && label < classes,
              "cross_entropy: label {} of row {} is out of range for {} classes (valid: 0 to {})",
              label, r, classes, classes - 1);
    float max_value = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < classes; ++c) {
      row[static_cast<size_t>(c)] = load16(logits, x, r * classes + c);
      max_value = std::max(max_value, row[static_cast<size_t>(c)]);
    }
    double denom = 0.0;
    for (float v : row) denom += std::exp(static_cast<double>(v - max_value));
    const double log_sum = static_cast<double>(max_value) + std::log(denom);
    row_lse[r] = static_cast<float>(log_sum);
    total += log_sum - static_cast<double>(row[static_cast<size_t>(label)]);
  }
  *loss.data<float>() = static_cast<float>(total / static_cast<double>(rows));
}

void softmax_xent_lse_backward(const Tensor& logits, const Tensor& lse, const Tensor& labels,
                               const Tensor& grad_loss, Tensor& grad_logits) {
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const auto* x = static_cast<const uint16_t*>(logits.data_ptr());
  const float* row_lse = lse.data<float>();
  const int64_t* y = labels.data<int64_t>();
  auto* g = static_cast<uint16_t*>(grad_logits.data_ptr());
  const float scale = *grad_loss.data<float>() / static_cast<float>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    DDP_CHECK(y[r] >= 0 && y[r] < classes,
              "cross_entropy_backward: label {} of row {} is out of range for {} classes", y[r], r,
              classes);
    for (int64_t c = 0; c < classes; ++c) {
      const int64_t i = r * classes + c;
      g[i] = round16(grad_logits.dtype(),
                     math::xent_grad(load16(logits, x, i), row_lse[r], c == y[r], scale));
    }
  }
}

}  // namespace ddp::kernels::cpu
