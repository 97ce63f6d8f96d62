#include "collectives/ddp/reducer.h"

#include "collectives/collective_events.h"
#include "runtime/autograd/autograd.h"
#include "runtime/ops/ops.h"
#include "runtime/trace.h"

#include <fmt/ranges.h>
#include "runtime/fmt.h"

#include <algorithm>
#include <chrono>
#include <optional>

namespace ddp {
namespace {

bool same_memory(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.data_ptr() == b.data_ptr() && a.device() == b.device();
}

}  // namespace

Reducer::Reducer(std::vector<Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<Communicator> comm, ReducerOptions options)
    : params_(std::move(params)),
      names_(std::move(names)),
      comm_(std::move(comm)),
      options_(std::move(options)),
      hook_comm_(std::make_shared<HookCommunicator>(comm_)) {
  for (const Tensor& p : params_) infos_.push_back({p.numel(), p.dtype(), p.device()});
  plan_ = plan_buckets(infos_, options_.caps);
  allocate_buckets();
  reset();
}

Reducer::~Reducer() {
  if (!options_.gradient_as_bucket_view) return;
  for (Tensor& p : params_) set_gradient_destination(p, Tensor());
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
      // Backward writes the gradient straight into the bucket where it can.
      if (options_.gradient_as_bucket_view) set_gradient_destination(params_[i], views_[i]);
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

bool Reducer::in_backward() const {
  return next_launch_ > 0 || std::find(ready_.begin(), ready_.end(), 1) != ready_.end();
}

void Reducer::prepare(bool sync) {
  DDP_CHECK(!in_backward(),
            "DistributedDataParallel: forward() was called while the previous synchronized "
            "backward is unfinished; call ddp.finish_backward() after ddp::backward(loss) "
            "(or use ddp.backward(loss), which does both)");
  sync_ = sync;
  armed_ = sync;
  if (sync_) hook_comm_->clear();
}

void Reducer::set_comm_hook(CommHookFn hook) {
  DDP_CHECK(hook != nullptr, "DistributedDataParallel: register_comm_hook got an empty function");
  DDP_CHECK(next_launch_ == 0,
            "DistributedDataParallel: register_comm_hook during a backward; register it before "
            "the first forward (or between finish_backward() and the next forward)");
  options_.comm_hook = std::move(hook);
}

void Reducer::mark_ready(size_t i) {
  if (!sync_) return;  // no_sync(): the gradient just accumulates in .grad
  DDP_CHECK(!ready_[i],
            "DistributedDataParallel: parameter '{}' got a second gradient before "
            "finish_backward(); call ddp.finish_backward() after every backward (or use "
            "ddp.backward(loss))",
            names_[i]);
  // Under gradient_as_bucket_view with zero_grad(set_to_none=false), autograd
  // already accumulated into the bucket: nothing to copy.
  const Tensor g = grad(params_[i]);
  if (!same_memory(g, views_[i])) copy_(views_[i], g);
  ready_[i] = 1;
  if (!rebuilt_) ready_order_.push_back(i);
  count_ready(bucket_of_[i]);
  launch_ready_buckets();
}

// The moment a bucket's last gradient arrived: on the timeline (Note [timeline
// collectives]), before its all-reduce is enqueued (now, or once the buckets
// before it are ready: Note [bucket order]).
void Reducer::count_ready(size_t b) {
  if (--pending_[b] != 0 || !trace::enabled()) return;
  const int64_t bytes = flats_[b].numel() * static_cast<int64_t>(element_size(flats_[b].dtype()));
  trace::instant(fmt::format("bucket {} ready", b), "ddp",
                 {{"bucket", static_cast<int64_t>(b)}, {"bytes", bytes}});
}

// Note [bucket order]: buckets are launched strictly in index order, so every
// rank issues the same sequence of all_reduces even when its gradients
// complete in another order.
void Reducer::launch_ready_buckets() {
  while (next_launch_ < plan_.size() && pending_[next_launch_] == 0) launch_bucket(next_launch_++);
}

// Note [last bucket on the caller]: nothing is left to overlap with the last
// bucket's collective once its last gradient arrived, and finish_backward()
// waits for it next. So its hook runs under CallerRuns (Note [caller runs it] in
// collective_events.h) and the collective is waited for at once, here: on the
// shm, gloo and mpi backends this thread runs it, without waking the
// communication thread and being woken by it. `ddprun -n 2 bench train` on the
// MLP, whose only bucket this is, two A/Bs of alternating rounds: medians
// 161.9K -> 174.5K samples/s (6 of 6 rounds faster) and 174.4K -> 179.4K
// (docs/benchmarks.md). Only the collective is waited for:
// the hook's continuation runs, and an error is thrown, in finish_backward()
// as for every bucket. nccl's wait only orders the caller's stream.
void Reducer::launch_bucket(size_t b) {
  GradBucket bucket;
  bucket.index = b;
  bucket.is_last = b + 1 == plan_.size();
  bucket.buffer = flats_[b];
  for (size_t i : plan_[b].params) {
    bucket.parameters.push_back(params_[i]);
    bucket.gradients.push_back(views_[i]);
  }
  const std::string label = fmt::format("ddp bucket {}", b);
  const CollectiveLabel labelled(label);  // Note [collective labels]
  const trace::Span span(label, "ddp", {{"bucket", static_cast<int64_t>(b)}});
  try {
    if (b == 0 && before_first_bucket_) before_first_bucket_();
    std::optional<CallerRuns> caller_runs;
    if (bucket.is_last) caller_runs.emplace();
    futures_.push_back(options_.comm_hook(*hook_comm_, bucket));
  } catch (...) {
    abandon_buckets();  // the next forward starts a fresh backward
    throw;
  }
  DDP_CHECK(futures_.back().valid(),
            "DistributedDataParallel: the comm hook returned an empty BucketFuture for bucket "
            "{}; return BucketFuture::ready(tensor) or BucketFuture::after(work, then)",
            b);
  if (bucket.is_last) {
    const auto start = std::chrono::steady_clock::now();
    futures_.back().wait_collective();
    last_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
}

void Reducer::collect_bucket(size_t b) {
  const Tensor reduced = futures_[b].wait();
  Tensor& flat = flats_[b];
  const bool fits = reduced.defined() && reduced.numel() == flat.numel() &&
                    reduced.dtype() == flat.dtype() && reduced.device() == flat.device();
  DDP_CHECK(fits,
            "DistributedDataParallel: the comm hook returned {} for bucket {}, which holds {} "
            "elements of {} on {}; a hook must return the reduced bucket with the shape, dtype "
            "and device of bucket.buffer (reduce into bucket.buffer and return it, or copy the "
            "result there)",
            reduced.defined() ? fmt::format("{} elements of {} on {}", reduced.numel(),
                                            dtype_name(reduced.dtype()), reduced.device().str())
                              : std::string("an undefined tensor"),
            b, flat.numel(), dtype_name(flat.dtype()), flat.device().str());
  if (!same_memory(reduced, flat)) copy_(flat, reduced.reshape(flat.shape()));
}

void Reducer::handle_unused() {
  std::vector<std::string> unused;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) unused.push_back(names_[i]);
  }
  if (unused.empty()) return;
  if (!options_.find_unused) {
    abandon_buckets();
    DDP_CHECK(false,
              "DistributedDataParallel: {} parameter(s) received no gradient in this "
              "backward: {}. Every parameter must take part in the loss on every rank; if "
              "some are unused on purpose, construct DistributedDataParallel with "
              "find_unused_parameters = true",
              unused.size(), fmt::join(unused, ", "));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    // Unused in this backward, it contributes what its .grad holds (the
    // micro-batches accumulated under no_sync(), as PyTorch's reducer copies a
    // defined grad), else zero. A bucket view that is the .grad holds it already.
    const Tensor g = grad(params_[i]);
    if (!g.defined()) {
      fill_(views_[i], 0.0);
    } else if (!same_memory(g, views_[i])) {
      copy_(views_[i], g);
    }
    ready_[i] = 1;
    count_ready(bucket_of_[i]);
  }
  launch_ready_buckets();
}

void Reducer::abandon_buckets() {
  orphaned_flats_.insert(orphaned_flats_.end(), flats_.begin(), flats_.end());
  orphaned_futures_.insert(orphaned_futures_.end(), futures_.begin(), futures_.end());
  if (!rebuilt_) ready_order_.clear();  // the next backward observes the order afresh
  allocate_buckets();
  reset();
}

void Reducer::finish(const std::function<double()>& grad_scale) {
  if (!sync_) return;
  DDP_CHECK(armed_ || in_backward(),
            "DistributedDataParallel: finish_backward() with no synchronized forward since the "
            "last one (it ran already: ddp.backward(loss) calls it); call it once after each "
            "ddp::backward(loss)");
  handle_unused();  // may launch bucket 0, and with it a Join's count
  complete(grad_scale);
}

void Reducer::shadow(double grad_scale) {
  DDP_CHECK(!in_backward(),
            "Join: rank {} shadowed a step while its own backward is unfinished; call "
            "ddp.finish_backward() after ddp::backward(loss) before Join::shadow_step()/finish()",
            comm_->rank());
  sync_ = true;
  hook_comm_->clear();
  for (Tensor& flat : flats_) fill_(flat, 0.0);  // this rank adds nothing to the sum
  // Every gradient arrives (as zero) as in a backward: the buckets become ready,
  // and say so on the timeline (Note [timeline collectives]), before their launch.
  for (size_t i = 0; i < params_.size(); ++i) {
    ready_[i] = 1;
    count_ready(bucket_of_[i]);
  }
  launch_ready_buckets();
  complete([grad_scale] { return grad_scale; });
}

void Reducer::complete(const std::function<double()>& grad_scale_of) {
  DDP_ASSERT(next_launch_ == plan_.size(), "{} of {} buckets launched", next_launch_, plan_.size());
  const auto start = std::chrono::steady_clock::now();
  double grad_scale = 1.0;
  try {
    // In bucket order on every rank: a hook's continuation may issue collectives.
    for (size_t b = 0; b < plan_.size(); ++b) collect_bucket(b);
    // A Join's count went with bucket 0: it is in by now.
    if (grad_scale_of) grad_scale = grad_scale_of();
  } catch (...) {
    // The buckets may still be in the backend's hands (a timeout): keep them
    // alive, and leave the reducer ready for the next forward, whose
    // collectives then fail with the communicator's first error.
    abandon_buckets();
    throw;
  }
  if (grad_scale != 1.0) {
    for (Tensor& flat : flats_) copy_(flat, scale(flat, static_cast<float>(grad_scale)));
  }
  stats_.in_backward_s = last_wait_s_;
  stats_.exposed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() +
      last_wait_s_;
  measured_ = hook_comm_->works();  // comm_s is summed when read (stats())
  stats_.bytes = hook_comm_->bytes();
  stats_.buckets = static_cast<int64_t>(plan_.size());
  write_grads();
  if (!rebuilt_) rebuild_buckets();
  reset();
}

// comm_s sums the durations of the last synchronized backward's collectives when
// read: on nccl, Work::wait() only orders the caller's stream, so a collective may
// still run on the GPU when finish() returns and has a duration only once it has
// finished (after a device synchronize, which bench train's timing does).
const CommStats& Reducer::stats() const {
  stats_.comm_s = 0;
  for (const auto& work : measured_) {
    if (auto d = work->duration()) stats_.comm_s += std::chrono::duration<double>(*d).count();
  }
  return stats_;
}

// Note [writing gradients back]: with gradient_as_bucket_view every .grad becomes
// its bucket view (no copy; the next backward overwrites it, as in PyTorch).
// Otherwise the average is copied into the existing .grad: autograd never makes
// .grad alias another tensor (Note [stealing gradients] in autograd.cpp), so
// writing it in place is safe; an unused parameter without .grad gets a copy.
void Reducer::write_grads() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = grad(params_[i]);
    if (options_.gradient_as_bucket_view) {
      if (!same_memory(g, views_[i])) set_grad(params_[i], views_[i]);
    } else if (g.defined() && !same_memory(g, views_[i])) {
      copy_(g, views_[i]);
    } else {
      set_grad(params_[i], views_[i].clone());
    }
  }
}

// Note [bucket rebuild]: once, after the first synchronized backward, the
// buckets are re-planned over the order in which gradients became ready, so the
// first bucket holds what backward finishes first. Ranks may observe different
// orders (threads, unused parameters), so rank 0's order is broadcast and every
// rank plans the same buckets. Parameters that never became ready (unused) go
// last, in their original order.
void Reducer::rebuild_buckets() {
  rebuilt_ = true;
  std::vector<size_t> order = ready_order_;
  std::vector<char> seen(params_.size(), 0);
  for (size_t i : order) seen[i] = 1;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!seen[i]) order.push_back(i);
  }
  ready_order_.clear();
  if (comm_->size() > 1) {
    std::vector<int64_t> wire(order.begin(), order.end());
    Tensor t = from_vector<int64_t>(wire, {static_cast<int64_t>(wire.size())},
                                    {.dtype = DType::i64, .device = comm_->device()});
    const CollectiveLabel labelled("ddp bucket order");
    comm_->broadcast(t, 0)->wait();
    const std::vector<int64_t> from_rank0 = t.to_vector<int64_t>();
    order.assign(from_rank0.begin(), from_rank0.end());
  }
  std::vector<Bucket> plan = plan_buckets_in_order(infos_, order, options_.caps);
  const bool same =
      std::equal(plan.begin(), plan.end(), plan_.begin(), plan_.end(),
                 [](const Bucket& a, const Bucket& b) { return a.params == b.params; });
  if (same) return;
  const std::vector<Tensor> old_views = views_;
  plan_ = std::move(plan);
  allocate_buckets();
  for (size_t i = 0; i < params_.size(); ++i) {
    copy_(views_[i], old_views[i]);
    if (options_.gradient_as_bucket_view) set_grad(params_[i], views_[i]);
  }
}

void Reducer::reset() {
  armed_ = false;
  ready_.assign(params_.size(), 0);
  pending_.clear();
  for (const Bucket& b : plan_) pending_.push_back(b.params.size());
  next_launch_ = 0;
  futures_.clear();
  last_wait_s_ = 0;
}

}  // namespace ddp
