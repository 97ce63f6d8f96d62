// ZeroOptimizer: ZeRO-1, 2 and 3 next to DistributedDataParallel: each rank
// keeps the optimizer state (and, at stage 2, the averaged gradient; at stage 3
// the parameters too) only for its shard, updates that shard and (stages 1, 2)
// all-gathers the parameters (PyTorch's ZeroRedundancyOptimizer and FSDP,
// DeepSpeed ZeRO, llm.c's ZeRO-1).
//
// Note [zero stages]: the user picks the mode with DdpOptions::zero_stage and,
// for 1 to 3, wraps the optimizer in a ZeroOptimizer over the same communicator:
//   0  DDP: gradients all-reduced in buckets during backward; every rank keeps the
//      full optimizer state and runs the full update (no ZeroOptimizer).
//   1  gradients all-reduced exactly as DDP (bucketed, overlapped with
//      backward); step() runs AdamW/SGD only on this rank's shard, whose state
//      alone is allocated (1/W of DDP's), then all-gathers the parameters.
//   2  DDP has no buckets; the ZeroOptimizer attached to it (attach(), or the
//      constructor from the DDP) reduce-scatters (avg) the gradients of every
//      synchronized backward during that backward, in the rounds of Note [zero
//      layout], each launched as soon as its gradients are in and in one order
//      on every rank (Note [zero stage 2 rounds] in zero_grads.h); when
//      ddp.backward(loss) (or finish_backward()) returns, each rank holds only
//      its averaged gradient shard and every full .grad is released. Then as
//      stage 1. A backward under no_sync() stays local. Without attach() every
//      backward is local and step() (or clip_grad_norm(), reduce_gradients())
//      reduce-scatters the accumulated gradients before updating.
//   3  the parameters too (FSDP, collectives/ddp/fully_shard.h): attach() to a DDP
//      of zero_stage 3 shards the module in units (Note [zero-3 units]); each
//      rank keeps 1/W of every unit's parameters, gradients and optimizer state,
//      a unit is gathered just before its forward and its backward and its
//      gradients reduce-scattered as soon as its backward is done (Note [zero-3
//      schedule]). step() updates the shards only: the next forward gathers.
//      The layout is per unit (Note [zero-3 layout]), not Note [zero layout].
// Gradient accumulation works as with DDP: micro-batches under ddp.no_sync(),
// the last one synchronized, step() after it. At stage 2 one synchronized
// backward per step: a second one before step() replaces the shard (DDP would
// add both averages). Clipping:
// clip_grad_norm() takes the global norm from the shards (sums of squares
// all-reduced) and scales this rank's shard.
//
// Note [zero layout]: the parameters (in the inner optimizer's order, the order
// its state_dict numbers them) are concatenated into one flat space of N
// elements. Rank r owns [begin_r, begin_r + n_r) with n_r = N / W, plus one for
// the first N % W ranks: shards differ by at most one element (llm.c pads N up to
// a multiple of W and leaves the last rank short; balancing keeps every rank's
// share of the work within one element). Collectives need equal blocks, so every
// collective round carries C elements per rank (C = bucket_cap_mb / W, the
// rounds cover ceil(N / W) elements) and a rank whose shard is one short pads its
// block with one zero that nobody reads. A shard may split a parameter: the
// update runs on the pieces (flat views of parameter, gradient and state), which
// is exact for element-wise optimizers (AdamW, SGD with momentum); with
// ZeroOptions::by_parameters the shards are runs of whole parameters instead,
// as PyTorch's ZeroRedundancyOptimizer partitions them. Round k's
// all-gather runs while round k+1's shard piece is updated.
//
// Note [zero replicas]: with ZeroOptions::replicas 2 (stages 1 and 2, more than
// one rank) rank r also keeps the state of rank (r + 1) % W's shard -- its
// "replica" -- and the values of that shard's parameters, so that the ranks
// left after one departure (or several, no two of them neighbours) still hold
// every shard (`train --zero-replicas 2` under `ddprun --on-failure continue`,
// docs/elastic.md). The replica is not sent: rank r updates it itself, with the
// same element-wise kernel on the same inputs as its owner, so it holds the
// owner's bits. Stage 1 reads the buddy's averaged gradient from DDP's .grad
// (scaled by the factor clip_grad_norm() applied to the shards); stage 2
// all-gathers the averaged gradient shards after the reduce-scatter and keeps
// the buddy's ((W - 1) / W of N more elements moved per step). Memory: state
// 2 / W of DDP's instead of 1 / W, plus one shard of parameter values.
// A step is then all or nothing across failures: step() first enters a commit
// (a one-element all-reduce); only a rank past it updates, and every rank
// updates its shard and the replica before the all-gather of the parameters,
// counting the step (steps()) before that all-gather, which may still fail.
// Once one rank is past the commit every rank had entered it, so every rank
// holds its step's gradients. The trainer counts a step whose all-gather failed
// (the rank got past the commit), so the step counters of the most advanced rank
// left say whether the step counts; recover() gets that count and finishes the
// update of a rank that entered the commit but failed in it when the step
// counts, and drops it otherwise. It then moves the state and parameters from
// the owners left and the replicas of the shards whose owner left into a
// ZeroOptimizer over the new group: all-reduces of the bit patterns as integers
// (one rank writes each element, the others zeros), in rounds of bucket_cap_mb
// over the flat parameters and state buffers, each rank keeping of a round its
// new shard, its new replica and every parameter value. A regroup that fails
// part-way is tried again (another rank left): recover() first undoes what an
// earlier attempt applied to `old`, so each attempt decides from the same
// state; and a rank that already took the new group's optimizer passes the
// previous one while that group has not stepped (trainer/elastic.cpp, Note
// [zero generations]).
// Recovery holds, beyond the old and the new optimizer's shards, the N
// parameter values received and one round (bucket_cap_mb): never the full state
// (and, when a step was caught in its commit, a copy of the old shards and of
// this rank's parameter shard, for an attempt after this one).
//
// Checkpoints: state() returns the full, gathered state under the inner
// optimizer's names ("<i>.exp_avg", ...), so a checkpoint is the same file DDP
// writes; load_state() takes such a full state and keeps its own shard, whatever
// the world size that wrote it (resharding).
#pragma once

#include "collectives/communicator.h"
#include "collectives/ddp/fully_shard.h"
#include "runtime/optim/optimizer.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddp {

class DistributedDataParallel;
class ZeroGradReducer;

struct ZeroOptions {
  int stage = 1;  // 1, 2 or 3 (Note [zero stages])
  // MiB moved by one collective round, every rank's block together (as DDP's buckets).
  double bucket_cap_mb = 25;
  // Shards of whole parameters (no parameter split between ranks; the shards
  // then differ by up to a parameter's size, the padding too) instead of
  // element-balanced ones (Note [zero layout]).
  bool by_parameters = false;
  // Stage 3: the units and their schedule (collectives/ddp/fully_shard.h).
  FullyShardOptions fully_shard{};
  // 1, or 2: each rank also keeps the next rank's shard (Note [zero replicas]);
  // stages 1 and 2.
  int replicas = 1;
  // A testing aid: called by step() with 2 replicas after the update is counted,
  // before the all-gather (`train`'s DDP_TEST_KILL_IN_UPDATE kills the rank there).
  std::function<void()> after_update{};
};

// Rank `rank`'s shard of a flat space of `numel` elements over `world` ranks
// (Note [zero layout]).
struct ShardRange {
  int64_t begin = 0;
  int64_t size = 0;
};
ShardRange zero_shard(int64_t numel, int world, int rank);
// ZeroOptions::by_parameters: contiguous runs of whole parameters of these
// sizes, one per rank (a rank may get none), each boundary the parameter
// boundary nearest to r * N / W.
std::vector<ShardRange> zero_shards_by_parameters(const std::vector<int64_t>& numels, int world);

class ZeroOptimizer : public optim::Optimizer {
 public:
  // `inner`: an optim::AdamW or optim::SGD over the parameters; its
  // hyperparameters (and per-parameter weight decay) are used, it never steps
  // and never allocates state. Every rank passes the same parameters (those of
  // the module DDP wraps). ValueError for another optimizer or a stage not 1, 2, 3.
  // The stage must be the DDP's DdpOptions::zero_stage: stage 1 steps on
  // gradients DDP averaged (under a DDP of stage 2 they would be local ones);
  // the constructor below takes it from the DDP.
  ZeroOptimizer(std::unique_ptr<optim::Optimizer> inner, std::shared_ptr<Communicator> comm,
                ZeroOptions options = {});
  // The stage is ddp.options().zero_stage, the round size its bucket_cap_mb;
  // stage 2 attaches to the DDP (attach()).
  ZeroOptimizer(std::unique_ptr<optim::Optimizer> inner, DistributedDataParallel& ddp);
  // The same with options (the stage still the DDP's): stage 3's units.
  ZeroOptimizer(std::unique_ptr<optim::Optimizer> inner, DistributedDataParallel& ddp,
                ZeroOptions options);
  ~ZeroOptimizer() override;

  // Stage 2: from now on, every synchronized backward of `ddp` (a DDP with
  // zero_stage 2 over the same parameters and communicator) reduce-scatters the
  // gradients in rounds during the backward, so that after it (after
  // ddp.finish_backward()) this rank holds its averaged gradient shard and no
  // full .grad (Note [zero stage 2 rounds] in zero_grads.h). Without it, step()
  // reduces them. Once, on every rank; a ValueError at stage 1.
  // Stage 3 (collective, required before the first forward): shards ddp.module()'s
  // parameters in units from the values they hold now (after DDP's constructor
  // and any checkpoint load); from then on they are readable only inside a unit's
  // forward and backward, or after gather_state(). Every optimizer parameter must
  // be one of the module's (ValueError); a module parameter the optimizer lacks
  // is sharded and gathered but never updated.
  void attach(DistributedDataParallel& ddp);

  // Collective. Stage 2 reduce-scatters the gradients first (unless
  // reduce_gradients() or clip_grad_norm() did); then updates this rank's shard
  // and all-gathers the parameters.
  void step() override;
  // Collective. Stage 2: the averaged gradient shard, the full .grad released
  // (nothing if an attached DDP's finish_backward() did it); stage 1: nothing
  // (DDP averaged them). Once per step.
  void reduce_gradients();
  // Collective: the L2 norm of the whole averaged gradient (sums of squares of
  // the shards all-reduced), returned before clipping; this rank's shard is
  // scaled as optim::clip_grad_norm_ scales (a non-finite norm clips nothing).
  double clip_grad_norm(double max_norm);
  // Collective: gathers the full state that state() then returns (checkpoints).
  // Stage 3: also every unit's parameters, readable (module.state_dict()) until
  // the next training forward.
  void gather_state();
  // Collective at stage 3: every unit's parameters gathered and readable until the
  // next training forward (evaluation, checkpoints); nothing at stages 1 and 2.
  void gather_parameters();
  // Stage 3: the gradient shards dropped (set_to_none or not: the next
  // synchronized backward writes them afresh); otherwise as optim::Optimizer.
  void zero_grad(bool set_to_none = false) override;
  // The full state of the last gather_state() (ValueError without one).
  nn::NamedTensors state() const override;
  // A full state (as state() or an optim::AdamW/SGD saved it), from any world
  // size: keeps this rank's shard. ValueError naming a mis-shaped or unknown entry.
  void load_state(const nn::NamedTensors& state, int64_t steps) override;
  std::string name() const override { return inner_->name(); }
  // This rank's shard of the state, flat (no collective; `train --save-sharded`):
  // "exp_avg" and "exp_avg_sq" (AdamW) or "momentum_buffer" (SGD), each of
  // shard().size elements (stage 3: every unit's block, at unit_state_offsets()),
  // and AdamW's "step", one count per parameter (i64). Empty before the first step.
  nn::NamedTensors shard_state() const;
  // Stage 3 after attach(): where unit u's slice of each shard_state() buffer
  // starts (fully_sharded()->units()[u].block elements, Note [zero-3 layout]);
  // empty before attach() and at stages 1, 2.
  const std::vector<int64_t>& unit_state_offsets() const { return state_offsets_; }

  // Collective over `group`, a communicator formed after ranks left (and joined)
  // the group of `old` (Note [zero replicas]): every rank passes the
  // ZeroOptimizer it had (replicas 2), a rank that joins passes null, and `into`
  // is this rank's new ZeroOptimizer over `group` (stage 1 or 2, replicas 2, the
  // same parameters; its state is replaced). Finishes or drops an update caught
  // in its commit, then loads `into` with its shard and replica of the state
  // from the owners and replicas left, and the step counts; returns the
  // parameters' values, in the optimizer's order (for the caller to copy into
  // the model). ValueError naming the shards whose owner and replica both left.
  // `steps`: the optimizer steps the group goes on from (its step counters say).
  static std::vector<Tensor> recover(Communicator& group, ZeroOptimizer* old, ZeroOptimizer& into,
                                     int64_t steps);
  // Under elastic training, as its group breaks up: drops the communicator (its
  // connections close, so ranks blocked on this one fail too) and keeps the shards
  // for recover(); nothing collective may follow.
  void leave_group();
  // The inner optimizer (its kind and hyperparameters; it never steps).
  const optim::Optimizer& inner() const { return *inner_; }

  int stage() const { return options_.stage; }
  // Replicas 2: the rank whose shard this rank keeps too; -1 without one.
  int replica_of() const { return replica_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  ShardRange shard() const { return shards_[static_cast<size_t>(rank_)]; }
  int64_t numel() const { return starts_.back(); }
  // Bytes of optimizer state held by this rank, replicas included (0 before the
  // first step).
  int64_t state_bytes() const;
  // Stage 2: bytes of this rank's averaged gradient shard; stage 1: 0 (the full
  // .grad tensors belong to DDP).
  int64_t grad_shard_bytes() const;
  // Stage 2 after reduce_gradients() (or an attached DDP's synchronized
  // backward): this rank's averaged gradient shard, shard().size elements.
  Tensor grad_shard() const;
  // Stage 2: the collective rounds of a gradient reduction, and how many of the
  // last synchronized backward's (attached) were launched while gradients were
  // still to come, overlapping the rest of the backward (Note [zero stage 2 rounds]).
  int64_t grad_rounds() const;
  int64_t grad_rounds_overlapped() const;
  // Stage 3 after attach(): the sharded parameters (null before, and at stages 1, 2).
  const FullyShardedParameters* fully_sharded() const { return fsdp_.get(); }
  FullyShardedParameters* fully_sharded() { return fsdp_.get(); }
  // The averaged gradient shards of the step: stage 2 one, stage 3 one per unit
  // that has one; empty at stage 1.
  std::vector<Tensor> grad_shards() const;
  // This rank's parameter values: stage 3 the shards, else the full parameters.
  std::vector<Tensor> weights() const;

 private:
  template <typename F>
  void for_each_piece(int64_t begin, int64_t len, F&& fn) const;
  Tensor grad_piece(size_t i, int64_t param_offset, int64_t len, int64_t shard_offset) const;
  // No state (load_state(), recover()): every shard and replica buffer dropped,
  // no pending update, step counts 0.
  void clear_state();
  void allocate_state();
  void update_chunk(int64_t shard_begin, int64_t len, bool first_step);
  // `m`, `v` (AdamW) or `momentum` (SGD): the state buffer the piece is in.
  void update_piece(size_t i, Tensor p, const Tensor& g, const Tensor& m, const Tensor& v,
                    const Tensor& momentum, int64_t state_at, bool first_step);
  // The first update allocates the state; the parameters' step counts. Returns
  // whether SGD's momentum buffers start from the gradient.
  bool begin_update();
  // Note [zero replicas]: the update of this rank's shard and of the replica, counted.
  void update_replicated();
  // recover(): what a recovery may change, kept at the first one and put back at
  // the next (a regroup tried again).
  void keep_before_recovery();
  void undo_recovery();
  void gather_replica_gradient();
  void commit();
  // Calls fn(parameter, offset in it, length, offset in this rank's state) for every
  // piece this rank owns, in either layout.
  template <typename F>
  void for_each_owned(F&& fn) const;
  void step_stage3();
  void gather_state_stage3();
  void attach_stage3(DistributedDataParallel& ddp);
  void gather_params();
  // Round k of an all-gather over the shards: `read(shard_offset, dst)` fills this
  // rank's block, `write(rank, shard_offset, src)` takes every rank's.
  template <typename Read, typename Write>
  void all_gather_rounds(Read&& read, Write&& write, const std::function<void(int64_t)>& before);

  std::unique_ptr<optim::Optimizer> inner_;
  std::shared_ptr<Communicator> comm_;
  int rank_ = 0, world_ = 1;  // comm_'s, kept after leave_group()
  ZeroOptions options_;
  bool adamw_ = false;
  optim::AdamWOptions adamw_options_;
  optim::SgdOptions sgd_options_;
  std::vector<float> weight_decay_;  // per parameter
  std::vector<int64_t> starts_;      // flat offset of each parameter, then N
  std::vector<ShardRange> shards_;   // per rank
  int64_t max_shard_ = 0;            // the largest shard: what a round's blocks cover
  int64_t chunk_ = 1;                // elements per rank and round
  Device device_ = Device::cpu();
  // This rank's shard of the state (undefined until the first step or a load).
  Tensor exp_avg_, exp_avg_sq_, momentum_;
  std::vector<int64_t> param_steps_;
  // Stage 2's gradient reduction; DDP's and the parameters' hooks hold it weakly.
  std::shared_ptr<ZeroGradReducer> grads_;
  nn::NamedTensors full_state_;
  bool gathered_ = false;
  // Stage 3: the sharded parameters, the inner index of each of their
  // parameters, each unit's offset in the state, and a state loaded before attach().
  std::shared_ptr<FullyShardedParameters> fsdp_;
  std::vector<size_t> inner_index_;
  std::vector<int64_t> state_offsets_;
  int64_t state_size_ = 0;
  std::optional<std::pair<nn::NamedTensors, int64_t>> pending_state_;
  // Note [zero replicas]: the rank replicated, its shard's state, parameter values
  // and (stage 2) averaged gradient; the factor clip_grad_norm() scaled the
  // shards by this step; whether this rank entered a commit it has not updated after.
  int replica_ = -1;
  Tensor replica_exp_avg_, replica_exp_avg_sq_, replica_momentum_, replica_params_, replica_grad_;
  float clip_factor_ = 1.0f;
  bool pending_ = false;
  struct BeforeRecovery {
    int64_t steps = 0;
    bool pending = false;
    float clip_factor = 1.0f;
    std::vector<int64_t> param_steps;
    std::vector<Tensor*> members;         // the state tensors, as they were (maybe undefined)
    std::vector<Tensor> handles, copies;  // their values (undefined: none)
    std::vector<Tensor> param_views, param_copies;  // this rank's shard of the parameters
  };
  std::optional<BeforeRecovery> before_recovery_;
};

}  // namespace ddp
