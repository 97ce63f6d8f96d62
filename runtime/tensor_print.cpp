// PyTorch-style printing: tensor([[1.0000, 2.5000],
//                                 [3.0000, 4.0000]], device='cuda:0')
// More than 1000 elements are summarized with the first and last 3 entries of
// each dimension, as torch does.
#include "runtime/ops/ops.h"
#include "runtime/tensor.h"

#include <algorithm>
#include <cmath>

namespace ddp {
namespace {

constexpr int64_t kThreshold = 1000;
constexpr int64_t kEdgeItems = 3;

struct Formatter {
  bool floating = true;
  bool all_integral = true;
  bool scientific = false;
  size_t width = 1;

  std::string format(double v) const {
    if (!floating) return fmt::format("{}", static_cast<int64_t>(v));
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    if (scientific) return fmt::format("{:.4e}", v);
    if (all_integral) return fmt::format("{:.0f}.", v);
    return fmt::format("{:.4f}", v);
  }
};

Formatter make_formatter(const std::vector<double>& values, bool floating) {
  Formatter f;
  f.floating = floating;
  double max_abs = 0.0, min_abs = INFINITY;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    if (v != std::floor(v)) f.all_integral = false;
    max_abs = std::max(max_abs, std::fabs(v));
    if (v != 0.0) min_abs = std::min(min_abs, std::fabs(v));
  }
  if (floating && !values.empty()) {
    f.scientific =
        max_abs >= 1e8 || (!f.all_integral && (min_abs < 1e-4 || max_abs / min_abs > 1e5));
  }
  for (double v : values) f.width = std::max(f.width, f.format(v).size());
  return f;
}

struct Printer {
  const std::vector<double>& values;
  const Shape& shape;
  const Formatter& fmt;
  bool summarize;
  std::string out;

  // Prints the sub-tensor of dimension `d` starting at flat index `base`.
  void print(size_t d, int64_t base, int indent) {
    if (d == shape.size()) {
      const std::string s = fmt.format(values[static_cast<size_t>(base)]);
      out += std::string(fmt.width - s.size(), ' ') + s;
      return;
    }
    int64_t stride = 1;
    for (size_t k = d + 1; k < shape.size(); ++k) stride *= shape[k];
    const int64_t n = shape[d];
    out += '[';
    for (int64_t i = 0; i < n; ++i) {
      if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
        out += (d + 1 == shape.size()) ? "..., " : "...,\n" + std::string(indent + 1, ' ');
        i = n - kEdgeItems;
      }
      print(d + 1, base + i * stride, indent + 1);
      if (i + 1 < n) {
        out += ',';
        if (d + 1 == shape.size()) {
          out += ' ';
        } else {
          out += std::string(shape.size() - d - 1, '\n') + std::string(indent + 1, ' ');
        }
      }
    }
    out += ']';
  }
};

std::vector<double> host_values(const Tensor& t) {
  const Tensor host = t.dtype() == DType::i64 ? t.cpu() : cast(t.cpu(), DType::f32);
  std::vector<double> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::i64) {
    const auto* p = static_cast<const int64_t*>(host.data_ptr());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(p[i]);
  } else {
    const auto* p = static_cast<const float*>(host.data_ptr());
    for (size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  }
  return out;
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  const std::vector<double> values = host_values(*this);
  const bool summarize = numel() > kThreshold;
  // Width is computed over all values (fine for the sizes people print).
  const Formatter f = make_formatter(values, is_floating(dtype()));
  Printer p{values, shape(), f, summarize, "tensor("};
  if (numel() == 0 && dim() > 0) {
    p.out += "[]";
  } else {
    p.print(0, 0, static_cast<int>(std::string("tensor(").size()));
  }
  if (device() != Device::cpu()) p.out += fmt::format(", device='{}'", device().str());
  if (dtype() != DType::f32 && dtype() != DType::i64) {
    p.out += fmt::format(", dtype={}", dtype_name(dtype()));
  }
  if (numel() == 0 && dim() > 0 && shape() != Shape{0}) p.out += ", size=" + shape_str(shape());
  return p.out + ")";
}

}  // namespace ddp
