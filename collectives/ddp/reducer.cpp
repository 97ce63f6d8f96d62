#include "collectives/ddp/reducer.h"

#include "runtime/autograd/autograd.h"
#include "runtime/ops/ops.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace ddp {

Reducer::Reducer(std::vector<Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<Communicator> comm, const BucketCaps& caps, bool find_unused)
    : params_(std::move(params)),
      names_(std::move(names)),
      comm_(std::move(comm)),
      find_unused_(find_unused) {
  std::vector<ParamInfo> infos;
  for (const Tensor& p : params_) infos.push_back({p.numel(), p.dtype(), p.device()});
  plan_ = plan_buckets(infos, caps);
  allocate_buckets();
  reset();
}

void Reducer::allocate_buckets() {
  flats_.clear();
  views_.resize(params_.size());
  bucket_of_.resize(params_.size());
  for (size_t b = 0; b < plan_.size(); ++b) {
    const Bucket& bucket = plan_[b];
    flats_.push_back(zeros({bucket.numel}, {.dtype = bucket.dtype, .device = bucket.device}));
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const size_t i = bucket.params[k];
      views_[i] = flats_[b].flat_view(bucket.offsets[k], params_[i].shape());
      bucket_of_[i] = b;
    }
  }
}

void Reducer::install_hooks() {
  std::weak_ptr<Reducer> weak = weak_from_this();
  for (size_t i = 0; i < params_.size(); ++i) {
    register_post_accumulate_grad_hook(params_[i], [weak, i](Tensor&) {
      if (auto reducer = weak.lock()) reducer->mark_ready(i);
    });
  }
}

void Reducer::prepare(bool sync) {
  DDP_CHECK(next_launch_ == 0 && std::find(ready_.begin(), ready_.end(), 1) == ready_.end(),
            "DistributedDataParallel: forward() was called while the previous synchronized "
            "backward is unfinished; call ddp.finish_backward() after ddp::backward(loss) "
            "(or use ddp.backward(loss), which does both)");
  sync_ = sync;
}

void Reducer::mark_ready(size_t i) {
  if (!sync_) return;  // no_sync(): the gradient just accumulates in .grad
  DDP_CHECK(!ready_[i],
            "DistributedDataParallel: parameter '{}' got a second gradient before "
            "finish_backward(); call ddp.finish_backward() after every backward (or use "
            "ddp.backward(loss))",
            names_[i]);
  copy_(views_[i], grad(params_[i]));
  ready_[i] = 1;
  --pending_[bucket_of_[i]];
  launch_ready_buckets();
}

// Note [bucket order]: buckets are launched strictly in index order, so every
// rank issues the same sequence of all_reduces even when its gradients
// complete in another order.
void Reducer::launch_ready_buckets() {
  while (next_launch_ < plan_.size() && pending_[next_launch_] == 0) {
    works_.push_back(comm_->all_reduce(flats_[next_launch_], ReduceOp::avg));
    ++next_launch_;
  }
}

void Reducer::handle_unused() {
  std::vector<std::string> unused;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) unused.push_back(names_[i]);
  }
  if (unused.empty()) return;
  if (!find_unused_) {
    orphaned_flats_.insert(orphaned_flats_.end(), flats_.begin(), flats_.end());
    orphaned_works_.insert(orphaned_works_.end(), works_.begin(), works_.end());
    allocate_buckets();
    reset();
    DDP_CHECK(false,
              "DistributedDataParallel: {} parameter(s) received no gradient in this "
              "backward: {}. Every parameter must take part in the loss on every rank; if "
              "some are unused on purpose, construct DistributedDataParallel with "
              "find_unused_parameters = true",
              unused.size(), fmt::join(unused, ", "));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    fill_(views_[i], 0.0);  // an unused parameter contributes zero to the average
    ready_[i] = 1;
    --pending_[bucket_of_[i]];
  }
  launch_ready_buckets();
}

void Reducer::finish() {
  if (!sync_) return;
  handle_unused();
  DDP_ASSERT(next_launch_ == plan_.size(), "{} of {} buckets launched", next_launch_, plan_.size());
  for (const auto& work : works_) work->wait();
  // A fresh tensor per .grad: gradients handed over by autograd may alias each
  // other (Note [stealing gradients] in autograd.cpp), so they are not written.
  for (size_t i = 0; i < params_.size(); ++i) set_grad(params_[i], views_[i].clone());
  reset();
}

void Reducer::reset() {
  ready_.assign(params_.size(), 0);
  pending_.clear();
  for (const Bucket& b : plan_) pending_.push_back(b.params.size());
  next_launch_ = 0;
  works_.clear();
}

}  // namespace ddp
