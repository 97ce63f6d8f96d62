#include "collectives/ddp/join.h"

#include "collectives/collective_events.h"
#include "collectives/ddp/distributed_data_parallel.h"
#include "collectives/ddp/reducer.h"
#include "runtime/logging.h"
#include "runtime/ops/ops.h"

#include <exception>
#include <numeric>

namespace ddp {

// Note [join]: what each rank issues, in order, for one synchronized step while a
// Join is attached (PyTorch 1.13's Join and _DDPJoinHook, with its two per-forward
// all-reduces -- "not joined" and "requires sync" -- folded into one):
//
//   a rank that still trains            a joined rank (shadow_step)
//   [buffers: in forward, the count,    all_reduce(count, sum), reads it; 0: done
//    then a broadcast from the highest  [buffers: broadcast from the same rank]
//    rank that trains]
//   backward: all_reduce(count, sum)    zeros through the comm hook, buckets 0, 1, ...
//     before bucket 0; buckets 0, 1,      (the same plan: sizes, order, dtypes)
//     ... through the comm hook
//   finish_backward: waits; x W/n when  waits; x W/n when dividing by the ranks that
//     dividing by the ranks that train    train; .grad = the average
//   [first step only: the rebuilt       [the same broadcast, with this rank's order
//    bucket order from rank 0]            when it is rank 0]
//
// The count is a vector of world-size i64 slots, slot r 1 while rank r trains, so
// every rank also learns which ranks train: the root of the buffer broadcasts and,
// at the end, the last joiners (those still training at the last count with any)
// without further collectives. Backwards under no_sync() launch no bucket and
// issue nothing, so a joined rank shadows steps, not micro-batches; under a Join
// their forwards do not broadcast buffers either (rank 0 may have joined with
// stale ones). The count goes just before bucket 0 rather than in forward (where
// PyTorch's go): there it wakes the communication thread while forward
// computes, which cost the MLP's step a median 40 us against 20 us just before
// bucket 0 (7 alternating runs each on the loaded 2-core machine; docs/benchmarks.md).
// The gradient of a step is the all-reduced average over the world (the joined
// ranks' zeros included): sum over the training ranks / W, PyTorch's default
// divide_by_initial_world_size; for the other mode the bucket is then scaled by
// W / n, n the ranks that train (PyTorch divides each gradient by n before its
// all_reduce(sum); the two differ by rounding). The count's result is read only
// where it is needed (a joined rank, buffers, dividing by n), so a GPU rank that
// trains does not wait on the host for it. A joined rank's .grad gets the
// step's average too, so after_shadow_step (or the caller, after shadow_step())
// can apply the same update and keep the optimizer's state in step: `train`
// does, so its model never differs between ranks. At the end every rank takes the
// model of the highest-ranked last joiner, as PyTorch's _sync_final_model.

Join::Join(DistributedDataParallel& ddp, JoinOptions options)
    : ddp_(nullptr), comm_(ddp.comm()), options_(std::move(options)) {
  last_active_.assign(static_cast<size_t>(comm_->size()), 1);
  if (!options_.enable) return;
  DDP_CHECK(ddp.join_ == nullptr,
            "Join: this DistributedDataParallel already has a Join attached; finish it (or let "
            "it go out of scope) before creating another");
  DDP_CHECK(ddp.reducer_ != nullptr,
            "Join: rank {}'s DistributedDataParallel has zero_stage {}, whose gradients are "
            "reduce-scattered by the ZeroOptimizer, not by DDP's buckets; uneven inputs need "
            "zero_stage 0 or 1 (or even inputs: drop the last batches)",
            comm_->rank(), ddp.options().zero_stage);
  DDP_CHECK(!ddp.reducer_->in_backward(),
            "Join: created on rank {} during a synchronized backward (gradients have arrived "
            "but finish_backward() has not run); create the Join before the step's forward or "
            "after ddp.finish_backward()",
            comm_->rank());
  // The count goes with bucket 0 (or a forward with buffers): a model without
  // buckets would never issue it, and a joined rank would wait for it forever.
  DDP_CHECK(!ddp.buckets().empty(),
            "Join: rank {}'s model has no parameter that requires a gradient, so its backwards "
            "all-reduce nothing and carry no Join count; uneven inputs need no Join there (or "
            "make some parameter trainable)",
            comm_->rank());
  ddp.join_ = this;
  ddp_ = &ddp;
  ddp.reducer_->set_before_first_bucket([this] { before_first_bucket(); });
}

Join::~Join() {
  if (ddp_ == nullptr) return;
  if (!finished_ && std::uncaught_exceptions() == 0) {
    DDP_LOG_WARN(
        "Join destroyed on rank {} before finish(): the ranks that still train will wait for "
        "this rank's shadow collectives and fail after the communicator's timeout. Call "
        "join.finish() once this rank has run out of inputs",
        comm_->rank());
  }
  detach();
}

void Join::model_destroyed() {
  ddp_ = nullptr;
  model_destroyed_ = true;
}

void Join::check_model_alive(const char* what) const {
  DDP_CHECK(!model_destroyed_,
            "Join::{} on rank {}: its DistributedDataParallel was destroyed before, so this "
            "rank cannot shadow the others' steps and they would wait for it; keep the model "
            "alive until finish() has returned on this rank",
            what, comm_->rank());
}

void Join::detach() {
  if (ddp_ != nullptr) {
    ddp_->join_ = nullptr;
    ddp_->reducer_->set_before_first_bucket(nullptr);
  }
  ddp_ = nullptr;
}

int Join::active_ranks() const {
  return static_cast<int>(std::accumulate(last_active_.begin(), last_active_.end(), int64_t{0}));
}

int Join::highest_active() const {
  for (int r = comm_->size() - 1; r >= 0; --r) {
    if (last_active_[static_cast<size_t>(r)] > 0) return r;
  }
  return comm_->size() - 1;
}

std::vector<int64_t> Join::read_count() {
  count_work_->wait();
  return count_.to_vector<int64_t>();
}

void Join::issue_count(bool training) {
  if (count_work_ != nullptr) count_work_->wait();  // the previous step's: done long ago
  std::vector<int64_t> slots(static_cast<size_t>(comm_->size()), 0);
  if (training) slots[static_cast<size_t>(comm_->rank())] = 1;
  count_ = from_vector<int64_t>(slots, {comm_->size()},
                                {.dtype = DType::i64, .device = comm_->device()});
  const CollectiveLabel labelled("ddp join count");
  count_work_ = comm_->all_reduce(count_, ReduceOp::sum);
}

void Join::on_forward(bool synchronized) {
  if (!synchronized) return;
  DDP_CHECK(!joined_,
            "Join: rank {} ran a synchronized forward after it joined (shadow_step() or "
            "finish()); a rank that ran out of inputs only shadows until Join::finish()",
            comm_->rank());
  if (!ddp_->options_.broadcast_buffers || ddp_->module_->named_buffers().empty()) return;
  // The root of the buffers is the highest rank that trains: the count goes now.
  issue_count(true);
  step_pending_ = true;
  count_in_forward_ = true;
  last_active_ = read_count();
  broadcast_buffers(highest_active());
}

void Join::before_first_bucket() {
  if (joined_) return;  // shadow_step() issued its count before shadowing
  if (count_in_forward_) {
    count_in_forward_ = false;
    return;
  }
  issue_count(true);
  step_pending_ = true;
}

double Join::grad_scale() {
  if (!step_pending_) return 1.0;
  step_pending_ = false;
  if (options_.divide_by_initial_world_size) return 1.0;
  const std::vector<int64_t> active = read_count();
  const int64_t n = std::accumulate(active.begin(), active.end(), int64_t{0});
  DDP_ASSERT(n >= 1, "join count {} on a rank that trains", n);
  return static_cast<double>(comm_->size()) / static_cast<double>(n);
}

void Join::adopt_own_count() {
  // This rank trained in its last count, so that count had ranks that trained.
  if (count_work_ != nullptr) last_active_ = read_count();
}

void Join::broadcast_buffers(int root) {
  std::vector<Tensor> buffers;
  for (auto& [name, t] : ddp_->module_->named_buffers()) buffers.push_back(t);
  ddp_->broadcast_from(root, buffers, "ddp join buffers");
}

bool Join::shadow_step() {
  DDP_CHECK(!finished_, "Join::shadow_step() on rank {} after finish()", comm_->rank());
  check_model_alive("shadow_step()");
  if (ddp_ == nullptr || all_joined_) return false;
  if (!joined_) {
    joined_ = true;
    adopt_own_count();
  }
  step_pending_ = false;
  issue_count(false);
  const std::vector<int64_t> active = read_count();
  const int64_t n = std::accumulate(active.begin(), active.end(), int64_t{0});
  if (n == 0) {
    all_joined_ = true;
    return false;
  }
  last_active_ = active;
  if (ddp_->options_.broadcast_buffers && !ddp_->module_->named_buffers().empty()) {
    broadcast_buffers(highest_active());
  }
  const double scale = options_.divide_by_initial_world_size
                           ? 1.0
                           : static_cast<double>(comm_->size()) / static_cast<double>(n);
  ddp_->reducer_->shadow(scale);
  ++shadowed_;
  if (options_.after_shadow_step) options_.after_shadow_step();
  return true;
}

void Join::sync_final_model() {
  authoritative_ = highest_active();
  std::vector<Tensor> state;
  for (auto& [name, t] : ddp_->module_->named_parameters()) state.push_back(t);
  for (auto& [name, t] : ddp_->module_->named_buffers()) state.push_back(t);
  ddp_->broadcast_from(authoritative_, state, "ddp join final model");
}

void Join::finish() {
  DDP_CHECK(!finished_,
            "Join::finish() was called twice on rank {}; call it once, when this rank has run "
            "out of inputs",
            comm_->rank());
  check_model_alive("finish()");
  if (ddp_ != nullptr) {
    while (shadow_step()) {
    }
    sync_final_model();
  }
  finished_ = true;
  detach();
}

}  // namespace ddp
