#include "runtime/nn/layers.h"

#include "runtime/ops/ops.h"

#include <cmath>
#include <mutex>
#include <typeinfo>

namespace ddp::nn {
namespace {

// U(-bound, bound) from the generator's next counters.
Tensor uniform(const Shape& shape, double bound, Generator& gen) {
  const uint64_t offset = gen.take(shape_numel(shape));
  Tensor u = rand(shape, gen.seed(), {}, offset);
  Tensor out = scale(u, static_cast<float>(2.0 * bound));
  Tensor shift = full(shape, -bound);
  return ddp::add(out, shift);
}

}  // namespace

Linear::Linear(int64_t in, int64_t out, Generator& gen, bool with_bias) {
  DDP_CHECK(in > 0 && out > 0, "Linear: in_features {} and out_features {} must be positive", in,
            out);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight = register_parameter("weight", uniform({out, in}, bound, gen));
  if (with_bias) bias = register_parameter("bias", uniform({out}, bound, gen));
}

Tensor Linear::forward(const Tensor& x) {
  return functional::linear(x, weight, bias);
}

void Linear::rebind_members() {
  weight = own_parameter("weight");
  bias = own_parameter("bias");
}

std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", weight.size(1), weight.size(0),
                     bias.defined() ? "True" : "False");
}

LayerNorm::LayerNorm(int64_t dim, float eps) : eps_(eps) {
  DDP_CHECK(dim > 0, "LayerNorm: dim {} must be positive", dim);
  DDP_CHECK(eps > 0, "LayerNorm: eps {} must be positive", eps);
  weight = register_parameter("weight", ones({dim}));
  bias = register_parameter("bias", zeros({dim}));
}

Tensor LayerNorm::forward(const Tensor& x) {
  return functional::layer_norm(x, weight, bias, eps_);
}

functional::AddLayerNorm LayerNorm::forward_add(const Tensor& x, const Tensor& y) {
  if (has_forward_hooks()) {
    Tensor sum = functional::add(x, y);
    return {sum, (*this)(sum)};
  }
  return functional::add_layer_norm(x, y, weight, bias, eps_);
}

void LayerNorm::rebind_members() {
  weight = own_parameter("weight");
  bias = own_parameter("bias");
}

std::string LayerNorm::extra_repr() const {
  return fmt::format("({},), eps={}", weight.size(0), eps_);
}

Embedding::Embedding(int64_t rows, int64_t dim, Generator& gen) {
  DDP_CHECK(rows > 0 && dim > 0, "Embedding: rows {} and dim {} must be positive", rows, dim);
  weight = register_parameter("weight", randn({rows, dim}, gen.seed(), {}, gen.take(rows * dim)));
}

Tensor Embedding::forward(const Tensor& indices) {
  return functional::embedding(weight, indices);
}

void Embedding::rebind_members() {
  weight = own_parameter("weight");
}

std::string Embedding::extra_repr() const {
  return fmt::format("{}, {}", weight.size(0), weight.size(1));
}

Conv2d::Conv2d(int64_t in, int64_t out, int64_t k, Generator& gen,
               functional::Conv2dOptions options, bool with_bias)
    : options_(options) {
  DDP_CHECK(in > 0 && out > 0 && k > 0,
            "Conv2d: in_channels {}, out_channels {} and kernel_size {} must be positive", in, out,
            k);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in * k * k));
  weight = register_parameter("weight", uniform({out, in, k, k}, bound, gen));
  if (with_bias) bias = register_parameter("bias", uniform({out}, bound, gen));
}

Tensor Conv2d::forward(const Tensor& x) {
  return functional::conv2d(x, weight, bias, options_);
}

void Conv2d::rebind_members() {
  weight = own_parameter("weight");
  bias = own_parameter("bias");
}

std::string Conv2d::extra_repr() const {
  return fmt::format("{}, {}, kernel_size=({}, {}), stride=({}, {}), padding=({}, {})",
                     weight.size(1), weight.size(0), weight.size(2), weight.size(3),
                     options_.stride, options_.stride, options_.padding, options_.padding);
}

std::string MaxPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}", kernel_, stride_ == 0 ? kernel_ : stride_);
}

struct Dropout::MaskStream {
  std::mutex mutex;
  Generator gen;
};

Dropout::Dropout(float p, uint64_t seed) : p_(p), masks_(std::make_shared<MaskStream>()) {
  DDP_CHECK(p >= 0.0f && p < 1.0f, "Dropout: probability {} is outside [0, 1)", p);
  masks_->gen = Generator(seed);
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p_ == 0.0f) return x;
  // This forward's counters, taken under the lock: replicas share the stream.
  Generator mine;
  {
    std::lock_guard<std::mutex> lock(masks_->mutex);
    mine = Generator(masks_->gen.seed(), masks_->gen.take(x.numel()));
  }
  return functional::dropout(x, p_, true, mine);
}

std::string Dropout::extra_repr() const {
  return fmt::format("p={}", p_);
}

Sequential& Sequential::add(std::shared_ptr<Module> layer) {
  register_module(std::to_string(children().size()), std::move(layer));
  return *this;
}

// Note [relu before max pooling]
// ReLU followed by MaxPool2d (every CNN block: conv, ReLU, pool) runs as the pool
// then the ReLU, on the CPU. ReLU is non-decreasing and keeps NaN, so the maximum
// of the ReLUs is the ReLU of the maximum, and the gradient reaches the same input
// element (the window's first maximum when it is positive, none otherwise): the
// same values and gradients, with ReLU and its backward over a quarter of the
// elements (2x2 pooling). The only difference: a window whose maximum is -0.0
// gives -0.0 rather than +0.0 (equal values; a CNN's conv output is never exactly
// -0.0 in practice), and where a window holds no positive value the pool may keep
// another (zero-gradient) element. CPU only for now: the CUDA ReLU mapped NaN to
// 0 (for which the two orders differ) until 2026-11-26, and the reorder has not
// been run on a GPU since. Not for a subclass of either, or a layer with hooks.
Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  const auto& layers = children();
  for (size_t i = 0; i < layers.size(); ++i) {
    Module& layer = *layers[i].second;
    // Only the library's own two layers, exactly (a subclass may compute something
    // else), and only where no hook would see the other order's tensors.
    Module& next = i + 1 < layers.size() ? *layers[i + 1].second : layer;
    if (i + 1 < layers.size() && h.device().is_cpu() && typeid(layer) == typeid(ReLU) &&
        typeid(next) == typeid(MaxPool2d) && !layer.has_forward_hooks() &&
        !next.has_forward_hooks()) {
      h = layer((*layers[i + 1].second)(h));
      ++i;
      continue;
    }
    h = layer(h);  // its hooks too (Note [forward hooks])
  }
  return h;
}

}  // namespace ddp::nn
