// Layers and losses, initialised as PyTorch initialises them by default:
// weights kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
// biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)), drawn from a Generator (Philox), so a
// seed gives the same model on every device.
#pragma once

#include "runtime/autograd/functions.h"
#include "runtime/nn/module.h"

namespace ddp::nn {

class Linear : public Cloneable<Linear> {
 public:
  Linear(int64_t in_features, int64_t out_features, Generator& gen, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Linear"; }
  std::string extra_repr() const override;
  Tensor weight, bias;  // [out, in], [out]

 protected:
  void rebind_members() override;
};

class Conv2d : public Cloneable<Conv2d> {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Generator& gen,
         functional::Conv2dOptions options = {}, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Conv2d"; }
  std::string extra_repr() const override;
  Tensor weight, bias;  // [C_out, C_in, k, k], [C_out]

 protected:
  void rebind_members() override;

 private:
  functional::Conv2dOptions options_;
};

class ReLU : public Cloneable<ReLU> {
 public:
  Tensor forward(const Tensor& x) override { return functional::relu(x); }
  std::string name() const override { return "ReLU"; }
};

class Tanh : public Cloneable<Tanh> {
 public:
  Tensor forward(const Tensor& x) override { return functional::tanh(x); }
  std::string name() const override { return "Tanh"; }
};

class Sigmoid : public Cloneable<Sigmoid> {
 public:
  Tensor forward(const Tensor& x) override { return functional::sigmoid(x); }
  std::string name() const override { return "Sigmoid"; }
};

class SiLU : public Cloneable<SiLU> {
 public:
  Tensor forward(const Tensor& x) override { return functional::silu(x); }
  std::string name() const override { return "SiLU"; }
};

// torch.nn.LayerNorm(dim): over the last dim, weight 1 and bias 0, eps 1e-5.
class LayerNorm : public Cloneable<LayerNorm> {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f);
  Tensor forward(const Tensor& x) override;
  // {x + y, this(x + y)}: a residual add and this norm in one pass
  // (functional::add_layer_norm). With forward hooks (a ZeRO-3 unit gathers its
  // parameters in them), the add and then a call through the hooks.
  functional::AddLayerNorm forward_add(const Tensor& x, const Tensor& y);
  std::string name() const override { return "LayerNorm"; }
  std::string extra_repr() const override;
  Tensor weight, bias;  // [dim], [dim]

 protected:
  void rebind_members() override;

 private:
  float eps_;
};

// torch.nn.Embedding(rows, dim): a table [rows, dim] drawn N(0, 1) from gen (torch's
// default), indexed by i64 ids of any shape -> ids.shape + [dim].
class Embedding : public Cloneable<Embedding> {
 public:
  Embedding(int64_t rows, int64_t dim, Generator& gen);
  Tensor forward(const Tensor& indices) override;
  std::string name() const override { return "Embedding"; }
  std::string extra_repr() const override;
  Tensor weight;  // [rows, dim]

 protected:
  void rebind_members() override;
};

class Flatten : public Cloneable<Flatten> {
 public:
  Tensor forward(const Tensor& x) override { return functional::flatten(x); }
  std::string name() const override { return "Flatten"; }
};

class MaxPool2d : public Cloneable<MaxPool2d> {
 public:
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = 0)
      : kernel_(kernel_size), stride_(stride) {}
  Tensor forward(const Tensor& x) override { return functional::max_pool2d(x, kernel_, stride_); }
  std::string name() const override { return "MaxPool2d"; }
  std::string extra_repr() const override;

 private:
  int64_t kernel_, stride_;
};

class Dropout : public Cloneable<Dropout> {
 public:
  // Masks come from their own Philox stream (seed), advancing every training forward.
  // Replicas share the stream (each forward takes its own counters, under a lock), so
  // DataParallel replicas draw distinct masks; which replica gets which counters then
  // depends on thread timing.
  explicit Dropout(float p, uint64_t seed = 0);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Dropout"; }
  std::string extra_repr() const override;

 private:
  struct MaskStream;
  float p_;
  std::shared_ptr<MaskStream> masks_;
};

// Children named "0", "1", ... as torch.nn.Sequential names them.
class Sequential : public Cloneable<Sequential> {
 public:
  Sequential() = default;
  Sequential& add(std::shared_ptr<Module> layer);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Sequential"; }
  size_t size() const { return children().size(); }
};

// Mean softmax cross-entropy over the batch.
class CrossEntropyLoss {
 public:
  Tensor operator()(const Tensor& logits, const Tensor& labels) const {
    return functional::cross_entropy(logits, labels);
  }
};

// Mean squared error, mean absolute error and binary cross-entropy on logits over
// every element (reduction='mean'); input and target of one shape.
class MSELoss {
 public:
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::mse_loss(input, target);
  }
};
class L1Loss {
 public:
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::l1_loss(input, target);
  }
};
class BCEWithLogitsLoss {
 public:
  Tensor operator()(const Tensor& logits, const Tensor& targets) const {
    return functional::binary_cross_entropy_with_logits(logits, targets);
  }
};

}  // namespace ddp::nn
