#include "runtime/nn/module.h"

#include "runtime/ops/ops.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <functional>
#include <map>

namespace ddp::nn {
namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

}  // namespace

Tensor Module::operator()(const Tensor& x) {
  if (hooks_.empty()) return forward(x);
  // A copy: a hook may add or remove hooks.
  const std::vector<Hooks> hooks = hooks_;
  for (const Hooks& h : hooks) {
    if (h.pre) h.pre(*this);
  }
  Tensor out = forward(x);
  for (const Hooks& h : hooks) {
    if (h.post) out = h.post(*this, out);
  }
  return out;
}

int Module::add_forward_hooks(ForwardPreHook pre, ForwardHook post) {
  hooks_.push_back({next_hook_id_, std::move(pre), std::move(post)});
  return next_hook_id_++;
}

void Module::remove_forward_hooks(int id) {
  std::erase_if(hooks_, [id](const Hooks& h) { return h.id == id; });
}

std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  // Note [shared parameters]: a module registered twice is listed once.
  std::vector<std::pair<std::string, Module*>> out;
  std::function<void(Module&, const std::string&)> walk = [&](Module& m, const std::string& at) {
    for (const auto& [n, seen] : out) {
      if (seen == &m) return;
    }
    out.emplace_back(at, &m);
    for (auto& [name, child] : m.children_) walk(*child, join(at, name));
  };
  walk(*this, prefix);
  return out;
}

void Module::check_new_name(const std::string& name, const char* what) const {
  DDP_CHECK(!name.empty() && name.find('.') == std::string::npos,
            "{}: {} name '{}': expected a non-empty name without '.' (dots join the names of "
            "nested modules)",
            this->name(), what, name);
  const auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& e) { return e.first == name; });
  };
  DDP_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_),
            "{}: register_{}(\"{}\"): this module already has a parameter, buffer or module of "
            "that name; pick another",
            this->name(), what, name);
}

Tensor Module::register_parameter(std::string name, Tensor value, bool requires_grad) {
  check_new_name(name, "parameter");
  DDP_CHECK(value.defined(), "{}: register_parameter(\"{}\"): the tensor is undefined",
            this->name(), name);
  DDP_CHECK(!requires_grad || is_floating(value.dtype()),
            "{}: register_parameter(\"{}\"): a parameter of dtype {} cannot require gradients "
            "(only floating-point ones can); register it with register_buffer, or pass "
            "requires_grad = false",
            this->name(), name, dtype_name(value.dtype()));
  set_requires_grad(value, requires_grad);
  params_.emplace_back(std::move(name), value);
  return value;
}

Tensor Module::register_buffer(std::string name, Tensor value) {
  check_new_name(name, "buffer");
  DDP_CHECK(value.defined(), "{}: register_buffer(\"{}\"): the tensor is undefined", this->name(),
            name);
  buffers_.emplace_back(std::move(name), value);
  return value;
}

void Module::collect(bool parameters, const std::string& prefix, NamedTensors& out,
                     std::vector<const TensorImpl*>* seen) const {
  for (const auto& [name, t] : parameters ? params_ : buffers_) {
    if (seen != nullptr) {
      const TensorImpl* impl = &t.impl();
      if (std::find(seen->begin(), seen->end(), impl) != seen->end()) continue;
      seen->push_back(impl);
    }
    out.emplace_back(join(prefix, name), t);
  }
  for (const auto& [name, child] : children_)
    child->collect(parameters, join(prefix, name), out, seen);
}

NamedTensors Module::named_parameters(const std::string& prefix) const {
  NamedTensors out;
  std::vector<const TensorImpl*> seen;
  collect(true, prefix, out, &seen);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers(const std::string& prefix) const {
  NamedTensors out;
  std::vector<const TensorImpl*> seen;
  collect(false, prefix, out, &seen);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

NamedTensors Module::state_dict() const {
  // Every name, a shared tensor under each of its names (Note [shared parameters]).
  NamedTensors out;
  collect(true, "", out, nullptr);
  collect(false, "", out, nullptr);
  return out;
}

Module::IncompatibleKeys Module::load_state_dict(const NamedTensors& state, bool strict) {
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state) given[name] = &t;
  std::vector<std::string> missing, mismatched;
  const NamedTensors mine = state_dict();
  for (const auto& [name, t] : mine) {
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
    } else if (!it->second->defined()) {
      mismatched.push_back(
          fmt::format("{}: an undefined tensor (default-constructed Tensor)", name));
    } else if (it->second->shape() == t.shape() && it->second->dtype() != t.dtype()) {
      mismatched.push_back(fmt::format(
          "dtype mismatch for {}: copying a param of dtype {} from checkpoint, the dtype in "
          "current model is {} (shape {}); convert it first (tensor.to(DType::{}))",
          name, dtype_name(it->second->dtype()), dtype_name(t.dtype()), shape_str(t.shape()),
          dtype_name(t.dtype())));
    } else if (it->second->shape() != t.shape() || it->second->dtype() != t.dtype()) {
      mismatched.push_back(fmt::format(
          "size mismatch for {}: copying a param with shape {} ({}) from checkpoint, the shape in "
          "current model is {} ({})",
          name, shape_str(it->second->shape()), dtype_name(it->second->dtype()),
          shape_str(t.shape()), dtype_name(t.dtype())));
    }
    if (it != given.end()) given.erase(it);
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : given) unexpected.push_back(name);
  std::string problems;
  if (strict && !missing.empty()) {
    problems += fmt::format("\n  Missing key(s): {}", fmt::join(missing, ", "));
  }
  if (strict && !unexpected.empty()) {
    problems += fmt::format("\n  Unexpected key(s): {}", fmt::join(unexpected, ", "));
  }
  for (const auto& m : mismatched) problems += "\n  " + m;
  DDP_CHECK(problems.empty(), "Error(s) in loading state_dict for {}:{}", name(), problems);
  NoGradGuard no_grad;
  for (auto& [name, t] : mine) {
    Tensor dst = t;
    for (const auto& [n2, src] : state) {
      if (n2 == name) {
        copy_(dst, src.to(dst.device()));
        break;
      }
    }
  }
  return {std::move(missing), std::move(unexpected)};
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void move_tensor_(Tensor& t, const Device& device) {
  if (t.device() == device) return;
  Tensor moved = t.to(device);
  TensorImpl& impl = t.impl();
  impl.storage = moved.storage();
  impl.offset = moved.storage_offset();
  if (Tensor g = grad(t); g.defined()) {
    move_tensor_(g, device);
  }
}

void Module::to(const Device& device) {
  for (auto& [name, t] : params_) move_tensor_(t, device);
  for (auto& [name, t] : buffers_) move_tensor_(t, device);
  for (auto& [name, child] : children_) child->to(device);
}

Device Module::device() const {
  const NamedTensors all = state_dict();
  return all.empty() ? Device::cpu() : all.front().second.device();
}

void Module::zero_grad(bool set_to_none) {
  for (auto& [name, t] : named_parameters()) {
    Tensor g = grad(t);
    if (!g.defined()) continue;
    if (set_to_none) {
      set_grad(t, Tensor());
    } else {
      fill_(g, 0.0);
    }
  }
}

std::shared_ptr<Module> Module::shallow_copy() const {
  throw ValueError(fmt::format(
      "{} cannot be replicated (DataParallel): derive it from nn::Cloneable<{}> instead of "
      "nn::Module, and re-point members that hold parameters, buffers or children in "
      "rebind_members()",
      name(), name()));
}

Tensor Module::own_parameter(const std::string& name) const {
  for (const auto& [n, t] : params_) {
    if (n == name) return t;
  }
  return Tensor();
}

Tensor Module::own_buffer(const std::string& name) const {
  for (const auto& [n, t] : buffers_) {
    if (n == name) return t;
  }
  return Tensor();
}

std::shared_ptr<Module> Module::own_child(const std::string& name) const {
  for (const auto& [n, child] : children_) {
    if (n == name) return child;
  }
  return nullptr;
}

// The originals' tensors and modules, and what stands for each in the replica: a
// tensor or child that appears twice (Note [shared parameters]) gets one.
struct Module::ReplicaMemo {
  std::map<const TensorImpl*, Tensor> tensors;
  std::map<const Module*, std::shared_ptr<Module>> modules;
};

std::shared_ptr<Module> Module::replicate(const std::vector<Tensor>& parameters,
                                          const std::vector<Tensor>& buffers) const {
  const NamedTensors params = named_parameters(), bufs = named_buffers();
  DDP_CHECK(parameters.size() == params.size() && buffers.size() == bufs.size(),
            "replicate {}: got {} parameters and {} buffers for a module with {} and {}", name(),
            parameters.size(), buffers.size(), params.size(), bufs.size());
  ReplicaMemo memo;
  for (const auto* list : {&params, &bufs}) {
    const auto& given = list == &params ? parameters : buffers;
    for (size_t i = 0; i < list->size(); ++i) {
      const auto& [n, t] = (*list)[i];
      const Tensor& value = given[i];
      DDP_CHECK(value.shape() == t.shape() && value.dtype() == t.dtype(),
                "replicate {}: tensor '{}' is {} ({}), its replacement {} ({})", name(), n,
                shape_str(t.shape()), dtype_name(t.dtype()), shape_str(value.shape()),
                dtype_name(value.dtype()));
      memo.tensors.emplace(&t.impl(), value);
    }
  }
  return replicate_from(memo);
}

std::shared_ptr<Module> Module::replicate_from(ReplicaMemo& memo) const {
  if (auto it = memo.modules.find(this); it != memo.modules.end()) return it->second;
  std::shared_ptr<Module> copy = shallow_copy();
  DDP_ASSERT(copy != nullptr && copy.get() != this, "{}::shallow_copy returned no new module",
             name());
  memo.modules.emplace(this, copy);
  for (NamedTensors* own : {&copy->params_, &copy->buffers_}) {
    for (auto& [n, t] : *own) t = memo.tensors.at(&t.impl());
  }
  for (auto& [n, child] : copy->children_) child = child->replicate_from(memo);
  copy->hooks_.clear();  // Note [forward hooks]: a replica has none
  copy->rebind_members();
  return copy;
}

namespace {

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

std::string Module::summary() const {
  struct Row {
    std::string name, type, count, shapes;
  };
  std::vector<Row> rows;
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m,
                                                                    const std::string& prefix) {
    if (!m.params_.empty() || m.children_.empty()) {
      int64_t count = 0;
      std::string shapes;
      for (const auto& [n, t] : m.params_) {
        count += t.numel();
        shapes += fmt::format("{}{} {}", shapes.empty() ? "" : ", ", n, shape_str(t.shape()));
      }
      rows.push_back({prefix.empty() ? "(model)" : prefix, m.name(), with_commas(count), shapes});
    }
    for (const auto& [n, child] : m.children_) walk(*child, prefix.empty() ? n : prefix + "." + n);
  };
  walk(*this, "");
  size_t name_w = 5, type_w = 4, count_w = 10;
  for (const auto& r : rows) {
    name_w = std::max(name_w, r.name.size());
    type_w = std::max(type_w, r.type.size());
    count_w = std::max(count_w, r.count.size());
  }
  std::string out = fmt::format("{:<{}}  {:<{}}  {:>{}}  shapes\n", "layer", name_w, "type", type_w,
                                "parameters", count_w);
  for (const auto& r : rows) {
    std::string line = fmt::format("{:<{}}  {:<{}}  {:>{}}  {}", r.name, name_w, r.type, type_w,
                                   r.count, count_w, r.shapes);
    line.erase(line.find_last_not_of(' ') + 1);
    out += line + "\n";
  }
  size_t bytes = 0;
  for (const auto& [n, t] : named_parameters()) bytes += t.nbytes();
  const auto buffers = named_buffers();
  size_t buffer_bytes = 0;
  for (const auto& [n, t] : buffers) buffer_bytes += t.nbytes();
  out += fmt::format("total: {} parameters ({:.1f} KiB), {} buffer{} ({:.1f} KiB)\n",
                     with_commas(num_parameters()), static_cast<double>(bytes) / 1024.0,
                     buffers.size(), buffers.size() == 1 ? "" : "s",
                     static_cast<double>(buffer_bytes) / 1024.0);
  return out;
}

std::string Module::str(int indent) const {
  std::string out = name() + "(" + extra_repr();
  if (!children_.empty()) {
    out += "\n";
    for (const auto& [n, child] : children_) {
      out += std::string(static_cast<size_t>(indent + 2), ' ') + "(" + n +
             "): " + child->str(indent + 2) + "\n";
    }
    out += std::string(static_cast<size_t>(indent), ' ');
  }
  return out + ")";
}

}  // namespace ddp::nn
