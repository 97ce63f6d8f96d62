// Modules: parameters, buffers and children in registration order, as
// torch.nn.Module. Names follow PyTorch's state_dict ("0.weight", "fc1.bias"), so
// a checkpoint loads into the equivalent torch model.
#pragma once

#include "runtime/autograd/autograd.h"
#include "runtime/rng/generator.h"

#include <functional>
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
  // forward(x) between this module's forward hooks, as calling a torch module
  // runs its hooks and calling .forward() skips them.
  Tensor operator()(const Tensor& x);
  virtual std::string name() const = 0;

  // Parameters of this module and its children, depth first in registration order.
  // Note [shared parameters]: a tensor registered twice (a tied weight, a module
  // registered under two names) is listed once, under its first name, as torch's
  // named_parameters() and parameters() do: an optimizer steps it once, DDP
  // reduces its gradient once, a replica shares it once. The same for buffers and
  // named_modules(). state_dict() keeps every name, as torch's does, so a
  // checkpoint loads into the equivalent torch model (both names of one tensor,
  // loaded into it twice).
  NamedTensors named_parameters(const std::string& prefix = "") const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers(const std::string& prefix = "") const;
  int64_t num_parameters() const;

  // Parameters then buffers, as torch's state_dict orders them per module.
  NamedTensors state_dict() const;
  // The keys load_state_dict(state, /*strict=*/false) let pass (torch's _IncompatibleKeys).
  struct IncompatibleKeys {
    std::vector<std::string> missing;     // the module's, not in the state: left as they were
    std::vector<std::string> unexpected;  // the state's, not the module's: ignored
  };
  // Copies values into the existing tensors (so optimizers keep their references).
  // strict: missing, unexpected and mis-shaped entries are one ValueError listing all;
  // not strict (torch's strict=False): the entries present are loaded, missing and
  // unexpected keys are returned, and mis-shaped or mistyped entries still throw.
  IncompatibleKeys load_state_dict(const NamedTensors& state, bool strict = true);

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
  // A table as Keras' model.summary() or torchinfo print it: one row per module
  // that holds parameters or has no children (its dotted name, class, own
  // parameter count and shapes), then the totals (parameters, their bytes,
  // buffers). Counts with thousands separators: "total: 203,530 parameters ...".
  std::string summary() const;

  // Note [forward hooks]: `pre` runs before every call through operator(), `post`
  // after it with the output, which it may replace (PyTorch's
  // register_forward_pre_hook and register_forward_hook). ZeRO-3 gathers a unit's
  // parameters in them (collectives/ddp/fully_shard.h). Either may be empty.
  // Returns an id for remove_forward_hooks(). replicate() does not copy hooks.
  using ForwardPreHook = std::function<void(Module&)>;
  using ForwardHook = std::function<Tensor(Module&, const Tensor& output)>;
  int add_forward_hooks(ForwardPreHook pre, ForwardHook post);
  void remove_forward_hooks(int id);
  bool has_forward_hooks() const { return !hooks_.empty(); }
  // This module and its descendants with their dotted names ("" for this one),
  // depth first in registration order (torch's named_modules()).
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "");

  // Note [module replicas]: a copy of this module for a DataParallel replica: the
  // same classes, names, training flag and children (replicated too), whose
  // parameters and buffers are the given tensors, in named_parameters() and
  // named_buffers() order, each of the shape and dtype of the one it stands for.
  // The tensors are used as given, so a replica's parameter can be a non-leaf
  // whose gradient flows back to this module's. This module is not changed.
  // Throws ValueError for a wrong count or shape, or for a class that cannot be
  // copied (derive it from nn::Cloneable<Class>).
  std::shared_ptr<Module> replicate(const std::vector<Tensor>& parameters,
                                    const std::vector<Tensor>& buffers) const;

 protected:
  Tensor register_parameter(std::string name, Tensor value, bool requires_grad = true);
  Tensor register_buffer(std::string name, Tensor value);
  // ValueError for an empty name, one with a '.', one this module has already,
  // or a null module (register a member after making it).
  template <typename M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    check_new_name(name, "module");
    DDP_CHECK(module != nullptr,
              "{}: register_module(\"{}\", nullptr): the module is null; make it first "
              "(register_module(\"{}\", std::make_shared<...>(...)))",
              this->name(), name, name);
    children_.emplace_back(std::move(name), module);
    return module;
  }
  virtual std::string extra_repr() const { return ""; }
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }
  // For replicate(): a copy of *this sharing every tensor and child (nn::Cloneable
  // implements it); the default throws ValueError naming the class.
  virtual std::shared_ptr<Module> shallow_copy() const;
  // For replicate(): called on the copy once its parameters, buffers and children were
  // replaced; classes that hold them in members too re-point the members here.
  virtual void rebind_members() {}
  // This module's own parameter, buffer or child by name; undefined/null when absent.
  Tensor own_parameter(const std::string& name) const;
  Tensor own_buffer(const std::string& name) const;
  std::shared_ptr<Module> own_child(const std::string& name) const;

 private:
  struct ReplicaMemo;
  std::shared_ptr<Module> replicate_from(ReplicaMemo& memo) const;
  // ValueError unless `name` is a new, dotless, non-empty name among this module's.
  void check_new_name(const std::string& name, const char* what) const;
  // named_parameters()/named_buffers(), the tensors already `seen` left out (null:
  // every name, state_dict()).
  void collect(bool parameters, const std::string& prefix, NamedTensors& out,
               std::vector<const TensorImpl*>* seen) const;

  struct Hooks {
    int id;
    ForwardPreHook pre;
    ForwardHook post;
  };
  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<Hooks> hooks_;
  int next_hook_id_ = 0;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Gives a module class the shallow_copy() that replicate() needs (libtorch's name):
// `class Net : public nn::Cloneable<Net>`. The class must be copy-constructible.
template <typename Derived>
class Cloneable : public Module {
 protected:
  std::shared_ptr<Module> shallow_copy() const override {
    return std::make_shared<Derived>(static_cast<const Derived&>(*this));
  }
};

// Moves a tensor's data to `device` in place: every handle to it sees the new device.
void move_tensor_(Tensor& t, const Device& device);

}  // namespace ddp::nn
