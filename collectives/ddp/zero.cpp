#include "collectives/ddp/zero.h"

#include "collectives/collective_events.h"
#include "collectives/ddp/distributed_data_parallel.h"
#include "collectives/ddp/zero_grads.h"
#include "runtime/autograd/autograd.h"
#include "runtime/ops/multi_tensor.h"
#include "runtime/ops/nn_ops.h"
#include "runtime/ops/ops.h"
#include "runtime/ops/transformer_ops.h"

#include <fmt/ranges.h>
#include "runtime/fmt.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>

namespace ddp {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

ShardRange zero_shard(int64_t numel, int world, int rank) {
  const int64_t base = numel / world;
  const int64_t extra = numel % world;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, base + (rank < extra ? 1 : 0)};
}

// Each boundary is the parameter boundary nearest to r * N / W (never before the
// previous one), so a rank's share is as near N / W as whole parameters allow.
std::vector<ShardRange> zero_shards_by_parameters(const std::vector<int64_t>& numels, int world) {
  std::vector<int64_t> starts{0};
  for (int64_t n : numels) starts.push_back(starts.back() + n);
  const int64_t total = starts.back();
  std::vector<ShardRange> shards;
  int64_t begin = 0;
  for (int r = 0; r < world; ++r) {
    int64_t end = total;
    if (r + 1 < world) {
      const int64_t target = total * (r + 1) / world;
      end = begin;
      for (int64_t b : starts) {
        if (b >= begin && std::abs(b - target) < std::abs(end - target)) end = b;
      }
    }
    shards.push_back({begin, end - begin});
    begin = end;
  }
  return shards;
}

ZeroOptimizer::ZeroOptimizer(std::unique_ptr<optim::Optimizer> inner,
                             std::shared_ptr<Communicator> comm, ZeroOptions options)
    : Optimizer(inner != nullptr ? inner->params() : std::vector<Tensor>{},
                inner != nullptr ? inner->lr() : 0.0f),
      inner_(std::move(inner)),
      comm_(std::move(comm)),
      options_(options) {
  DDP_CHECK(inner_ != nullptr && comm_ != nullptr,
            "ZeroOptimizer needs an optimizer to shard and a communicator");
  rank_ = comm_->rank();
  world_ = comm_->size();
  DDP_CHECK(options_.stage >= 1 && options_.stage <= 3,
            "ZeroOptimizer: stage {} is not sharded; valid: 1 (optimizer state), 2 (optimizer "
            "state and gradients) or 3 (and parameters). Stage 0 is plain "
            "DistributedDataParallel with its optimizer",
            options_.stage);
  DDP_CHECK(options_.bucket_cap_mb > 0, "ZeroOptimizer: bucket_cap_mb {} must be positive (MiB)",
            options_.bucket_cap_mb);
  DDP_CHECK(options_.replicas == 1 || (options_.replicas == 2 && options_.stage <= 2),
            "ZeroOptimizer: replicas {} at stage {}; valid: 1, or 2 at stages 1 and 2 (Note [zero "
            "replicas]: a second copy of each rank's optimizer shard)",
            options_.replicas, options_.stage);
  if (const auto* a = dynamic_cast<const optim::AdamW*>(inner_.get())) {
    adamw_ = true;
    adamw_options_ = a->options();
    weight_decay_ = a->weight_decays();
  } else if (const auto* s = dynamic_cast<const optim::SGD*>(inner_.get())) {
    sgd_options_ = s->options();
    weight_decay_.assign(params_.size(), sgd_options_.weight_decay);
  } else {
    DDP_CHECK(false, "ZeroOptimizer shards adamw and sgd, not '{}'; use one of those",
              inner_->name());
  }
  starts_.push_back(0);
  for (const Tensor& p : params_) starts_.push_back(starts_.back() + p.numel());
  const int world = comm_->size();
  if (options_.by_parameters) {
    std::vector<int64_t> numels;
    for (const Tensor& p : params_) numels.push_back(p.numel());
    shards_ = zero_shards_by_parameters(numels, world);
  } else {
    for (int r = 0; r < world; ++r) shards_.push_back(zero_shard(numel(), world, r));
  }
  for (const ShardRange& s : shards_) max_shard_ = std::max(max_shard_, s.size);
  // A round never exceeds the largest shard: a small model's buffers stay small.
  chunk_ = std::clamp<int64_t>(static_cast<int64_t>(options_.bucket_cap_mb * kMiB / 4.0) / world, 1,
                               std::max<int64_t>(1, max_shard_));
  if (!params_.empty()) device_ = params_.front().device();
  param_steps_.assign(params_.size(), 0);
  if (options_.replicas == 2 && world > 1) replica_ = (comm_->rank() + 1) % world;
  if (options_.stage == 2) {
    grads_ = std::make_shared<ZeroGradReducer>(ZeroGradLayout{.params = params_,
                                                              .starts = starts_,
                                                              .shards = shards_,
                                                              .max_shard = max_shard_,
                                                              .chunk = chunk_,
                                                              .device = device_},
                                               comm_);
  }
}

ZeroOptimizer::ZeroOptimizer(std::unique_ptr<optim::Optimizer> inner, DistributedDataParallel& ddp)
    : ZeroOptimizer(std::move(inner), ddp, ZeroOptions{}) {}

ZeroOptimizer::ZeroOptimizer(std::unique_ptr<optim::Optimizer> inner, DistributedDataParallel& ddp,
                             ZeroOptions options)
    : ZeroOptimizer(std::move(inner), ddp.comm(), [&] {
        options.stage = ddp.options().zero_stage;
        options.bucket_cap_mb = ddp.options().bucket_cap_mb;
        return options;
      }()) {
  if (options_.stage >= 2) attach(ddp);
}

ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::attach(DistributedDataParallel& ddp) {
  DDP_CHECK(options_.stage >= 2 && ddp.options().zero_stage == options_.stage,
            "ZeroOptimizer::attach: the optimizer has stage {} and the DDP zero_stage {}; only "
            "stages 2 and 3 reduce gradients during the backward (both must be the same); at "
            "stage 1 DDP all-reduces them, so do not attach",
            options_.stage, ddp.options().zero_stage);
  DDP_CHECK(ddp.comm() == comm_,
            "ZeroOptimizer::attach: the DDP uses another communicator than the optimizer; "
            "create the ZeroOptimizer with ddp.comm()");
  if (options_.stage == 3) {
    attach_stage3(ddp);
    return;
  }
  const std::weak_ptr<ZeroGradReducer> weak = grads_;
  for (size_t i = 0; i < params_.size(); ++i) {
    // A frozen parameter gets no gradient: its rounds launch at finish(), as for
    // one unused in this backward (Note [zero stage 2 rounds]).
    if (!requires_grad(params_[i])) continue;
    register_post_accumulate_grad_hook(params_[i], [weak, i](Tensor&) {
      if (auto grads = weak.lock()) grads->on_gradient(i);
    });
  }
  ddp.set_zero_callbacks({.on_forward =
                              [weak](bool sync) {
                                if (auto grads = weak.lock()) grads->arm(sync);
                              },
                          .on_finish =
                              [weak] {
                                if (auto grads = weak.lock()) grads->end_backward();
                              }});
}

// Calls fn(i, offset in parameter i, length, offset from `begin`) for every
// parameter piece of the flat range [begin, begin + len).
template <typename F>
void ZeroOptimizer::for_each_piece(int64_t begin, int64_t len, F&& fn) const {
  for_each_flat_piece(starts_, begin, len, std::forward<F>(fn));
}

// The averaged gradient of a piece of this rank's shard: stage 1 a view of DDP's
// .grad (undefined where the parameter has none), stage 2 of the gradient shard.
Tensor ZeroOptimizer::grad_piece(size_t i, int64_t param_offset, int64_t len,
                                 int64_t shard_offset) const {
  // A frozen parameter has no gradient at any stage, so the step leaves it (and its
  // state) alone, as torch's optimizers skip a parameter whose .grad is None.
  if (!requires_grad(params_[i])) return Tensor();
  if (options_.stage == 2) return grads_->shard().flat_view(shard_offset, {len});
  const Tensor g = grad(params_[i]);
  return g.defined() ? g.flat_view(param_offset, {len}) : Tensor();
}

void ZeroOptimizer::clear_state() {
  exp_avg_ = exp_avg_sq_ = momentum_ = Tensor();
  replica_exp_avg_ = replica_exp_avg_sq_ = replica_momentum_ = Tensor();
  replica_params_ = replica_grad_ = Tensor();
  pending_ = false;
  before_recovery_.reset();  // a new state: an earlier recovery's copy is over
  clip_factor_ = 1.0f;
  gathered_ = false;
  full_state_.clear();
  param_steps_.assign(params_.size(), 0);
}

void ZeroOptimizer::allocate_state() {
  const int64_t n = options_.stage == 3 ? state_size_ : shard().size;
  const int64_t r = replica_ >= 0 ? shards_[static_cast<size_t>(replica_)].size : 0;
  if (adamw_) {
    exp_avg_ = zeros({n}, {.device = device_});
    exp_avg_sq_ = zeros({n}, {.device = device_});
    if (replica_ >= 0) {
      replica_exp_avg_ = zeros({r}, {.device = device_});
      replica_exp_avg_sq_ = zeros({r}, {.device = device_});
    }
  } else if (sgd_options_.momentum != 0.0f) {
    momentum_ = zeros({n}, {.device = device_});
    if (replica_ >= 0) replica_momentum_ = zeros({r}, {.device = device_});
  }
}

void ZeroOptimizer::reduce_gradients() {
  if (grads_ != nullptr) grads_->finish();
}

double ZeroOptimizer::clip_grad_norm(double max_norm) {
  DDP_CHECK(std::isfinite(max_norm) && max_norm > 0,
            "clip_grad_norm: max_norm {} must be finite and > 0 (to not clip, do not call it)",
            max_norm);
  reduce_gradients();
  NoGradGuard no_grad;
  std::vector<Tensor> pieces;
  if (options_.stage == 3) {
    pieces = grad_shards();  // the padding is zero
  } else {
    const ShardRange s = shard();
    for_each_piece(s.begin, s.size, [&](size_t i, int64_t off, int64_t n, int64_t at) {
      Tensor g = grad_piece(i, off, n, at);
      if (g.defined()) pieces.push_back(g);
    });
  }
  double local = 0;
  for (const Tensor& g : pieces) local += static_cast<double>(sum_squares(g).cpu().item<float>());
  Tensor total = from_vector<float>({static_cast<float>(local)}, {1},
                                    {.dtype = DType::f32, .device = comm_->device()});
  {
    const CollectiveLabel labelled("zero grad norm");
    comm_->all_reduce(total, ReduceOp::sum)->wait();
  }
  const double norm = std::sqrt(static_cast<double>(total.cpu().item<float>()));
  const double factor = max_norm / (norm + 1e-6);  // as optim::clip_grad_norm_
  if (!std::isfinite(norm) || factor >= 1.0) return norm;
  // g *= factor, in place, as optim::clip_grad_norm_ (a multiply, not an axpy by factor - 1).
  if (!pieces.empty()) scale_by_(pieces, full({1}, factor, {.device = pieces.front().device()}));
  clip_factor_ = static_cast<float>(factor);  // the replica's gradient, at stage 1
  return norm;
}

void ZeroOptimizer::update_piece(size_t i, Tensor p, const Tensor& g, const Tensor& m_all,
                                 const Tensor& v_all, const Tensor& momentum, int64_t state_at,
                                 bool first_step) {
  const int64_t n = p.numel();
  if (adamw_) {
    Tensor m = m_all.flat_view(state_at, {n});
    Tensor v = v_all.flat_view(state_at, {n});
    adamw_update_(p, g, m, v,
                  {.lr = lr_,
                   .beta1 = adamw_options_.beta1,
                   .beta2 = adamw_options_.beta2,
                   .eps = adamw_options_.eps,
                   .weight_decay = weight_decay_[i],
                   .step = param_steps_[i]});
    return;
  }
  const kernels::SgdStep st{.lr = lr_,
                            .momentum = sgd_options_.momentum,
                            .weight_decay = sgd_options_.weight_decay,
                            .nesterov = sgd_options_.nesterov,
                            .first_step = first_step};
  Tensor buf = momentum.defined() ? momentum.flat_view(state_at, {n}) : p;
  sgd_update_(p, g, buf, st);
}

void ZeroOptimizer::update_chunk(int64_t shard_begin, int64_t len, bool first_step) {
  const ShardRange s = shard();
  for_each_piece(s.begin + shard_begin, len, [&](size_t i, int64_t off, int64_t n, int64_t at) {
    const int64_t so = shard_begin + at;
    const Tensor g = grad_piece(i, off, n, so);
    if (!g.defined()) return;  // as torch: a parameter without a gradient is skipped
    update_piece(i, params_[i].flat_view(off, {n}), g, exp_avg_, exp_avg_sq_, momentum_, so,
                 first_step);
  });
}

template <typename Read, typename Write>
void ZeroOptimizer::all_gather_rounds(Read&& read, Write&& write,
                                      const std::function<void(int64_t)>& before) {
  const int world = comm_->size();
  // Double buffers only where there are several rounds to overlap.
  const bool several = max_shard_ > chunk_;
  Tensor send[2], recv[2];
  for (int b = 0; b < (several ? 2 : 1); ++b) {
    send[b] = empty({chunk_}, {.device = device_});
    recv[b] = empty({chunk_ * world}, {.device = device_});
  }
  std::shared_ptr<Work> works[2];
  auto finish = [&](int64_t k) {
    const size_t b = static_cast<size_t>(k % 2);
    works[b]->wait();
    for (int q = 0; q < world; ++q) {
      const int64_t len =
          std::clamp<int64_t>(shards_[static_cast<size_t>(q)].size - k * chunk_, 0, chunk_);
      if (len > 0) write(q, k * chunk_, recv[b].flat_view(q * chunk_, {len}));
    }
  };
  const CollectiveLabel labelled("zero all_gather");
  int64_t k = 0;
  for (; k * chunk_ < max_shard_; ++k) {
    const size_t b = static_cast<size_t>(k % 2);
    const int64_t mine = std::clamp<int64_t>(shard().size - k * chunk_, 0, chunk_);
    if (before) before(k);  // the update of round k runs while round k-1 gathers
    if (mine < chunk_) fill_(send[b], 0.0);
    if (mine > 0) read(k * chunk_, send[b].flat_view(0, {mine}));
    works[b] = comm_->all_gather(send[b], recv[b]);
    if (k > 0) finish(k - 1);
  }
  if (k > 0) finish(k - 1);
}

bool ZeroOptimizer::begin_update() {
  const bool first_step = !exp_avg_.defined() && !momentum_.defined();
  if (first_step) allocate_state();
  for (size_t i = 0; i < params_.size(); ++i) {
    // A frozen parameter is never stepped: no step count, as torch keeps no state for it.
    if (!requires_grad(params_[i])) continue;
    if (options_.stage == 2 || grad(params_[i]).defined()) ++param_steps_[i];
  }
  return first_step && momentum_.defined();  // SGD: buf = gradient
}

// Stage 2 with replicas: the averaged gradient shards all-gathered in rounds, the
// replicated rank's kept (Note [zero replicas]).
void ZeroOptimizer::gather_replica_gradient() {
  const ShardRange b = shards_[static_cast<size_t>(replica_)];
  if (!replica_grad_.defined()) replica_grad_ = empty({b.size}, {.device = device_});
  const Tensor mine = grads_->shard();
  auto read = [&](int64_t offset, Tensor dst) {
    copy_(dst, mine.flat_view(offset, {dst.numel()}));
  };
  auto write = [&](int q, int64_t offset, const Tensor& src) {
    if (q != replica_) return;
    Tensor d = replica_grad_.flat_view(offset, {src.numel()});
    copy_(d, src);
  };
  all_gather_rounds(read, write, {});
}

// Note [zero replicas]: a rank past this all-reduce knows every rank entered it,
// each with the gradients of its shard and its replica.
void ZeroOptimizer::commit() {
  if (options_.stage == 2) gather_replica_gradient();
  pending_ = true;
  Tensor entered = full({1}, 1.0, {.device = comm_->device()});
  const CollectiveLabel labelled("zero commit");
  // synchronize(): on nccl a commit that failed must throw here (Note [nccl regroup]).
  comm_->all_reduce(entered, ReduceOp::sum)->synchronize();
}

void ZeroOptimizer::update_replicated() {
  const bool first_momentum = begin_update();
  const ShardRange b = shards_[static_cast<size_t>(replica_)];
  // The replicated shard's parameters as they are before the update: the last
  // all-gather completed (this rank ran a forward on them since).
  if (!replica_params_.defined()) replica_params_ = empty({b.size}, {.device = device_});
  for_each_piece(b.begin, b.size, [&](size_t i, int64_t off, int64_t n, int64_t at) {
    Tensor p = replica_params_.flat_view(at, {n});
    copy_(p, params_[i].flat_view(off, {n}));
    if (!requires_grad(params_[i])) return;  // frozen: the copy stays as it is
    Tensor g;
    if (options_.stage == 2) {
      g = replica_grad_.flat_view(at, {n});
    } else {
      const Tensor whole = grad(params_[i]);
      if (!whole.defined()) return;  // as the owner: no gradient, no update
      g = whole.flat_view(off, {n});
      if (clip_factor_ != 1.0f)
        g = scale(g, clip_factor_);  // as clip_grad_norm() scaled the owner's
    }
    update_piece(i, p, g, replica_exp_avg_, replica_exp_avg_sq_, replica_momentum_, at,
                 first_momentum);
  });
  update_chunk(0, shard().size, first_momentum);
  ++steps_;
  pending_ = false;
  clip_factor_ = 1.0f;
}

void ZeroOptimizer::step() {
  if (options_.stage == 3) {
    step_stage3();
    return;
  }
  reduce_gradients();
  NoGradGuard no_grad;
  const bool replicated = replica_ >= 0;
  const ShardRange s = shard();
  bool first_momentum = false;
  if (replicated) {
    commit();
    update_replicated();  // counted: the all-gather below may fail (Note [zero replicas])
    if (options_.after_update) options_.after_update();
  } else {
    first_momentum = begin_update();
  }
  auto update = [&](int64_t k) {
    const int64_t len = std::clamp<int64_t>(s.size - k * chunk_, 0, chunk_);
    update_chunk(k * chunk_, len, first_momentum);
  };
  if (comm_->size() == 1) {
    update_chunk(0, s.size, first_momentum);
  } else {
    // Params to the send buffer and back: flat ranges of the parameters.
    auto read = [&](int64_t shard_offset, Tensor dst) {
      for_each_piece(s.begin + shard_offset, dst.numel(),
                     [&](size_t i, int64_t off, int64_t n, int64_t at) {
                       Tensor d = dst.flat_view(at, {n});
                       copy_(d, params_[i].flat_view(off, {n}));
                     });
    };
    auto write = [&](int q, int64_t shard_offset, const Tensor& src) {
      if (q == comm_->rank()) return;  // updated in place
      const int64_t begin = shards_[static_cast<size_t>(q)].begin + shard_offset;
      for_each_piece(begin, src.numel(), [&](size_t i, int64_t off, int64_t n, int64_t at) {
        Tensor d = params_[i].flat_view(off, {n});
        copy_uncounted_(d, src.flat_view(at, {n}));  // counted below, alike on every rank
      });
    };
    // Replicated: updated already; otherwise round k's update overlaps k-1's gather.
    all_gather_rounds(read, write, replicated ? std::function<void(int64_t)>{} : update);
  }
  if (grads_ != nullptr) grads_->consumed();
  gathered_ = false;
  clip_factor_ = 1.0f;
  if (!replicated) ++steps_;
  // Note [version counter]: every rank counts the step's write of every trainable
  // parameter, whichever rank owned its pieces (an owner's update counted its own;
  // other ranks' pieces arrived uncounted), so a backward across the step is an
  // error on all ranks alike, never on some while the others wait.
  for (const Tensor& p : params_) {
    if (requires_grad(p)) p.storage()->bump_version();
  }
}

void ZeroOptimizer::leave_group() {
  if (grads_ != nullptr) grads_->leave_group();
  comm_.reset();
}

void ZeroOptimizer::keep_before_recovery() {
  if (before_recovery_) return;
  BeforeRecovery& b = before_recovery_.emplace();
  b.steps = steps_;
  b.pending = pending_;
  b.clip_factor = clip_factor_;
  b.param_steps = param_steps_;
  b.members = {&exp_avg_,         &exp_avg_sq_,         &momentum_,
               &replica_exp_avg_, &replica_exp_avg_sq_, &replica_momentum_,
               &replica_params_};
  for (Tensor* t : b.members) {
    b.handles.push_back(*t);
    b.copies.push_back(pending_ && t->defined() ? t->clone() : Tensor());
  }
  if (!pending_) return;  // nothing else changes
  const ShardRange s = shard();
  for_each_piece(s.begin, s.size, [&](size_t i, int64_t off, int64_t n, int64_t) {
    b.param_views.push_back(params_[i].flat_view(off, {n}));
    b.param_copies.push_back(b.param_views.back().clone());
  });
}

void ZeroOptimizer::undo_recovery() {
  if (!before_recovery_) return;
  BeforeRecovery& b = *before_recovery_;
  steps_ = b.steps;
  pending_ = b.pending;
  clip_factor_ = b.clip_factor;
  param_steps_ = b.param_steps;
  for (size_t k = 0; k < b.members.size(); ++k) {
    *b.members[k] = b.handles[k];
    if (b.copies[k].defined()) copy_(*b.members[k], b.copies[k]);
  }
  for (size_t k = 0; k < b.param_views.size(); ++k) copy_(b.param_views[k], b.param_copies[k]);
}

std::vector<Tensor> ZeroOptimizer::recover(Communicator& group, ZeroOptimizer* old,
                                           ZeroOptimizer& into, int64_t steps) {
  NoGradGuard no_grad;
  const Device device = group.device();
  const int world = group.size();
  const CollectiveLabel labelled("zero recovery");
  DDP_CHECK(into.rank_ == group.rank() && into.world_ == world && into.options_.stage <= 2 &&
                (old == nullptr || old->numel() == into.numel()),
            "ZeroOptimizer::recover: `into` must be a stage 1 or 2 ZeroOptimizer over the new "
            "group (rank {} of {}) and the same parameters; it is rank {} of {} at stage {}, over "
            "{} elements{}",
            group.rank(), world, into.rank_, into.world_, into.options_.stage, into.numel(),
            old == nullptr ? "" : fmt::format(" (the old one: {})", old->numel()));
  if (old != nullptr) {
    // An earlier attempt's changes undone: every attempt decides from the same state.
    old->undo_recovery();
    old->keep_before_recovery();
    DDP_CHECK(old->steps_ == steps || (old->pending_ && old->steps_ + 1 == steps),
              "ZeroOptimizer::recover: rank {} made {} optimizer steps{}, but the group goes on "
              "after {} (Note [zero replicas])",
              old->rank(), old->steps_, old->pending_ ? " and entered the next one's commit" : "",
              steps);
    // The step counts: every rank entered its commit with its gradients.
    if (old->steps_ < steps) old->update_replicated();
    old->pending_ = false;  // or it does not: no rank left got past the commit
    old->clip_factor_ = 1.0f;
  }
  // Who held what: old rank, old world size, whether it has state (a rank that
  // joins: -1, 0, 0).
  constexpr int64_t kInfo = 3;
  const bool has_state = old != nullptr && (old->exp_avg_.defined() || old->momentum_.defined());
  const std::vector<int64_t> mine =
      old == nullptr ? std::vector<int64_t>{-1, 0, 0}
                     : std::vector<int64_t>{old->rank(), old->world_size(), has_state ? 1 : 0};
  const Tensor sent = from_vector<int64_t>(mine, {kInfo}, {.dtype = DType::i64, .device = device});
  Tensor all = empty({kInfo * world}, {.dtype = DType::i64, .device = device});
  group.all_gather(sent, all)->synchronize();
  const auto info = all.to_vector<int64_t>();
  auto field = [&](int q, int f) { return info[static_cast<size_t>(q * kInfo + f)]; };
  int old_world = 0;
  bool any_state = false;
  for (int q = 0; q < world; ++q) {
    if (field(q, 0) < 0) continue;
    DDP_CHECK(old_world == 0 || old_world == field(q, 1),
              "ZeroOptimizer::recover: the ranks come from groups of {} and {} ranks; every rank "
              "left must pass the ZeroOptimizer of the same group",
              old_world, field(q, 1));
    old_world = static_cast<int>(field(q, 1));
    any_state = any_state || field(q, 2) != 0;
  }
  DDP_CHECK(old_world > 0, "ZeroOptimizer::recover: no rank of {} held a shard", world);
  DDP_CHECK(old == nullptr || old->replica_ >= 0 || old_world == 1,
            "ZeroOptimizer::recover: the optimizer of rank {} keeps no replica; create it with "
            "ZeroOptions::replicas 2 (Note [zero replicas])",
            old == nullptr ? -1 : old->rank());
  // Which rank of the old group writes each old shard: its owner, else the one
  // that kept its replica (the rank before it).
  std::vector<int> holder(static_cast<size_t>(old_world), -1);
  std::vector<bool> present(static_cast<size_t>(old_world), false);
  for (int q = 0; q < world; ++q) {
    if (field(q, 0) >= 0) present[static_cast<size_t>(field(q, 0))] = true;
  }
  std::vector<int> lost;
  for (int i = 0; i < old_world; ++i) {
    const int before = (i + old_world - 1) % old_world;
    holder[static_cast<size_t>(i)] = present[static_cast<size_t>(i)]        ? i
                                     : present[static_cast<size_t>(before)] ? before
                                                                            : -1;
    if (holder[static_cast<size_t>(i)] < 0) lost.push_back(i);
  }
  if (!lost.empty()) {
    std::vector<std::string> shards;
    for (int i : lost) {
      shards.push_back(fmt::format("shard {} (rank {} of the {} held it, rank {} its replica)", i,
                                   i, old_world, (i + old_world - 1) % old_world));
    }
    throw ValueError(fmt::format(
        "ZeRO with 2 replicas: the optimizer state of {} is lost: both ranks that kept it "
        "left; resume from the last checkpoint (ddprun --on-failure restart)",
        fmt::join(shards, ", ")));
  }
  // The flat space: the parameters, then each state buffer (AdamW's exp_avg and
  // exp_avg_sq, or SGD's momentum), N elements each.
  const int64_t n = into.numel();
  std::vector<Tensor*> own, kept;  // into's buffers, as the flat space orders them
  if (any_state && into.adamw_) {
    own = {&into.exp_avg_, &into.exp_avg_sq_};
    kept = {&into.replica_exp_avg_, &into.replica_exp_avg_sq_};
  } else if (any_state && into.sgd_options_.momentum != 0.0f) {
    own = {&into.momentum_};
    kept = {&into.replica_momentum_};
  }
  const int64_t buffers = static_cast<int64_t>(own.size()) + 1;
  into.clear_state();
  if (buffers > 1) into.allocate_state();
  // What `old`'s rank writes: the shards it holds (its own, or the replica of one
  // whose owner left), each as parameter values then state.
  struct Held {
    ShardRange range;
    bool replica = false;
    std::vector<Tensor> state;
  };
  std::vector<Held> held;
  if (old != nullptr) {
    for (int i = 0; i < old_world; ++i) {
      if (holder[static_cast<size_t>(i)] != old->rank()) continue;
      Held h{
          .range = old->shards_[static_cast<size_t>(i)], .replica = i != old->rank(), .state = {}};
      const std::vector<Tensor> from =
          h.replica ? std::vector<Tensor>{old->replica_exp_avg_, old->replica_exp_avg_sq_,
                                          old->replica_momentum_}
                    : std::vector<Tensor>{old->exp_avg_, old->exp_avg_sq_, old->momentum_};
      for (const Tensor& t : from) {
        if (t.defined()) h.state.push_back(t);
      }
      held.push_back(std::move(h));
    }
  }
  // Rounds over the flat space: each rank writes what it holds of the round,
  // the others zeros; the bit patterns are summed as integers (x + 0 is x for
  // every pattern, -0.0 too); each rank keeps the parameters, its shard and its
  // replica. [lo, hi) of buffer b's range [b * n + begin, + size) within the round.
  const int64_t total = buffers * n;
  const int64_t round = std::clamp<int64_t>(into.chunk_ * world, 1, std::max<int64_t>(1, total));
  Tensor values = empty({n}, {.device = device});
  Tensor chunk = empty({round}, {.device = device});
  Tensor bits = from_blob(chunk.data_ptr(), chunk.shape(), {.dtype = DType::i32, .device = device},
                          [keep = chunk](void*) {});
  for (int64_t at = 0; at < total; at += round) {
    const int64_t len = std::min(round, total - at);
    Tensor part = chunk.flat_view(0, {len});
    fill_(part, 0.0);
    // Calls fn(b, lo, hi) for each buffer b whose [begin, begin + size) meets the round.
    auto overlaps = [&](int64_t begin, int64_t size, auto&& fn) {
      for (int64_t b = 0; b < buffers; ++b) {
        const int64_t lo = std::max(at, b * n + begin);
        const int64_t hi = std::min(at + len, b * n + begin + size);
        if (lo < hi) fn(b, lo, hi);
      }
    };
    for (const Held& h : held) {
      overlaps(h.range.begin, h.range.size, [&](int64_t b, int64_t lo, int64_t hi) {
        const int64_t in_shard = lo - b * n - h.range.begin;
        if (b > 0) {
          if (static_cast<size_t>(b - 1) >= h.state.size()) return;  // no step yet: zeros
          Tensor d = part.flat_view(lo - at, {hi - lo});
          copy_(d, h.state[static_cast<size_t>(b - 1)].flat_view(in_shard, {hi - lo}));
          return;
        }
        old->for_each_piece(lo, hi - lo, [&](size_t i, int64_t off, int64_t m, int64_t from) {
          Tensor d = part.flat_view(lo - at + from, {m});
          if (h.replica && old->replica_params_.defined()) {
            copy_(d, old->replica_params_.flat_view(in_shard + from, {m}));
          } else {  // its own shard, or no step since the group formed: the live values
            copy_(d, old->params_[i].flat_view(off, {m}));
          }
        });
      });
    }
    Tensor summed = bits.flat_view(0, {len});
    group.all_reduce(summed, ReduceOp::sum)->synchronize();
    if (at < n) {  // the parameters' part of the round
      Tensor d = values.flat_view(at, {std::min(at + len, n) - at});
      copy_(d, part.flat_view(0, {d.numel()}));
    }
    auto keep = [&](ShardRange range, const std::vector<Tensor*>& into_buffers) {
      overlaps(range.begin, range.size, [&](int64_t b, int64_t lo, int64_t hi) {
        if (b == 0) return;
        Tensor d = into_buffers[static_cast<size_t>(b - 1)]->flat_view(lo - b * n - range.begin,
                                                                       {hi - lo});
        copy_(d, part.flat_view(lo - at, {hi - lo}));
      });
    };
    if (buffers > 1) {
      keep(into.shard(), own);
      if (into.replica_ >= 0) keep(into.shards_[static_cast<size_t>(into.replica_)], kept);
    }
  }
  // The step counts, alike on every rank that held a shard.
  Tensor counts =
      zeros({static_cast<int64_t>(into.params_.size())}, {.dtype = DType::i64, .device = device});
  if (old != nullptr) {
    int first = 0;
    while (field(first, 0) < 0) ++first;
    if (group.rank() == first) {
      counts =
          from_vector<int64_t>(old->param_steps_, {static_cast<int64_t>(old->param_steps_.size())},
                               {.dtype = DType::i64, .device = device});
    }
  }
  group.all_reduce(counts, ReduceOp::sum)->synchronize();
  if (into.adamw_ && buffers > 1) into.param_steps_ = counts.to_vector<int64_t>();
  into.steps_ = steps;
  std::vector<Tensor> out;
  for (size_t i = 0; i < into.params_.size(); ++i) {
    out.push_back(values.flat_view(into.starts_[i], into.params_[i].shape()));
  }
  return out;
}

// The names and order of optim::AdamW::state() and optim::SGD::state().
void ZeroOptimizer::gather_state() {
  if (options_.stage == 3) {
    gather_state_stage3();
    return;
  }
  NoGradGuard no_grad;
  full_state_.clear();
  gathered_ = true;
  std::vector<std::pair<std::string, Tensor>> shards;
  if (exp_avg_.defined()) shards = {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  if (momentum_.defined()) shards = {{"momentum_buffer", momentum_}};
  std::vector<Tensor> wholes;
  for (auto& [buffer, local] : shards) {
    Tensor whole = empty({numel()}, {.device = device_});
    if (comm_->size() == 1) {
      copy_(whole, local);
    } else {
      auto read = [&](int64_t offset, Tensor dst) {
        copy_(dst, local.flat_view(offset, {dst.numel()}));
      };
      auto write = [&](int q, int64_t offset, const Tensor& src) {
        Tensor d = whole.flat_view(shards_[static_cast<size_t>(q)].begin + offset, {src.numel()});
        copy_(d, src);
      };
      all_gather_rounds(read, write, {});
    }
    wholes.push_back(whole);
  }
  if (wholes.empty()) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (size_t b = 0; b < shards.size(); ++b) {
      full_state_.emplace_back(fmt::format("{}.{}", i, shards[b].first),
                               wholes[b].flat_view(starts_[i], params_[i].shape()));
    }
    if (adamw_) {
      full_state_.emplace_back(
          fmt::format("{}.step", i),
          full({1}, static_cast<double>(param_steps_[i]), {.dtype = DType::i64}));
    }
  }
}

nn::NamedTensors ZeroOptimizer::state() const {
  DDP_CHECK(gathered_,
            "ZeroOptimizer::state(): the state is sharded over {} ranks; call gather_state() on "
            "every rank first (after the last step), then state() where it is written",
            world_);
  return full_state_;
}

void ZeroOptimizer::load_state(const nn::NamedTensors& state, int64_t steps) {
  if (options_.stage == 3 && fsdp_ == nullptr) {
    pending_state_.emplace(state, steps);  // the layout comes with attach()
    return;
  }
  NoGradGuard no_grad;
  std::map<std::string, Tensor> entries(state.begin(), state.end());
  const std::vector<std::string> buffers = adamw_
                                               ? std::vector<std::string>{"exp_avg", "exp_avg_sq"}
                                               : std::vector<std::string>{"momentum_buffer"};
  clear_state();
  if (!entries.empty()) allocate_state();
  std::vector<Tensor*> locals =
      adamw_ ? std::vector<Tensor*>{&exp_avg_, &exp_avg_sq_} : std::vector<Tensor*>{&momentum_};
  for (size_t b = 0; b < buffers.size() && !entries.empty(); ++b) {
    std::vector<Tensor> whole(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      const std::string key = fmt::format("{}.{}", i, buffers[b]);
      auto it = entries.find(key);
      DDP_CHECK(it != entries.end(),
                "optimizer state has no '{}' while it has other entries; a sharded optimizer "
                "restores the state of every parameter or of none (was it saved for a "
                "different model or optimizer?)",
                key);
      DDP_CHECK(it->second.shape() == params_[i].shape(),
                "optimizer state {} has shape {}, but parameter {} has shape {}", key,
                shape_str(it->second.shape()), i, shape_str(params_[i].shape()));
      whole[i] = it->second.to(device_);
      entries.erase(it);
    }
    for_each_owned([&](size_t i, int64_t off, int64_t n, int64_t at) {
      Tensor d = locals[b]->flat_view(at, {n});
      copy_(d, whole[i].flat_view(off, {n}));
    });
    if (replica_ >= 0) {  // Note [zero replicas]
      Tensor kept = adamw_ ? (b == 0 ? replica_exp_avg_ : replica_exp_avg_sq_) : replica_momentum_;
      const ShardRange r = shards_[static_cast<size_t>(replica_)];
      for_each_piece(r.begin, r.size, [&](size_t i, int64_t off, int64_t n, int64_t at) {
        Tensor d = kept.flat_view(at, {n});
        copy_(d, whole[i].flat_view(off, {n}));
      });
    }
  }
  // With the moments, every parameter's step (as optim::AdamW::load_state): moments
  // without their step would resume with the bias correction of step 1.
  for (size_t i = 0; i < params_.size() && adamw_ && exp_avg_.defined(); ++i) {
    const std::string key = fmt::format("{}.step", i);
    auto it = entries.find(key);
    DDP_CHECK(it != entries.end(),
              "optimizer state has no '{}' while it has parameter {}'s exp_avg and exp_avg_sq; "
              "AdamW's state of a parameter is its moments and step together (was it saved "
              "whole?)",
              key, i);
    param_steps_[i] = optim::read_step_count(key, it->second);
    entries.erase(it);
  }
  if (!entries.empty()) {
    std::vector<std::string> names;
    for (const auto& [name, t] : entries) names.push_back(name);
    throw ValueError(
        fmt::format("optimizer state has unexpected entries: {} (was it saved for a "
                    "different model or optimizer?)",
                    fmt::join(names, ", ")));
  }
  steps_ = steps;
}

nn::NamedTensors ZeroOptimizer::shard_state() const {
  nn::NamedTensors out;
  if (momentum_.defined()) out.emplace_back("momentum_buffer", momentum_);
  if (!exp_avg_.defined()) return out;
  out.emplace_back("exp_avg", exp_avg_);
  out.emplace_back("exp_avg_sq", exp_avg_sq_);
  out.emplace_back("step",
                   from_vector<int64_t>(param_steps_, {static_cast<int64_t>(param_steps_.size())}));
  return out;
}

int64_t ZeroOptimizer::state_bytes() const {
  return bytes_of(exp_avg_) + bytes_of(exp_avg_sq_) + bytes_of(momentum_) +
         bytes_of(replica_exp_avg_) + bytes_of(replica_exp_avg_sq_) + bytes_of(replica_momentum_);
}

int64_t ZeroOptimizer::grad_shard_bytes() const {
  if (fsdp_ != nullptr) return fsdp_->grad_shard_bytes();
  return grads_ != nullptr ? bytes_of(grads_->shard()) : 0;
}

Tensor ZeroOptimizer::grad_shard() const {
  return grads_ != nullptr ? grads_->shard() : Tensor();
}

int64_t ZeroOptimizer::grad_rounds() const {
  return grads_ != nullptr ? grads_->rounds() : 0;
}

int64_t ZeroOptimizer::grad_rounds_overlapped() const {
  return grads_ != nullptr ? grads_->launched_early() : 0;
}

template <typename F>
void ZeroOptimizer::for_each_owned(F&& fn) const {
  if (options_.stage != 3) {
    const ShardRange s = shard();
    for_each_piece(s.begin, s.size, std::forward<F>(fn));
    return;
  }
  const auto& units = fsdp_->units();
  for (size_t u = 0; u < units.size(); ++u) {
    fsdp_->for_each_owned_piece(u, [&](size_t k, int64_t off, int64_t n, int64_t at) {
      const size_t i = inner_index_[units[u].params[k]];
      if (i < params_.size()) fn(i, off, n, state_offsets_[u] + at);
    });
  }
}

// Stage 3 (Note [zero stages]): shards the module, maps its parameters to the
// inner optimizer's, and lays out this rank's state unit by unit.
void ZeroOptimizer::attach_stage3(DistributedDataParallel& ddp) {
  DDP_CHECK(fsdp_ == nullptr, "ZeroOptimizer::attach: already attached (once per optimizer)");
  fsdp_ = FullyShardedParameters::create(ddp.module(), comm_, options_.fully_shard);
  const auto& fparams = fsdp_->parameters();
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index.emplace(&params_[i].impl(), i);
  inner_index_.assign(fparams.size(), params_.size());
  size_t found = 0;
  for (size_t e = 0; e < fparams.size(); ++e) {
    auto it = index.find(&fparams[e].impl());
    if (it != index.end()) {
      inner_index_[e] = it->second;
      ++found;
    }
  }
  DDP_CHECK(found == params_.size(),
            "ZeroOptimizer (stage 3): {} of the optimizer's {} parameters are not parameters of "
            "the module the DDP wraps; create the optimizer over that module's parameters()",
            params_.size() - found, params_.size());
  state_offsets_.clear();
  state_size_ = 0;
  for (const auto& u : fsdp_->units()) {
    state_offsets_.push_back(state_size_);
    state_size_ += u.block;
  }
  const std::weak_ptr<FullyShardedParameters> weak = fsdp_;
  ddp.set_zero_callbacks({.on_forward =
                              [weak](bool sync) {
                                if (auto f = weak.lock()) f->arm(sync);
                              },
                          .on_finish =
                              [weak] {
                                if (auto f = weak.lock()) f->finish();
                              }});
  if (pending_state_) {
    auto [state, steps] = std::move(*pending_state_);
    pending_state_.reset();
    load_state(state, steps);
  }
}

void ZeroOptimizer::step_stage3() {
  DDP_CHECK(fsdp_ != nullptr,
            "ZeroOptimizer (stage 3): step() before attach(); create it from the DDP "
            "(ZeroOptimizer(inner, ddp)) or call attach(ddp) before the first forward");
  NoGradGuard no_grad;
  const bool first_step = !exp_avg_.defined() && !momentum_.defined();
  if (first_step) allocate_state();
  const bool first_momentum = first_step && momentum_.defined();
  const auto& units = fsdp_->units();
  for (size_t e = 0; e < inner_index_.size(); ++e) {
    const size_t i = inner_index_[e];
    if (i < params_.size() && requires_grad(params_[i]) &&
        units[fsdp_->owner(e).first].grad_shard.defined()) {
      ++param_steps_[i];
    }
  }
  for (size_t u = 0; u < units.size(); ++u) {
    const auto& unit = units[u];
    if (!unit.grad_shard.defined()) continue;  // as torch: no gradient, no update
    fsdp_->note_stepped(u);                    // Note [version counter]
    fsdp_->for_each_owned_piece(u, [&](size_t k, int64_t /*off*/, int64_t n, int64_t at) {
      const size_t i = inner_index_[unit.params[k]];
      if (i >= params_.size()) return;         // not the optimizer's
      if (!requires_grad(params_[i])) return;  // frozen: never stepped (its gradient is zero)
      update_piece(i, unit.shard.flat_view(at, {n}), unit.grad_shard.flat_view(at, {n}), exp_avg_,
                   exp_avg_sq_, momentum_, state_offsets_[u] + at, first_momentum);
    });
  }
  gathered_ = false;
  ++steps_;
}

// The module's parameters (every unit, held until the next training forward)
// and the optimizer state, each unit's all-gathered.
void ZeroOptimizer::gather_state_stage3() {
  DDP_CHECK(fsdp_ != nullptr, "ZeroOptimizer (stage 3): gather_state() before attach()");
  NoGradGuard no_grad;
  fsdp_->gather_all();
  full_state_.clear();
  gathered_ = true;
  std::vector<std::pair<std::string, Tensor>> shards;
  if (exp_avg_.defined()) shards = {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  if (momentum_.defined()) shards = {{"momentum_buffer", momentum_}};
  if (shards.empty()) return;
  const auto& units = fsdp_->units();
  const int world = comm_->size();
  // per buffer, per inner parameter: its full state
  std::vector<std::vector<Tensor>> whole(shards.size(), std::vector<Tensor>(params_.size()));
  for (size_t b = 0; b < shards.size(); ++b) {
    for (size_t u = 0; u < units.size(); ++u) {
      const auto& unit = units[u];
      if (unit.params.empty()) continue;
      Tensor all = empty({unit.block * world}, {.device = device_});
      const CollectiveLabel labelled("zero3 state all_gather");
      comm_->all_gather(shards[b].second.flat_view(state_offsets_[u], {unit.block}), all)->wait();
      for (size_t k = 0; k < unit.params.size(); ++k) {
        const size_t i = inner_index_[unit.params[k]];
        if (i < params_.size()) whole[b][i] = all.flat_view(unit.starts[k], params_[i].shape());
      }
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    for (size_t b = 0; b < shards.size(); ++b) {
      full_state_.emplace_back(fmt::format("{}.{}", i, shards[b].first), whole[b][i]);
    }
    if (adamw_) {
      full_state_.emplace_back(
          fmt::format("{}.step", i),
          full({1}, static_cast<double>(param_steps_[i]), {.dtype = DType::i64}));
    }
  }
}

void ZeroOptimizer::gather_parameters() {
  if (fsdp_ != nullptr) fsdp_->gather_all();
}

void ZeroOptimizer::zero_grad(bool set_to_none) {
  if (fsdp_ != nullptr) {
    fsdp_->zero_grad();
    return;
  }
  Optimizer::zero_grad(set_to_none);
}

std::vector<Tensor> ZeroOptimizer::grad_shards() const {
  std::vector<Tensor> out;
  if (fsdp_ != nullptr) {
    for (const auto& u : fsdp_->units()) {
      if (u.grad_shard.defined()) out.push_back(u.grad_shard);
    }
  } else if (grads_ != nullptr) {
    out.push_back(grads_->shard());
  }
  return out;
}

std::vector<Tensor> ZeroOptimizer::weights() const {
  if (fsdp_ == nullptr) return params_;
  std::vector<Tensor> out;
  for (const auto& u : fsdp_->units()) {
    if (u.shard.defined()) out.push_back(u.shard);
  }
  return out;
}

}  // namespace ddp
