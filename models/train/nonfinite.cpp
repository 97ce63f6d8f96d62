#include "models/train/nonfinite.h"

#include "runtime/autograd/autograd.h"
#include "runtime/logging.h"
#include "runtime/ops/ops.h"

#include <cmath>

namespace ddp::train {
namespace {

// Note [non-finite check]: every step computes the squared norm of the final
// gradients on the device (a multiply, a sum and an add per parameter tensor).
// Under DDP the gradients are already averaged over the ranks, and a NaN or an
// infinity on any rank's gradient makes the average non-finite on every rank, so
// the norm gives every rank the same verdict without a collective.
// stop (the default) keeps the step's loss and norm in device slots and reads
// them in one copy where the loop already reads the device: each progress line
// (every 10 steps by default), the end of an epoch, before a checkpoint, and when
// kWindow slots are full. So a GPU run gets no host synchronization per step; the
// error still names the first bad step, and no checkpoint holds its weights.
// skip reads the verdict every step, as PyTorch's GradScaler does for its
// found_inf (one host synchronization per step on a GPU); the loss is local to a
// rank, so its state is all-reduced too (a 1-element all_reduce per step) and
// every rank leaves the same steps out.
constexpr int64_t kWindow = 64;

bool finite(float v) {
  return std::isfinite(v);
}

}  // namespace

NonfiniteCheck::NonfiniteCheck(const std::string& action, const Device& device, Communicator* comm,
                               int rank)
    : skip_(action == "skip"), device_(device), comm_(comm), rank_(rank) {
  DDP_ASSERT(action == "stop" || action == "skip", "--on-nonfinite {}", action);
  if (!skip_) {
    losses_ = zeros({kWindow}, {.device = device});
    norms_ = zeros({kWindow}, {.device = device});
  }
}

Tensor NonfiniteCheck::squared_grad_norm(const std::vector<Tensor>& params) const {
  NoGradGuard no_grad;
  Tensor total = zeros({}, {.device = device_});
  for (const Tensor& p : params) {
    const Tensor g = grad(p);
    if (!g.defined()) continue;
    axpy_(1.0f, sum(mul(g, g)), total);
  }
  return total;
}

bool NonfiniteCheck::after_backward(int64_t step, int64_t epoch, const Tensor& loss,
                                    const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  const Tensor norm2 = squared_grad_norm(params);
  if (skip_) {
    // [loss * 0, norm2]: loss * 0 is NaN exactly when the loss is not finite, and
    // stays NaN through the sum over ranks.
    Tensor values = zeros({2}, {.device = device_});
    Tensor loss_slot = values.slice(0, 1), norm_slot = values.slice(1, 2);
    copy_(loss_slot, scale(loss, 0.0f).reshape({1}));
    copy_(norm_slot, norm2.reshape({1}));
    if (comm_ != nullptr && comm_->size() > 1) comm_->all_reduce(values)->wait();
    const auto v = values.to_vector<float>();
    if (finite(v[0]) && finite(v[1])) return false;
    ++skipped_;
    if (rank_ == 0) {
      DDP_LOG_WARN(
          "step {} (epoch {}): non-finite {}; its update is skipped on every rank ({} so far)",
          step, epoch, finite(v[0]) ? "gradient norm" : "loss", skipped_);
    }
    return true;
  }
  const int64_t slot = static_cast<int64_t>(steps_.size());
  Tensor loss_slot = losses_.slice(slot, slot + 1), norm_slot = norms_.slice(slot, slot + 1);
  copy_(loss_slot, loss.reshape({1}));
  copy_(norm_slot, norm2.reshape({1}));
  steps_.emplace_back(step, epoch);
  if (static_cast<int64_t>(steps_.size()) == kWindow) check();
  return false;
}

void NonfiniteCheck::check() {
  if (skip_) return;
  // The first step of the window whose loss (this rank's) or norm is not finite.
  int64_t bad_loss = 0, bad_norm = 0;
  float loss_value = 0, norm2_value = 0;
  if (!steps_.empty()) {
    const auto losses = losses_.to_vector<float>();
    const auto norms = norms_.to_vector<float>();
    for (size_t i = 0; i < steps_.size() && bad_loss == 0 && bad_norm == 0; ++i) {
      if (!finite(losses[i])) bad_loss = steps_[i].first;
      if (!finite(norms[i])) bad_norm = steps_[i].first;
      loss_value = losses[i];
      norm2_value = norms[i];
    }
  }
  // Which rank's loss went first: every rank calls check() at the same steps, so
  // the error names the culprit on every rank, not whichever reads it first.
  int culprit = bad_loss > 0 ? rank_ : -1;
  int64_t culprit_step = bad_loss;
  if (comm_ != nullptr && comm_->size() > 1) {
    std::vector<int64_t> by_rank(static_cast<size_t>(comm_->size()), 0);
    by_rank[static_cast<size_t>(rank_)] = bad_loss;
    Tensor t = from_vector<int64_t>(by_rank, {comm_->size()},
                                    {.dtype = DType::i64, .device = comm_->device()});
    comm_->all_reduce(t, ReduceOp::max)->wait();
    by_rank = t.to_vector<int64_t>();
    for (int r = 0; r < comm_->size(); ++r) {
      const int64_t s = by_rank[static_cast<size_t>(r)];
      if (s > 0 && (culprit < 0 || s < culprit_step)) culprit = r, culprit_step = s;
    }
  }
  if (culprit >= 0) fail(culprit_step, culprit, culprit == rank_ ? loss_value : NAN, NAN);
  if (bad_norm > 0) fail(bad_norm, -1, loss_value, norm2_value);
  steps_.clear();
}

int64_t NonfiniteCheck::epoch_of(int64_t step) const {
  for (const auto& [s, e] : steps_) {
    if (s == step) return e;
  }
  return 0;
}

void NonfiniteCheck::fail(int64_t step, int culprit, float loss, float norm2) const {
  const std::string what =
      culprit >= 0 ? fmt::format("non-finite loss at step {} (epoch {}) on rank {} ({})", step,
                                 epoch_of(step), culprit,
                                 culprit == rank_ ? fmt::format("loss {}", loss)
                                                  : fmt::format("seen from rank {}", rank_))
                   : fmt::format(
                         "non-finite gradient norm at step {} (epoch {}) (gradient norm {}, "
                         "loss {} on rank {})",
                         step, epoch_of(step), std::sqrt(norm2), loss, rank_);
  throw ValueError(fmt::format(
      "{}. Training stopped; no checkpoint holds its weights. Lower --lr, check the data, or "
      "pass --on-nonfinite skip to leave such steps out",
      what));
}

}  // namespace ddp::train
