#include "runtime/optim/optimizer.h"

#include "runtime/cuda_graph.h"
#include "runtime/ops/multi_tensor.h"
#include "runtime/ops/nn_ops.h"
#include "runtime/ops/ops.h"
#include "runtime/ops/transformer_ops.h"

#include <cmath>
#include <map>
#include <unordered_set>
#include <utility>

namespace ddp::optim {
namespace {

Tensor zeros_like(const Tensor& t) {
  return zeros(t.shape(), {.dtype = t.dtype(), .device = t.device()});
}

// Looks up "<index>.<buffer>" entries and checks their shapes against the parameters.
class StateReader {
 public:
  StateReader(const nn::NamedTensors& state, const std::vector<Tensor>& params) : params_(params) {
    for (const auto& [name, t] : state) entries_[name] = t;
  }
  Tensor take(size_t index, const std::string& buffer) {
    const std::string key = fmt::format("{}.{}", index, buffer);
    auto it = entries_.find(key);
    if (it == entries_.end()) return Tensor();
    DDP_CHECK(it->second.shape() == params_[index].shape(),
              "optimizer state {} has shape {}, but parameter {} has shape {}", key,
              shape_str(it->second.shape()), index, shape_str(params_[index].shape()));
    Tensor out = it->second.to(params_[index].device()).clone();
    entries_.erase(it);
    return out;
  }
  void check_consumed() const {
    if (entries_.empty()) return;
    std::vector<std::string> names;
    for (const auto& [name, t] : entries_) names.push_back(name);
    throw ValueError(
        fmt::format("optimizer state has unexpected entries: {} (was it saved for a "
                    "different model or optimizer?)",
                    fmt::join(names, ", ")));
  }

 private:
  const std::vector<Tensor>& params_;
  std::map<std::string, Tensor> entries_;
};

// As torch's optimizers: an optimizer over no parameter is a mistake (a model whose
// parameters were not registered, a filter that kept none), not a no-op to train with.
void check_not_empty(const char* optimizer, const std::vector<Tensor>& params) {
  DDP_CHECK(!params.empty(),
            "{}: got an empty parameter list: nothing to train; pass model.parameters() of a "
            "model that registers its parameters (register_parameter, register_module)",
            optimizer);
}

}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params, float lr) : params_(std::move(params)), lr_(lr) {
  set_lr(lr);
  std::map<const TensorImpl*, size_t> seen;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    DDP_CHECK(p.defined(), "optimizer parameter {} is undefined", i);
    DDP_CHECK(p.dtype() == DType::f32, "optimizers update f32 parameters, got dtype {}",
              dtype_name(p.dtype()));
    // As torch's optimizers refuse one parameter in two groups: it would be stepped twice.
    const auto [at, fresh] = seen.emplace(&p.impl(), i);
    DDP_CHECK(fresh,
              "optimizer parameters {} and {} are the same tensor: an optimizer steps each "
              "parameter once; pass model.parameters(), which lists a shared parameter once",
              at->second, i);
  }
}

void Optimizer::set_lr(float lr) {
  DDP_CHECK(std::isfinite(lr) && lr >= 0.0f, "learning rate {} must be finite and >= 0", lr);
  lr_ = lr;
}

void Optimizer::set_capturable(bool on) {
  DDP_CHECK(!on || can_capture(),
            "this {} optimizer cannot be captured in a CUDA graph (Note [captured optimizer "
            "steps]); plain SGD and AdamW can, not ZeRO's sharded ones",
            name());
  capturable_ = on;
}

void Optimizer::prepare_step() {
  throw ValueError(
      fmt::format("optimizer {} has no prepare_step(): it cannot be captured", name()));
}

void Optimizer::apply_step() {
  throw ValueError(fmt::format("optimizer {} has no apply_step(): it cannot be captured", name()));
}

namespace {

void check_capturable(bool capturable, const std::string& name, const char* call) {
  DDP_CHECK(capturable,
            "{}: {}() is the half of a capturable optimizer's step; call "
            "set_capturable(true) first (Note [captured optimizer steps])",
            name, call);
}

// The one device of a capturable optimizer's parameters.
Device capture_device(const std::vector<Tensor>& params, const std::string& name) {
  DDP_CHECK(!params.empty(), "{}: a capturable optimizer needs parameters", name);
  for (const Tensor& p : params) {
    DDP_CHECK(p.device() == params.front().device(),
              "{}: a capturable optimizer's parameters share one device; found {} and {}", name,
              params.front().device().str(), p.device().str());
  }
  return params.front().device();
}

// Host values copied to `on_device` (allocated on `device` once, or again when the size
// changes) without waiting: from pinned staging, ordered by the current stream.
void upload(Tensor& on_device, const std::vector<float>& values, const Device& device) {
  const auto n = static_cast<int64_t>(values.size());
  if (!on_device.defined() || on_device.numel() != n) on_device = empty({n}, {.device = device});
  copy_(on_device, from_vector<float>(values, {n}), /*non_blocking=*/true);
}

// A capture records what the first update makes (a buffer, its first values) once.
void check_not_capturing(const Tensor& param, const std::string& name, size_t index,
                         const char* state) {
  DDP_CHECK(!is_capturing(param.device()),
            "{}: parameter {} has no {} yet, and a CUDA graph is being captured; run one step "
            "before capturing (Note [captured optimizer steps])",
            name, index, state);
}

}  // namespace

std::vector<size_t> Optimizer::with_gradients() const {
  std::vector<size_t> which;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (grad(params_[i]).defined()) which.push_back(i);
  }
  return which;
}

std::vector<size_t> Optimizer::begin_prepare(const char* call) {
  check_capturable(capturable_, name(), call);
  const Device device = capture_device(params_, name());
  DDP_CHECK(!is_capturing(device),
            "{}: prepare_step() is the host's half of a step and runs before each replay, not "
            "inside a capture (capture apply_step(); Note [captured optimizer steps])",
            name());
  std::vector<size_t> updated = with_gradients();
  DDP_CHECK(!captured_ || updated == updated_,
            "{}: {} parameters have a gradient now, {} when apply_step() was captured (or "
            "others); a graph updates the parameters it captured: capture again after such a "
            "change (Note [captured optimizer steps])",
            name(), updated.size(), updated_.size());
  return updated;
}

void Optimizer::end_prepare(std::vector<size_t> updated) {
  updated_ = std::move(updated);
  prepared_ = true;
  ++steps_;
}

const std::vector<size_t>& Optimizer::begin_apply() {
  check_capturable(capturable_, name(), "apply_step");
  DDP_CHECK(prepared_,
            "{}: apply_step() without a prepare_step() before it; each update is one of each "
            "(Note [captured optimizer steps])",
            name());
  size_t k = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const bool prepared = k < updated_.size() && updated_[k] == i;
    DDP_CHECK(grad(params_[i]).defined() == prepared,
              "{}: parameter {} {} at prepare_step() and {} now; the parameters with "
              "gradients must stay the same from one half to the other",
              name(), i, prepared ? "had a gradient" : "had no gradient",
              prepared ? "has none" : "has one");
    if (prepared) ++k;
  }
  return updated_;
}

void Optimizer::end_apply() {
  prepared_ = false;
  if (is_capturing(params_.front().device())) captured_ = true;
}

void Optimizer::check_not_captured_plain() const {
  if (params_.empty()) return;
  DDP_CHECK(!is_capturing(params_.front().device()),
            "{}: step() inside a CUDA graph capture would fix this step's learning rate and "
            "step counts for every replay; call set_capturable(true), then prepare_step() "
            "before each replay and capture apply_step() (Note [captured optimizer steps])",
            name());
}

void Optimizer::zero_grad(bool set_to_none) {
  for (Tensor& p : params_) {
    Tensor g = grad(p);
    if (!g.defined()) continue;
    if (set_to_none) {
      set_grad(p, Tensor());
    } else {
      fill_(g, 0.0);
    }
  }
}

SGD::SGD(std::vector<Tensor> params, SgdOptions options)
    : Optimizer(std::move(params), options.lr), options_(options), momentum_(params_.size()) {
  check_not_empty("SGD", params_);
  DDP_CHECK(options.momentum >= 0.0f, "SGD: momentum {} must be >= 0", options.momentum);
  DDP_CHECK(options.weight_decay >= 0.0f, "SGD: weight_decay {} must be >= 0",
            options.weight_decay);
  DDP_CHECK(!options.nesterov || options.momentum > 0.0f, "SGD: nesterov needs momentum > 0");
}

void SGD::step() {
  if (capturable_) {
    prepare_step();
    apply_step();
    return;
  }
  check_not_captured_plain();
  update(with_gradients(), nullptr);
  ++steps_;
}

void SGD::prepare_step() {
  std::vector<size_t> updated = begin_prepare("prepare_step");
  upload(lr_on_device_, {lr_}, params_.front().device());  // one float: never reallocated
  end_prepare(std::move(updated));
}

void SGD::apply_step() {
  const std::vector<size_t>& which = begin_apply();
  update(which, static_cast<const float*>(lr_on_device_.data_ptr()));
  end_apply();
}

void SGD::update(const std::vector<size_t>& which, const float* lr_on_device) {
  NoGradGuard no_grad;
  for (size_t i : which) {
    const Tensor g = grad(params_[i]);
    kernels::SgdStep s{.lr = lr_,
                       .momentum = options_.momentum,
                       .weight_decay = options_.weight_decay,
                       .nesterov = options_.nesterov,
                       .first_step = false,
                       .lr_on_device = lr_on_device};
    if (options_.momentum != 0.0f && !momentum_[i].defined()) {
      check_not_capturing(params_[i], name(), i, "momentum buffer");
      momentum_[i] = empty(params_[i].shape(), {.device = params_[i].device()});
      s.first_step = true;
    }
    Tensor& buf = options_.momentum != 0.0f ? momentum_[i] : params_[i];
    sgd_update_(params_[i], g, buf, s);
  }
}

nn::NamedTensors SGD::state() const {
  nn::NamedTensors out;
  for (size_t i = 0; i < momentum_.size(); ++i) {
    if (momentum_[i].defined())
      out.emplace_back(fmt::format("{}.momentum_buffer", i), momentum_[i]);
  }
  return out;
}

void SGD::load_state(const nn::NamedTensors& state, int64_t steps) {
  StateReader reader(state, params_);
  for (size_t i = 0; i < params_.size(); ++i) momentum_[i] = reader.take(i, "momentum_buffer");
  reader.check_consumed();
  steps_ = steps;
}

namespace {
std::vector<Tensor> concat_groups(const std::vector<ParamGroup>& groups) {
  std::vector<Tensor> params;
  for (const ParamGroup& g : groups) params.insert(params.end(), g.params.begin(), g.params.end());
  return params;
}
std::vector<float> group_decays(const std::vector<ParamGroup>& groups) {
  std::vector<float> decays;
  for (const ParamGroup& g : groups) {
    DDP_CHECK(std::isfinite(g.weight_decay) && g.weight_decay >= 0.0f,
              "AdamW: a parameter group's weight_decay {} must be finite and >= 0", g.weight_decay);
    decays.insert(decays.end(), g.params.size(), g.weight_decay);
  }
  return decays;
}
}  // namespace

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{{std::move(params), options.weight_decay}}, options) {}

AdamW::AdamW(const std::vector<ParamGroup>& groups, AdamWOptions options)
    : Optimizer(concat_groups(groups), options.lr),
      options_(options),
      weight_decay_(group_decays(groups)),
      exp_avg_(params_.size()),
      exp_avg_sq_(params_.size()),
      param_steps_(params_.size(), 0) {
  check_not_empty("AdamW", params_);
  DDP_CHECK(options.beta1 >= 0.0f && options.beta1 < 1.0f && options.beta2 >= 0.0f &&
                options.beta2 < 1.0f,
            "AdamW: betas ({}, {}) must lie in [0, 1)", options.beta1, options.beta2);
  DDP_CHECK(options.eps > 0.0f, "AdamW: eps {} must be > 0", options.eps);
}

// All parameters that have a gradient in one adamw_update_all_: on CUDA one launch
// per list of tensors, on the CPU a kernel per tensor (ops/multi_tensor.h).
void AdamW::step() {
  if (capturable_) {
    prepare_step();
    apply_step();
    return;
  }
  check_not_captured_plain();
  NoGradGuard no_grad;
  // take_gradient_scale checked that every parameter with a gradient is on its device.
  const Tensor scale = std::exchange(grad_scale_, Tensor());
  std::vector<Tensor> params, grads, m, v;
  std::vector<kernels::AdamWStep> steps;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = grad(params_[i]);
    if (!g.defined()) continue;
    if (!exp_avg_[i].defined()) {
      exp_avg_[i] = zeros_like(params_[i]);
      exp_avg_sq_[i] = zeros_like(params_[i]);
    }
    // Parameters on another device than the first go in their own call.
    if (!params.empty() && params.front().device() != params_[i].device()) {
      adamw_update_all_(params, grads, m, v, steps, Tensor(), scale);
      params.clear();
      grads.clear();
      m.clear();
      v.clear();
      steps.clear();
    }
    params.push_back(params_[i]);
    grads.push_back(g);
    m.push_back(exp_avg_[i]);
    v.push_back(exp_avg_sq_[i]);
    ++param_steps_[i];
    steps.push_back(step_of(i));
  }
  adamw_update_all_(params, grads, m, v, steps, Tensor(), scale);
  ++steps_;
}

void AdamW::zero_grad(bool set_to_none) {
  Optimizer::zero_grad(set_to_none);
  grad_scale_ = Tensor();  // the gradients it was for are gone
}

bool AdamW::take_gradient_scale(const Tensor& factor) {
  DDP_CHECK(!grad_scale_.defined(),
            "AdamW: a gradient scale (a clip factor) is waiting for the next step already; "
            "call step() between two clip_grad_norm_on_device calls given the optimizer");
  DDP_CHECK(factor.defined() && factor.numel() == 1 && factor.dtype() == DType::f32,
            "AdamW::take_gradient_scale: expected one f32 element, got {} {}",
            factor.defined() ? dtype_name(factor.dtype()) : "an undefined tensor",
            factor.defined() ? shape_str(factor.shape()) : "");
  for (const Tensor& p : params_) {
    const Tensor g = grad(p);
    if (g.defined() && p.device() != factor.device()) return false;  // scaled by the caller
  }
  grad_scale_ = factor;
  return true;
}

kernels::AdamWStep AdamW::step_of(size_t i) const {
  return {.lr = lr_,
          .beta1 = options_.beta1,
          .beta2 = options_.beta2,
          .eps = options_.eps,
          .weight_decay = weight_decay_[i],
          .step = param_steps_[i]};
}

void AdamW::prepare_step() {
  std::vector<size_t> updated = begin_prepare("prepare_step");
  NoGradGuard no_grad;
  std::vector<kernels::AdamWStep> steps;
  for (size_t i : updated) {
    if (!exp_avg_[i].defined()) {  // made here, before any capture of apply_step()
      exp_avg_[i] = zeros_like(params_[i]);
      exp_avg_sq_[i] = zeros_like(params_[i]);
    }
    kernels::AdamWStep s = step_of(i);
    ++s.step;
    steps.push_back(s);
  }
  // The table's size follows the fixed set of parameters once captured: its address
  // stays the one the graph reads (begin_prepare checked the set).
  if (!steps.empty()) upload(constants_, adamw_constants_table(steps), params_.front().device());
  for (size_t i : updated) ++param_steps_[i];  // counted once the upload is queued
  end_prepare(std::move(updated));
}

void AdamW::apply_step() {
  const std::vector<size_t>& which = begin_apply();
  NoGradGuard no_grad;
  std::vector<Tensor> params, grads, m, v;
  std::vector<kernels::AdamWStep> steps;
  for (size_t i : which) {
    params.push_back(params_[i]);
    grads.push_back(grad(params_[i]));
    m.push_back(exp_avg_[i]);
    v.push_back(exp_avg_sq_[i]);
    steps.push_back(step_of(i));
  }
  adamw_update_all_(params, grads, m, v, steps, constants_, std::exchange(grad_scale_, Tensor()));
  end_apply();
}

nn::NamedTensors AdamW::state() const {
  nn::NamedTensors out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!exp_avg_[i].defined()) continue;
    out.emplace_back(fmt::format("{}.exp_avg", i), exp_avg_[i]);
    out.emplace_back(fmt::format("{}.exp_avg_sq", i), exp_avg_sq_[i]);
    out.emplace_back(fmt::format("{}.step", i),
                     full({1}, static_cast<double>(param_steps_[i]), {.dtype = DType::i64}));
  }
  return out;
}

int64_t read_step_count(const std::string& key, const Tensor& t) {
  DDP_CHECK(t.defined() && t.numel() == 1, "optimizer state {}: expected one step count, got {}",
            key,
            t.defined() ? "shape " + shape_str(t.shape()) : std::string("an undefined tensor"));
  const double v = is_floating(t.dtype())
                       ? static_cast<double>(cast(t, DType::f32).cpu().item<float>())
                       : static_cast<double>(cast(t, DType::i64).cpu().item<int64_t>());
  DDP_CHECK(std::isfinite(v) && v >= 0 && v == std::floor(v) && v < 9.0e18,
            "optimizer state {}: step count {} is not a whole number of steps >= 0", key, v);
  return static_cast<int64_t>(v);
}

// Every parameter's entries come together (exp_avg, exp_avg_sq, step) or not at all: a
// moment without its step would resume with the wrong bias correction, a step without
// moments start them from zero at a late step. Nothing is changed unless all is valid.
void AdamW::load_state(const nn::NamedTensors& state, int64_t steps) {
  nn::NamedTensors moments;
  std::map<std::string, Tensor> step_counts;
  for (const auto& [name, t] : state) {
    if (name.ends_with(".step")) {
      step_counts[name] = t;
    } else {
      moments.emplace_back(name, t);
    }
  }
  StateReader reader(moments, params_);
  std::vector<Tensor> m(params_.size()), v(params_.size());
  std::vector<int64_t> counts(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    m[i] = reader.take(i, "exp_avg");
    v[i] = reader.take(i, "exp_avg_sq");
    const auto it = step_counts.find(fmt::format("{}.step", i));
    const bool has_step = it != step_counts.end();
    if (m[i].defined() || v[i].defined() || has_step) {
      std::vector<std::string> absent;
      if (!m[i].defined()) absent.push_back(fmt::format("{}.exp_avg", i));
      if (!v[i].defined()) absent.push_back(fmt::format("{}.exp_avg_sq", i));
      if (!has_step) absent.push_back(fmt::format("{}.step", i));
      DDP_CHECK(absent.empty(),
                "optimizer state of parameter {} (shape {}) lacks {}: AdamW's state of a "
                "parameter is its exp_avg, exp_avg_sq and step together (or none of them); was "
                "it saved whole?",
                i, shape_str(params_[i].shape()), fmt::join(absent, ", "));
      counts[i] = read_step_count(it->first, it->second);
      step_counts.erase(it);
    }
  }
  std::vector<std::string> unknown;
  for (const auto& [name, t] : step_counts) unknown.push_back(name);
  DDP_CHECK(unknown.empty(),
            "optimizer state has unexpected entries: {} (this optimizer has {} parameters; was "
            "it saved for a different model or optimizer?)",
            fmt::join(unknown, ", "), params_.size());
  reader.check_consumed();
  exp_avg_ = std::move(m);
  exp_avg_sq_ = std::move(v);
  param_steps_ = std::move(counts);
  steps_ = steps;
}

namespace {
// ||g||^2 over every defined gradient, summed on the device, read once.
double squared_grad_norm(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  Tensor total;
  for (const Tensor& p : params) {
    const Tensor g = grad(p);
    if (!g.defined()) continue;
    Tensor sq = sum_squares(g);
    if (!total.defined()) {
      total = sq;
    } else {
      DDP_CHECK(sq.device() == total.device(),
                "clip_grad_norm_: gradients on {} and {}; clip each device's parameters "
                "separately",
                total.device().str(), sq.device().str());
      axpy_(1.0f, sq, total);
    }
  }
  return total.defined() ? static_cast<double>(total.cpu().item<float>()) : 0.0;
}
}  // namespace

double grad_norm(const std::vector<Tensor>& params) {
  return std::sqrt(squared_grad_norm(params));
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  DDP_CHECK(std::isfinite(max_norm) && max_norm > 0,
            "clip_grad_norm_: max_norm {} must be finite and > 0 (to not clip, do not call it)",
            max_norm);
  const double norm = grad_norm(params);
  // torch's clamp(max_norm / (norm + 1e-6), max=1): a norm within 1e-6 below max_norm
  // is scaled (by a hair) too.
  const double factor_d = max_norm / (norm + 1e-6);
  if (!std::isfinite(norm) || factor_d >= 1.0) return norm;
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    Tensor g = grad(p);
    if (g.defined()) grads.push_back(g);
  }
  // g *= factor, in place: as a multiply (g + (factor - 1) g lost factor to f32 rounding
  // of factor - 1, and zeroed every gradient once factor was below about 3e-8).
  if (!grads.empty()) {
    scale_by_(grads, full({1}, factor_d, {.device = grads.front().device()}));
  }
  return norm;
}

namespace {
// Whether the parameters with a gradient are the same tensors in both lists (any order).
bool same_parameters_with_gradients(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  std::unordered_set<const TensorImpl*> in_a;
  for (const Tensor& p : a) {
    if (grad(p).defined()) in_a.insert(&p.impl());
  }
  size_t in_b = 0;
  for (const Tensor& p : b) {
    if (!grad(p).defined()) continue;
    if (in_a.count(&p.impl()) == 0) return false;
    ++in_b;
  }
  return in_b == in_a.size();
}
}  // namespace

Tensor clip_grad_norm_on_device(const std::vector<Tensor>& params, double max_norm,
                                Optimizer* step) {
  DDP_CHECK(std::isfinite(max_norm) && max_norm > 0,
            "clip_grad_norm_: max_norm {} must be finite and > 0 (to not clip, do not call it)",
            max_norm);
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    Tensor g = grad(p);
    if (g.defined()) grads.push_back(g);
  }
  if (grads.empty()) return Tensor();
  NoGradGuard no_grad;
  const ClipResult clip = clip_factor(sum_squares_all(grads), max_norm);
  // Note [clipping in the step]
  if (step != nullptr && same_parameters_with_gradients(params, step->params()) &&
      step->take_gradient_scale(clip.factor)) {
    return clip.norm;
  }
  scale_by_(grads, clip.factor);  // Note [clipping on the device]
  return clip.norm;
}

float LrSchedule::lr_at(int64_t step) const {
  switch (kind) {
    case Kind::constant:
      return base_lr;
    case Kind::step:
      return base_lr * std::pow(gamma, static_cast<float>(step / std::max<int64_t>(step_size, 1)));
    case Kind::cosine:
    case Kind::linear: {
      if (step < warmup_steps) {
        return base_lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
      }
      const int64_t span = std::max<int64_t>(total_steps - warmup_steps, 1);
      const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
      const double shape =
          kind == Kind::cosine ? 0.5 * (1.0 + std::cos(M_PI * progress)) : 1.0 - progress;
      return min_lr + (base_lr - min_lr) * static_cast<float>(shape);
    }
    case Kind::onecycle: {
      // OneCycleLR's arithmetic (double, as Python's floats): phase ends at float
      // step numbers, the rise ends at pct_start * total - 1.
      const double initial = static_cast<double>(base_lr) / 25.0;
      const double last = initial / 1e4;
      const double rise_end = warmup_steps > 0 ? static_cast<double>(warmup_steps) - 1.0
                                               : 0.3 * static_cast<double>(total_steps) - 1.0;
      const double fall_end = static_cast<double>(total_steps) - 1.0;
      const auto anneal = [](double from, double to, double pct) {
        return to + (from - to) / 2.0 * (std::cos(M_PI * pct) + 1.0);
      };
      const auto s = static_cast<double>(step);
      // --warmup-steps 1 ends the rise at step 0: that step is at the peak (PyTorch's
      // 0/0 there raises ZeroDivisionError).
      if (s <= rise_end) {
        return static_cast<float>(anneal(initial, base_lr, rise_end > 0 ? s / rise_end : 1.0));
      }
      const double pct = std::min(1.0, (s - rise_end) / std::max(fall_end - rise_end, 1e-12));
      return static_cast<float>(anneal(base_lr, last, pct));
    }
  }
  return base_lr;
}

LrSchedule::Kind LrSchedule::parse_kind(const std::string& text) {
  if (text == "constant") return Kind::constant;
  if (text == "step") return Kind::step;
  if (text == "cosine") return Kind::cosine;
  if (text == "linear") return Kind::linear;
  if (text == "onecycle") return Kind::onecycle;
  throw ValueError(fmt::format(
      "unknown learning-rate schedule '{}'; valid: constant, step, cosine, linear, onecycle",
      text));
}

}  // namespace ddp::optim
