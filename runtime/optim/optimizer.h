// Optimizers with torch.optim's update rules (fused per-parameter kernels), and
// learning-rate schedules.
#pragma once

#include "runtime/nn/module.h"
#include "runtime/ops/kernels.h"

#include <string>
#include <vector>

namespace ddp::optim {

// Note [captured optimizer steps]: a CUDA graph replays kernels with the arguments
// they had at the capture (Note [cuda graphs] in runtime/cuda_graph.h), but an
// update's learning rate (a schedule) and AdamW's bias corrections (the step count)
// change every step. A capturable optimizer (set_capturable(true); SGD and AdamW,
// as torch's capturable=True) splits step() in two:
// - prepare_step(), the host's part: counts the step, computes the numbers of this
//   update (SGD: the lr; AdamW: adamw_constants per tensor, in double, rounded once)
//   and copies them into a device tensor of its own (one per set of parameters), with an
//   asynchronous copy from pinned memory ordered before the kernels by the stream;
// - apply_step(), the device's part: kernels that read those numbers when they run.
// step() is one then the other, the same bits as without capture. train --cuda-graph
// captures apply_step() and calls prepare_step() before each replay. The rules the
// halves check:
// - each apply_step() follows a prepare_step() (a replay stands for one);
// - prepare_step() never runs inside a capture (the graph would replay one upload
//   from a staging buffer long reused), nor does the plain step() of a CUDA optimizer
//   (its lr and step counts would be fixed);
// - state made on the first update (SGD's momentum, AdamW's moments) must exist before
//   a capture: apply_step() under a capture without it throws;
// - once apply_step() is captured (by a capture that then succeeds or not: the
//   optimizer cannot tell), the parameters with gradients are fixed: the graph
//   updates those, from a table laid out for them, so prepare_step() throws when the
//   set changes (capture again after such a change, or after load_state(), which
//   replaces the state tensors the graph writes).
class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params, float lr);
  virtual ~Optimizer() = default;
  // One update of every parameter that has a gradient (others are skipped, as torch does).
  virtual void step() = 0;
  // Note [captured optimizer steps]. Throws ValueError for an optimizer that cannot.
  void set_capturable(bool on);
  bool capturable() const { return capturable_; }
  virtual bool can_capture() const { return false; }
  // The two halves of step() of a capturable optimizer; throw ValueError otherwise.
  virtual void prepare_step();
  virtual void apply_step();
  virtual void zero_grad(bool set_to_none = false);
  // Note [clipping in the step]: takes `factor` (one f32 on the parameters' device) to
  // multiply every gradient by as the next update reads it; false when this optimizer
  // cannot (the caller then scales the gradients itself). Throws ValueError when a
  // factor is waiting already.
  virtual bool take_gradient_scale(const Tensor& /*factor*/) { return false; }
  float lr() const { return lr_; }
  void set_lr(float lr);
  int64_t steps() const { return steps_; }
  // The parameters it updates, in the order state() numbers them.
  const std::vector<Tensor>& params() const { return params_; }
  // Tensors of the optimizer state, named "<param index>.<buffer>" (as torch's
  // optimizer state_dict indexes parameters), for checkpoints.
  virtual nn::NamedTensors state() const = 0;
  // Restores state() output; throws ValueError listing missing or mis-shaped entries.
  virtual void load_state(const nn::NamedTensors& state, int64_t steps) = 0;
  virtual std::string name() const = 0;

 protected:
  std::vector<size_t> with_gradients() const;  // the parameters that have a gradient
  // Note [captured optimizer steps]: the bookkeeping of the two halves.
  // The parameters this prepare_step() updates (those with a gradient), after the checks.
  std::vector<size_t> begin_prepare(const char* call);
  // Records `updated` as prepared and counts the step.
  void end_prepare(std::vector<size_t> updated);
  // The prepared parameters, checked against the gradients now.
  const std::vector<size_t>& begin_apply();
  void end_apply();  // under a capture: the set of parameters is fixed from now on
  // A plain step() of a CUDA optimizer may not be captured.
  void check_not_captured_plain() const;

  std::vector<Tensor> params_;
  float lr_;
  int64_t steps_ = 0;
  bool capturable_ = false;
  bool prepared_ = false;        // prepare_step() ran, apply_step() not yet
  bool captured_ = false;        // apply_step() was captured: updated_ is fixed
  std::vector<size_t> updated_;  // prepare_step()'s parameters
};

struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SgdOptions options);
  void step() override;
  bool can_capture() const override { return true; }
  void prepare_step() override;
  void apply_step() override;
  nn::NamedTensors state() const override;
  void load_state(const nn::NamedTensors& state, int64_t steps) override;
  std::string name() const override { return "sgd"; }
  const SgdOptions& options() const { return options_; }

 private:
  // One update of parameters `which`, the lr read from `lr_on_device` when set.
  void update(const std::vector<size_t>& which, const float* lr_on_device);

  SgdOptions options_;
  std::vector<Tensor> momentum_;  // undefined until the parameter's first step
  Tensor lr_on_device_;           // capturable: [1] f32 on the parameters' device
};

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
};

// A parameter group as torch.optim's: its parameters share the group's weight decay
// (the other options are the optimizer's).
struct ParamGroup {
  std::vector<Tensor> params;
  float weight_decay = 0.0f;
};

class AdamW : public Optimizer {
 public:
  // Every parameter decays by options.weight_decay.
  AdamW(std::vector<Tensor> params, AdamWOptions options);
  // Each group decays by its own weight_decay (options.weight_decay is unused), as
  // torch.optim.AdamW([{"params": ..., "weight_decay": ...}, ...]): the parameters are
  // numbered group after group, in state() too, as torch's state_dict numbers them.
  AdamW(const std::vector<ParamGroup>& groups, AdamWOptions options);
  void step() override;
  bool can_capture() const override { return true; }
  void prepare_step() override;
  void apply_step() override;
  nn::NamedTensors state() const override;
  void load_state(const nn::NamedTensors& state, int64_t steps) override;
  std::string name() const override { return "adamw"; }
  void zero_grad(bool set_to_none = false) override;  // drops a waiting gradient scale
  bool take_gradient_scale(const Tensor& factor) override;
  const AdamWOptions& options() const { return options_; }
  // Per parameter, in params() order (a group's weight_decay, or options().weight_decay).
  const std::vector<float>& weight_decays() const { return weight_decay_; }

 private:
  AdamWOptions options_;
  std::vector<float> weight_decay_;            // per parameter
  kernels::AdamWStep step_of(size_t i) const;  // parameter i's step as it stands

  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  std::vector<int64_t> param_steps_;
  Tensor constants_;   // capturable: adamw_constants_table of updated_, on the device
  Tensor grad_scale_;  // take_gradient_scale's factor until the next update
};

// Note [clipping in the step]: clip_grad_norm_on_device's factor used to multiply
// every gradient in a pass of its own (on GPT-2 124M a read and a write of 500 MB a
// step) before the update read them again. Given the optimizer that steps next (train
// passes its own), an optimizer that can (AdamW: take_gradient_scale) multiplies each
// gradient by the factor as its update reads it, rounded to f32 as the pass rounded
// it: the same update, bit for bit, one pass fewer. The gradients then keep their
// unclipped values (torch's clip_grad_norm_ leaves them clipped: call it without an
// optimizer for that). The factor is taken only when the clipped parameters are the
// optimizer's (those with a gradient, in any order) and all on one device; it applies
// to the optimizer's next step() or apply_step() (captured together under a CUDA
// graph, where the factor's tensor is the graph's) and zero_grad() drops it.

// torch.nn.utils.clip_grad_norm_(params, max_norm) for the L2 norm: the norm of all
// defined gradients taken together, returned as it was before clipping. Every gradient is
// multiplied by min(1, max_norm / (norm + 1e-6)), as torch does.
// A non-finite norm is returned and the gradients are left as they are (torch would
// multiply them by NaN); the caller decides (train's --on-nonfinite). Reads the norm
// on the host: one device synchronization on CUDA. Throws ValueError unless
// max_norm > 0 and finite.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);
// The same norm, without clipping.
double grad_norm(const std::vector<Tensor>& params);
// clip_grad_norm_ without reading the device (Note [clipping on the device] in
// ops/multi_tensor.h): the norm is computed, the factor min(1, max_norm / (norm +
// 1e-6)) applied (not for a non-finite norm) and the norm returned, all as device work
// on the gradients' device (one device; a scalar f32 tensor, undefined when no
// parameter has a gradient). Each gradient is multiplied by the factor (torch's
// g.mul_(factor)), unless `step` takes the factor into its next update instead (Note
// [clipping in the step]). Throws ValueError unless max_norm > 0 and finite.
Tensor clip_grad_norm_on_device(const std::vector<Tensor>& params, double max_norm,
                                Optimizer* step = nullptr);

// Learning rate as a function of the optimizer step (0-based).
//   constant  base_lr
//   step      base_lr x gamma^(step / step_size)
//   cosine    a linear warmup to base_lr over warmup_steps, then a half cosine
//             to min_lr at total_steps
//   linear    the same warmup, then a straight line to min_lr at total_steps
//             (Hugging Face's get_linear_schedule_with_warmup, which ends at 0)
//   onecycle  torch.optim.lr_scheduler.OneCycleLR with its defaults and
//             cycle_momentum=False: a cosine rise from base_lr / 25 to base_lr over
//             30% of total_steps (warmup_steps instead, when > 0), then a cosine
//             fall to base_lr / 25 / 1e4 at the last step; min_lr is not used
struct LrSchedule {
  enum class Kind { constant, step, cosine, linear, onecycle };
  Kind kind = Kind::constant;
  float base_lr = 0.01f;
  int64_t step_size = 1;  // step: multiply by gamma every step_size steps
  float gamma = 0.1f;
  int64_t warmup_steps = 0;  // cosine, linear: linear warmup from 0 to base_lr
  int64_t total_steps = 1;   // cosine, linear: reaches min_lr at total_steps
  float min_lr = 0.0f;
  float lr_at(int64_t step) const;
  // "constant", "step", "cosine", "linear", "onecycle"; ValueError lists them otherwise.
  static Kind parse_kind(const std::string& text);
};

// A parameter's saved AdamW step count `t` (entry `key` of a state): i64 as state()
// writes it, or a float scalar as torch keeps it; one whole number >= 0, else a
// ValueError naming `key`. (AdamW::load_state and ZeRO's read steps so.)
int64_t read_step_count(const std::string& key, const Tensor& t);

}  // namespace ddp::optim
