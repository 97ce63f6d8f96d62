// Modules: parameters, buffers and children in registration order, as
// torch.nn.Module. Names follow PyTorch's state_dict ("0.weight", "fc1.bias"), so
// a checkpoint loads into the equivalent torch model.
#pragma once

#include "runtime/autograd/autograd.h"
#include "runtime/rng/generator.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddp::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
  virtual std::string name() const = 0;

  // Parameters of this module and its children, depth first in registration order.
  NamedTensors named_parameters(const std::string& prefix = "") const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers(const std::string& prefix = "") const;
  int64_t num_parameters() const;

  // Parameters then buffers, as torch's state_dict orders them per module.
  NamedTensors state_dict() const;
  // Copies values into the existing tensors (so optimizers keep their references).
  // strict: missing, unexpected and mis-shaped entries are one ValueError listing all.
  void load_state_dict(const NamedTensors& state, bool strict = true);

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves every parameter and buffer; Tensor handles (and the optimizer's) stay valid.
  void to(const Device& device);
  Device device() const;
  // Every parameter's .grad becomes zero (kept allocated) or undefined (set_to_none).
  void zero_grad(bool set_to_none = false);
  // A description like PyTorch's repr.
  std::string str(int indent = 0) const;

 protected:
  Tensor register_parameter(std::string name, Tensor value, bool requires_grad = true);
  Tensor register_buffer(std::string name, Tensor value);
  template <typename M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    children_.emplace_back(std::move(name), module);
    return module;
  }
  virtual std::string extra_repr() const { return ""; }
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }

 private:
  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Moves a tensor's data to `device` in place: every handle to it sees the new device.
void move_tensor_(Tensor& t, const Device& device);

}  // namespace ddp::nn
