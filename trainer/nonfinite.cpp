#include "trainer/nonfinite.h"

#include "collectives/collective_events.h"
#include "runtime/autograd/autograd.h"
#include "runtime/logging.h"
#include "runtime/ops/ops.h"

#include <cmath>

namespace ddp::train {
namespace {

// Note [non-finite check]: the loss is checked every step; the gradient norm only
// where it is needed before the update (skip), because a reduction over every
// gradient costs about 120 us per step for the 203,530-parameter MLP on this
// machine's CPU (15% of a step) while recording the loss costs about 2 us.
// stop (the default) keeps each step's loss in a device slot and reads the slots
// in one copy where the loop already reads the device: each progress line (every
// 10 steps by default), the end of an epoch, before a checkpoint, and when kWindow
// slots are full. A GPU run gets no host synchronization per step; the error names
// the first bad step and, through a small all_reduce at those points, the rank
// whose loss it was. Non-finite gradients with a finite loss make the weights
// non-finite, which the next step's loss shows; the weights are checked too on
// every rank before a checkpoint and at each epoch's end (a run's last step
// included), with the verdict all-reduced so all ranks stop at the same step,
// none waiting in a collective for a rank that stopped.
// skip reads its verdict every step, as PyTorch's GradScaler does for found_inf
// (a host synchronization per step on a GPU): the squared gradient norm (after
// DDP's average, so the same on every rank: a NaN on any rank's gradient makes
// every rank's average NaN) and the loss, both all-reduced (a 2-element
// all_reduce per step) so every rank leaves the same steps out.
constexpr int64_t kWindow = 64;

bool finite(float v) {
  return std::isfinite(v);
}

}  // namespace

NonfiniteCheck::NonfiniteCheck(const std::string& action, const Device& device, Communicator* comm,
                               int rank, int64_t skipped)
    : skip_(action == "skip"), device_(device), comm_(comm), rank_(rank), skipped_(skipped) {
  DDP_ASSERT(action == "stop" || action == "skip", "--on-nonfinite {}", action);
  if (!skip_) {
    losses_ = zeros({kWindow}, {.device = device});
  }
}

Tensor NonfiniteCheck::squared_grad_norm(const std::vector<Tensor>& grads) const {
  NoGradGuard no_grad;
  Tensor total = zeros({}, {.device = device_});
  for (const Tensor& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    axpy_(1.0f, sum(mul(g, g)), total);
  }
  return total;
}

bool NonfiniteCheck::after_backward(int64_t step, int64_t epoch, const Tensor& loss,
                                    const std::vector<Tensor>& grads) {
  NoGradGuard no_grad;
  if (skip_) {
    const Tensor norm2 = squared_grad_norm(grads);
    // [loss * 0, norm2]: loss * 0 is NaN exactly when the loss is not finite, and
    // stays NaN through the sum over ranks.
    Tensor values = zeros({2}, {.device = device_});
    Tensor loss_slot = values.slice(0, 1), norm_slot = values.slice(1, 2);
    copy_(loss_slot, scale(loss, 0.0f).reshape({1}));
    copy_(norm_slot, norm2.reshape({1}));
    const CollectiveLabel labelled("nonfinite step check");
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
  Tensor loss_slot = losses_.slice(slot, slot + 1);
  copy_(loss_slot, loss.reshape({1}));
  steps_.emplace_back(step, epoch);
  if (static_cast<int64_t>(steps_.size()) == kWindow) check();
  return false;
}

void NonfiniteCheck::check() {
  if (skip_) return;
  // The first step of the window whose loss (this rank's) or norm is not finite.
  int64_t bad_loss = 0;
  float loss_value = 0;
  if (!steps_.empty()) {
    const auto losses = losses_.to_vector<float>();
    for (size_t i = 0; i < steps_.size() && bad_loss == 0; ++i) {
      if (!finite(losses[i])) bad_loss = steps_[i].first;
      loss_value = losses[i];
    }
  }
  // Which rank's loss went first: every rank calls check() at the same steps, so
  // the error names the culprit on every rank, not whichever reads it first; of
  // ranks bad at the same step, the lowest.
  int culprit = bad_loss > 0 ? rank_ : -1;
  int64_t culprit_step = bad_loss;
  if (comm_ != nullptr && comm_->size() > 1) {
    culprit = -1;
    std::vector<int64_t> by_rank(static_cast<size_t>(comm_->size()), 0);
    by_rank[static_cast<size_t>(rank_)] = bad_loss;
    Tensor t = from_vector<int64_t>(by_rank, {comm_->size()},
                                    {.dtype = DType::i64, .device = comm_->device()});
    const CollectiveLabel labelled("nonfinite loss check");
    comm_->all_reduce(t, ReduceOp::max)->wait();
    by_rank = t.to_vector<int64_t>();
    for (int r = 0; r < comm_->size(); ++r) {
      const int64_t s = by_rank[static_cast<size_t>(r)];
      if (s > 0 && (culprit < 0 || s < culprit_step)) culprit = r, culprit_step = s;
    }
  }
  if (culprit >= 0) fail(culprit_step, culprit, loss_value);
  steps_.clear();
}

void NonfiniteCheck::check_weights(int64_t step, const std::vector<Tensor>& params) const {
  NoGradGuard no_grad;
  Tensor total = zeros({}, {.device = device_});
  for (const Tensor& p : params) axpy_(1.0f, sum(p), total);
  const float v = total.item<float>();
  int culprit = finite(v) ? -1 : rank_;
  if (comm_ != nullptr && comm_->size() > 1) {
    std::vector<int64_t> bad(static_cast<size_t>(comm_->size()), 0);
    bad[static_cast<size_t>(rank_)] = finite(v) ? 0 : 1;
    Tensor t = from_vector<int64_t>(bad, {comm_->size()},
                                    {.dtype = DType::i64, .device = comm_->device()});
    const CollectiveLabel labelled("nonfinite weights check");
    comm_->all_reduce(t, ReduceOp::max)->wait();
    bad = t.to_vector<int64_t>();
    culprit = -1;
    for (int r = comm_->size() - 1; r >= 0; --r) {
      if (bad[static_cast<size_t>(r)] != 0) culprit = r;
    }
  }
  DDP_CHECK(culprit < 0,
            "non-finite weights after step {} on rank {} ({}): a gradient was not finite. "
            "Training stopped; no checkpoint holds them. Lower --lr, check the data, or pass "
            "--on-nonfinite skip",
            step, culprit,
            culprit == rank_ ? fmt::format("their sum is {}", v)
                             : fmt::format("seen from rank {}", rank_));
}

int64_t NonfiniteCheck::epoch_of(int64_t step) const {
  for (const auto& [s, e] : steps_) {
    if (s == step) return e;
  }
  return 0;
}

void NonfiniteCheck::fail(int64_t step, int culprit, float loss) const {
  throw ValueError(fmt::format(
      "non-finite loss at step {} (epoch {}) on rank {} ({}). Training stopped; no checkpoint "
      "holds its weights. Lower --lr, check the data, or pass --on-nonfinite skip to leave such "
      "steps out",
      step, epoch_of(step), culprit,
      culprit == rank_ ? fmt::format("loss {}", loss) : fmt::format("seen from rank {}", rank_)));
}

}  // namespace ddp::train
