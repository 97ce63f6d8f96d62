#include "collectives/ddp/fully_shard.h"

#include "collectives/collective_events.h"
#include "runtime/autograd/autograd.h"
#include "runtime/memory/allocator.h"
#include "runtime/nn/layers.h"
#include "runtime/ops/ops.h"

#include <fmt/ranges.h>
#include "runtime/fmt.h"

#include <algorithm>
#include <set>
#include <utility>

namespace ddp {
namespace {

// The identity whose backward runs a unit's pre-backward (Note [zero-3 schedule]).
struct PreBackwardNode : Node {
  std::weak_ptr<FullyShardedParameters> engine;
  size_t unit = 0;
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    if (auto e = engine.lock()) e->pre_backward(unit);
    return {grad_output};
  }
  std::string name() const override { return "Zero3PreBackward"; }
};

// The default units: children of every nn::Sequential that hold parameters, not
// looking inside a unit (Note [zero-3 units]).
void default_units(nn::Module& m, const std::string& prefix, std::vector<std::string>& out) {
  const bool sequential = dynamic_cast<nn::Sequential*>(&m) != nullptr;
  for (auto& [name, child] : m.named_modules(prefix)) {
    if (child == &m) continue;
    // Direct children only: named_modules lists the whole subtree.
    const std::string rest = prefix.empty() ? name : name.substr(prefix.size() + 1);
    if (rest.find('.') != std::string::npos) continue;
    if (sequential && child->num_parameters() > 0) {
      out.push_back(name);
    } else {
      default_units(*child, name, out);
    }
  }
}

}  // namespace

FullyShardedParameters::FullyShardedParameters(std::shared_ptr<Communicator> comm,
                                               FullyShardOptions options)
    : comm_(std::move(comm)), options_(std::move(options)) {}

std::shared_ptr<FullyShardedParameters> FullyShardedParameters::create(
    nn::Module& root, std::shared_ptr<Communicator> comm, FullyShardOptions options) {
  DDP_CHECK(comm != nullptr, "FullyShardedParameters needs a communicator");
  std::shared_ptr<FullyShardedParameters> e(
      new FullyShardedParameters(std::move(comm), std::move(options)));
  e->build(root);
  e->install_hooks();
  return e;
}

FullyShardedParameters::~FullyShardedParameters() {
  // The hooks hold this object weakly; they are removed so a module that
  // outlives it does not carry dead hooks. Its parameters stay released.
  for (Unit& u : units_) {
    if (u.module != nullptr && u.hook_id >= 0) u.module->remove_forward_hooks(u.hook_id);
  }
  for (Reduction& r : reductions_) {
    try {
      r.work->wait();
    } catch (...) {  // a destructor does not throw; the step is lost anyway
    }
  }
}

void FullyShardedParameters::build(nn::Module& root) {
  // Every module by name, to resolve the policy.
  std::unordered_map<std::string, nn::Module*> modules;
  std::vector<std::string> module_names;
  for (auto& [name, m] : root.named_modules()) {
    modules.emplace(name, m);
    if (!name.empty()) module_names.push_back(name);
  }
  std::vector<std::string> unit_names = options_.units;
  if (unit_names.empty()) default_units(root, "", unit_names);
  std::set<std::string> unique;
  units_.push_back(Unit{.name = "", .module = &root});
  for (const std::string& name : unit_names) {
    auto it = modules.find(name);
    if (it == modules.end()) {
      std::vector<std::string> shown(
          module_names.begin(),
          module_names.begin() + std::min<std::ptrdiff_t>(12, std::ssize(module_names)));
      throw ValueError(fmt::format(
          "ZeRO-3 unit '{}' is not a module of the model; its modules are: {}{}. Name units "
          "by their dotted path (as in named_parameters(), without the parameter)",
          name, fmt::join(shown, ", "), module_names.size() > shown.size() ? ", ..." : ""));
    }
    DDP_CHECK(!name.empty() && unique.insert(name).second,
              "ZeRO-3 unit '{}' is named twice; name each unit once", name);
    units_.push_back(Unit{.name = name, .module = it->second});
  }
  // Each parameter to the deepest unit above it: the longest unit name that is a
  // prefix of its name at a dot.
  const auto unit_of = [this](const std::string& name) {
    size_t best = 0;
    for (size_t u = 1; u < units_.size(); ++u) {
      const std::string& un = units_[u].name;
      if (name.size() > un.size() && name.compare(0, un.size(), un) == 0 &&
          name[un.size()] == '.' && un.size() > units_[best].name.size()) {
        best = u;
      }
    }
    return best;
  };
  // A tied parameter (named_parameters() lists it once, under its first name;
  // state_dict() under every name, Note [shared parameters]) is used where each of
  // its names is: names in different units would have one unit's forward use it
  // while the other has released it, so the root unit (gathered for the whole
  // step) holds it, as FSDP puts a shared parameter in a common ancestor.
  const nn::NamedTensors named = root.named_parameters();
  std::unordered_map<const TensorImpl*, std::pair<std::string, size_t>> first_name;
  for (const auto& [name, p] : named)
    first_name.emplace(&p.impl(), std::make_pair(name, unit_of(name)));
  for (const auto& [name, t] : root.state_dict()) {
    const auto it = first_name.find(&t.impl());
    if (it == first_name.end() || it->second.first == name) continue;  // a buffer, or itself
    if (it->second.second != unit_of(name)) it->second.second = 0;
  }
  for (const auto& [name, p] : named) {
    const size_t best = first_name.at(&p.impl()).second;
    owner_.emplace_back(best, units_[best].params.size());
    units_[best].params.push_back(params_.size());
    params_.push_back(p);
    names_.push_back(name);
  }
  DDP_CHECK(!params_.empty(), "ZeRO-3: the model has no parameters to shard");
  const int world = comm_->size();
  const int rank = comm_->rank();
  NoGradGuard no_grad;
  for (Unit& u : units_) {
    u.starts.push_back(0);
    for (size_t i : u.params) {
      const Tensor& p = params_[i];
      const Tensor& first = params_[u.params.front()];
      DDP_CHECK(p.dtype() == first.dtype() && p.device() == first.device(),
                "ZeRO-3 unit '{}' mixes {} on {} ({}) with {} on {} ({}); a unit's parameters "
                "share one dtype and device (name smaller units)",
                u.name, dtype_name(p.dtype()), p.device().str(), names_[i],
                dtype_name(first.dtype()), first.device().str(), names_[u.params.front()]);
      u.starts.push_back(u.starts.back() + p.numel());
      if (requires_grad(p)) ++u.trainable;
    }
    if (u.params.empty()) continue;
    const Tensor& first = params_[u.params.front()];
    const int64_t n = u.starts.back();
    u.block = (n + world - 1) / world;
    u.flat = zeros({u.block * world}, {.dtype = first.dtype(), .device = first.device()});
    u.full = u.flat.storage();
    for (size_t k = 0; k < u.params.size(); ++k) {
      Tensor& p = params_[u.params[k]];
      Tensor d = u.flat.flat_view(u.starts[k], p.shape());
      copy_(d, p);
      // Every handle to the parameter (the module's, the optimizer's) now views
      // the unit's flat storage.
      p.impl().storage = u.full;
      p.impl().offset = u.starts[k];
    }
    std::vector<std::string> names;
    for (size_t i : u.params) names.push_back(names_[i]);
    u.full->set_release_label(
        fmt::format("ZeRO-3 {} ({}{})",
                    u.name.empty() ? std::string("root unit") : fmt::format("unit '{}'", u.name),
                    fmt::join(names.begin(),
                              names.begin() + std::min<std::ptrdiff_t>(4, std::ssize(names)), ", "),
                    names.size() > 4 ? ", ..." : ""));
    u.shard = u.flat.flat_view(static_cast<int64_t>(rank) * u.block, {u.block}).clone();
    release(static_cast<size_t>(&u - units_.data()));
  }
}

void FullyShardedParameters::install_hooks() {
  const std::weak_ptr<FullyShardedParameters> weak = weak_from_this();
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u].hook_id = units_[u].module->add_forward_hooks(
        [weak, u](nn::Module&) {
          if (auto e = weak.lock()) e->pre_forward(u);
        },
        [weak, u](nn::Module&, const Tensor& out) {
          auto e = weak.lock();
          return e ? e->post_forward(u, out) : out;
        });
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!requires_grad(params_[i])) continue;
    register_post_accumulate_grad_hook(params_[i], [weak, i](Tensor&) {
      if (auto e = weak.lock()) e->on_gradient(i);
    });
  }
}

void FullyShardedParameters::gather(size_t u) {
  Unit& unit = units_[u];
  // Allocated: gathered, or its all_gather in flight.
  if (unit.params.empty() || !unit.full->released()) return;
  try {
    unit.full->reallocate();
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(fmt::format(
        "{}\nThis was the gather of ZeRO-3 unit '{}' ({} parameters, {}): a unit is whole on "
        "every rank while it runs, so more ranks do not shrink it; name smaller units "
        "(FullyShardOptions::units, train --zero3-units)",
        e.what(), unit.name.empty() ? "(root)" : unit.name, unit.starts.back(),
        format_bytes(unit.full->bytes())));
  }
  note_gathered();
  const CollectiveLabel labelled("zero3 all_gather");
  unit.gathering = comm_->all_gather(unit.shard, unit.flat);
}

void FullyShardedParameters::wait(size_t u) {
  Unit& unit = units_[u];
  if (!unit.gathering) return;
  unit.gathering->wait();
  unit.gathering.reset();
  // Note [version counter]: a gather puts back what the forward saw, unless the
  // optimizer stepped the unit since its last gather; then it counts as a write (on
  // every rank: a rank whose shard holds only padding or frozen values was not
  // written, but the gathered unit was).
  if (unit.stepped) {
    unit.full->bump_version();
    unit.stepped = false;
  }
}

void FullyShardedParameters::release(size_t u) {
  Unit& unit = units_[u];
  if (unit.params.empty()) return;
  wait(u);  // never free memory a collective still writes
  unit.full->release();
}

void FullyShardedParameters::note_gathered() {
  peak_gathered_ = std::max(peak_gathered_, gathered_bytes());
}

void FullyShardedParameters::arm(bool sync) {
  sync_ = sync;
}

void FullyShardedParameters::pre_forward(size_t u) {
  const bool training = grad_mode_enabled();
  if (u == 0 && training) {
    // A new training step: held units go (the root stays: it is needed now),
    // and the backward's bookkeeping starts afresh.
    for (size_t v = 0; v < units_.size(); ++v) {
      if (std::exchange(units_[v].held, false) && v != 0) release(v);
      units_[v].pending = units_[v].trainable;
      units_[v].reduced = false;
    }
    if (!seen_.empty()) last_order_ = seen_;
    seen_.clear();
  }
  if (training) {
    seen_.push_back(u);
  } else {
    if (u == 0) eval_seen_.clear();
    eval_seen_.push_back(u);
  }
  gather(u);
  wait(u);
  if (!options_.prefetch || !training || u == 0) return;
  // The unit after u in the last step's forward.
  auto it = std::find(last_order_.begin(), last_order_.end(), u);
  if (it != last_order_.end() && it + 1 != last_order_.end()) gather(*(it + 1));
}

Tensor FullyShardedParameters::post_forward(size_t u, const Tensor& output) {
  Unit& unit = units_[u];
  const bool training = grad_mode_enabled();
  if (u == 0) {
    if (training) return output;  // the root stays gathered for the backward
    eval_order_ = eval_seen_;
    for (size_t v = 0; v < units_.size(); ++v) {  // the root, and any unit still gathered
      if (!units_[v].held) release(v);
    }
    return output;
  }
  if (!unit.held && (!training || options_.reshard_after_forward)) release(u);
  if (!training || !requires_grad(output)) return output;
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = output.storage();
  impl->offset = output.storage_offset();
  impl->shape = output.shape();
  impl->dtype = output.dtype();
  Tensor alias(std::move(impl));
  auto node = std::make_shared<PreBackwardNode>();
  node->engine = weak_from_this();
  node->unit = u;
  autograd::record(alias, node, {&output});
  return alias;
}

void FullyShardedParameters::pre_backward(size_t u) {
  gather(u);
  wait(u);
  Unit& unit = units_[u];
  if (sync_ && unit.trainable > 0 && !unit.grad_flat.defined() && !unit.reduced) {
    const Tensor& first = params_[unit.params.front()];
    unit.grad_flat =
        zeros({unit.block * comm_->size()}, {.dtype = first.dtype(), .device = first.device()});
    for (size_t k = 0; k < unit.params.size(); ++k) {
      Tensor& p = params_[unit.params[k]];
      if (requires_grad(p)) {
        set_gradient_destination(p, unit.grad_flat.flat_view(unit.starts[k], p.shape()));
      }
    }
  }
  if (!options_.prefetch) return;
  // The unit that ran before u in this step's forward runs its backward next.
  auto it = std::find(seen_.begin(), seen_.end(), u);
  if (it != seen_.end() && it != seen_.begin() && *(it - 1) != 0) gather(*(it - 1));
}

void FullyShardedParameters::on_gradient(size_t i) {
  const size_t u = owner_[i].first;
  Unit& unit = units_[u];
  if (unit.pending <= 0) return;  // a backward outside a forward we saw
  if (--unit.pending > 0) return;
  if (sync_) {
    reduce(u);
  } else if (u != 0 && !unit.held) {
    release(u);  // no_sync(): the full gradients stay, the parameters go
  }
}

void FullyShardedParameters::reduce(size_t u) {
  Unit& unit = units_[u];
  unit.reduced = true;
  if (unit.trainable == 0) return;
  NoGradGuard no_grad;
  const Tensor& first = params_[unit.params.front()];
  const TensorOptions options{.dtype = first.dtype(), .device = first.device()};
  // The gradients a backward op wrote into the buffer stay; others are copied.
  Tensor input = unit.grad_flat.defined() ? std::move(unit.grad_flat)
                                          : zeros({unit.block * comm_->size()}, options);
  unit.grad_flat = Tensor();
  for (size_t k = 0; k < unit.params.size(); ++k) {
    Tensor& p = params_[unit.params[k]];
    if (requires_grad(p)) set_gradient_destination(p, Tensor());
    const Tensor g = grad(p);
    if (!g.defined()) continue;
    Tensor d = input.flat_view(unit.starts[k], p.shape());
    if (g.storage() != input.storage() || g.storage_offset() != d.storage_offset()) copy_(d, g);
    set_grad(p, Tensor());
  }
  Tensor output = empty({unit.block}, options);
  const CollectiveLabel labelled("zero3 reduce_scatter");
  auto work = comm_->reduce_scatter(input, output, ReduceOp::avg);
  reductions_.push_back({u, std::move(input), std::move(output), std::move(work)});
  if (u != 0 && !unit.held) release(u);
  // At most kMaxReductions full-size gradient buffers alive: the oldest is
  // completed (waiting is safe: every rank launched it before this one).
  while (reductions_.size() > kMaxReductions) complete_oldest();
}

void FullyShardedParameters::complete_oldest() {
  Reduction r = std::move(reductions_.front());
  reductions_.pop_front();
  r.work->wait();
  r.input = Tensor();  // the full-size buffer goes now
  NoGradGuard no_grad;
  Unit& unit = units_[r.unit];
  if (unit.grad_shard.defined()) {
    axpy_(1.0f, r.output, unit.grad_shard);
  } else {
    unit.grad_shard = std::move(r.output);
  }
}

void FullyShardedParameters::finish() {
  if (!sync_) return;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!units_[u].reduced) reduce(u);
  }
  while (!reductions_.empty()) complete_oldest();
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!units_[u].held) release(u);
  }
}

int64_t FullyShardedParameters::ranks_with_batch(bool has_batch) {
  Tensor count = full({1}, has_batch ? 1.0 : 0.0, {.dtype = DType::i64, .device = comm_->device()});
  const CollectiveLabel labelled("zero3 evaluation round");
  comm_->all_reduce(count, ReduceOp::sum)->wait();
  return count.item<int64_t>();
}

void FullyShardedParameters::shadow_forward() {
  std::vector<size_t> order = !eval_order_.empty() ? eval_order_ : last_order_;
  if (order.empty()) {
    for (size_t u = 0; u < units_.size(); ++u) order.push_back(u);
  }
  for (size_t u : order) {
    gather(u);
    wait(u);
    if (!units_[u].held) release(u);
  }
}

void FullyShardedParameters::gather_all() {
  for (size_t u = 0; u < units_.size(); ++u) gather(u);
  for (size_t u = 0; u < units_.size(); ++u) {
    wait(u);
    units_[u].held = true;
  }
}

void FullyShardedParameters::zero_grad() {
  for (Unit& u : units_) u.grad_shard = Tensor();
  for (Tensor& p : params_) {
    if (grad(p).defined()) set_grad(p, Tensor());
  }
}

int64_t FullyShardedParameters::shard_bytes() const {
  int64_t n = 0;
  for (const Unit& u : units_) n += bytes_of(u.shard);
  return n;
}

int64_t FullyShardedParameters::gathered_bytes() const {
  int64_t n = 0;
  for (const Unit& u : units_) {
    if (!u.params.empty() && !u.full->released()) n += static_cast<int64_t>(u.full->bytes());
  }
  return n;
}

int64_t FullyShardedParameters::grad_shard_bytes() const {
  int64_t n = 0;
  for (const Unit& u : units_) n += bytes_of(u.grad_shard);
  return n;
}

std::vector<std::string> FullyShardedParameters::unit_names() const {
  std::vector<std::string> out;
  for (const Unit& u : units_) out.push_back(u.name.empty() ? "(root)" : u.name);
  return out;
}

}  // namespace ddp
