// FullyShardedParameters: ZeRO-3's parameters (collectives/ddp/zero.h, Note [zero
// stages]): every parameter lives as a 1/W shard per rank and is gathered a unit
// at a time just before use, as PyTorch's FSDP (fully_shard) and DeepSpeed's
// ZeRO-3 do. A ZeroOptimizer of stage 3 creates one when it attaches to a
// DistributedDataParallel of zero_stage 3; users reach it through that pair.
//
// Note [zero-3 units]: a unit is a module whose parameters are gathered and
// released together. FullyShardOptions::units names them (dotted module names,
// "transformer.h.0"); by default every child of an nn::Sequential that holds
// parameters is one (each transformer block of the gpt zoo, each layer of the mlp
// and cnn), the search not descending into a unit. The root unit (the whole
// module) holds every parameter no unit holds: the embeddings, the final
// LayerNorm and the tied head of the gpt zoo. A parameter belongs to the deepest
// unit above it.
//
// Note [zero-3 layout]: a unit's parameters (in named_parameters() order) are one
// flat space of N elements padded to W * B, B = ceil(N / W); rank r owns
// [r B, (r + 1) B), so one all_gather of the B-element shards fills the flat
// buffer, which the parameters view (Note [released storage] in
// runtime/tensor.h: their Storage keeps its identity while its memory comes and
// goes, so tensors autograd saved see the gathered values again in the
// backward). The padding (at most W - 1 elements per unit, on the last ranks) is
// zero and nobody reads it. Stages 1 and 2 balance the shards instead (Note [zero
// layout]): they gather into separate buffers anyway.
//
// Note [zero-3 schedule], per training step:
//   forward   the root's forward hook gathers the root unit (kept until the end of
//             the backward); each unit's hook gathers it (waiting for a prefetch),
//             starts the all_gather of the next unit in the previous step's
//             forward order (prefetch), and after the unit's forward releases it
//             (reshard_after_forward; false keeps it until its backward) and puts
//             an identity node on its output.
//   backward  that node runs once the unit's output gradient is complete, before
//             any of the unit's own backward: it gathers the unit again and
//             prefetches the unit that ran before it in the forward. In a
//             synchronized backward it also allocates the unit's flat gradient
//             buffer and makes each parameter's slice its gradient destination
//             (Note [gradient destinations] in autograd.h), so a Linear's weight
//             gradient is computed into the buffer, not copied there. When every
//             trainable parameter of a unit has its gradient (post-accumulate-grad
//             hooks), the gradients go into one flat buffer, the full .grad
//             tensors are released, an asynchronous reduce_scatter(avg) starts and
//             the unit is released.
//   finish    DDP's finish_backward(): units not yet reduced (a parameter without a
//             gradient counts as zero) are reduced in unit order, every
//             reduce_scatter is waited for and its shard added to the unit's
//             gradient shard, and every unit is released.
// All collectives are issued in the same order on every rank, which holds as long
// as every rank runs the same modules in the same order (FSDP's contract too: a
// data-dependent branch that skips a unit on one rank is not supported).
// A backward under no_sync() reduces nothing: the full .grad tensors accumulate
// (FSDP's no_sync) and the next synchronized backward reduces their sum.
// At most a rank holds its shards, the root unit, two gathered units (the one
// running and the one prefetched), the full gradients of the unit in backward
// and two units' gradient buffers in reduce-scatters (kMaxReductions; a third
// waits for the oldest).
// An evaluation (no-grad) forward gathers and releases unit by unit too, without
// prefetch; ranks with different numbers of evaluation batches keep in step
// through ranks_with_batch() and shadow_forward() (Note [lockstep evaluation] in
// trainer/task.h). Checkpoints gather every unit at once (gather_all(), held
// until the next training forward).
#pragma once

#include "collectives/communicator.h"
#include "runtime/nn/module.h"

#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace ddp {

struct FullyShardOptions {
  // Dotted names of the unit modules (Note [zero-3 units]); empty: the default.
  std::vector<std::string> units;
  // Release a unit's parameters after its forward and gather them again for its
  // backward (FSDP's reshard_after_forward); false keeps them until the backward.
  bool reshard_after_forward = true;
  // Start the next unit's all_gather while this one computes (forward and backward).
  bool prefetch = true;
};

class FullyShardedParameters : public std::enable_shared_from_this<FullyShardedParameters> {
 public:
  struct Unit {
    std::string name;  // "" for the root
    nn::Module* module = nullptr;
    std::vector<size_t> params{};   // indices into parameters()
    std::vector<int64_t> starts{};  // flat offset of each, then the unit's numel
    int64_t block = 0;              // B: elements per rank
    std::shared_ptr<Storage> full{};
    Tensor flat{};                      // [W * B] over `full`
    Tensor shard{};                     // this rank's [B] values
    Tensor grad_shard{};                // this rank's averaged [B] gradient (undefined: none yet)
    Tensor grad_flat{};                 // [W * B] the synchronized backward's gradients go to
    std::shared_ptr<Work> gathering{};  // in flight; `full` is allocated from gather() on
    bool stepped = false;               // since its last gather (Note [version counter])
    bool held = false;                  // gather_all(): kept until the next training forward
    int trainable = 0;                  // parameters requiring grad
    int pending = 0;                    // of those, without their gradient this backward
    bool reduced = false;
    int hook_id = -1;
  };

  // Collective. Shards every parameter of `root` (each rank keeps its shard of the
  // values it holds now, which must be equal on every rank: DDP's constructor
  // made them so) and installs the hooks. ValueError for a unit name that is not
  // a module of `root` (naming the valid ones), parameters of mixed dtypes or
  // devices within a unit, or a root without parameters.
  static std::shared_ptr<FullyShardedParameters> create(nn::Module& root,
                                                        std::shared_ptr<Communicator> comm,
                                                        FullyShardOptions options = {});
  ~FullyShardedParameters();
  FullyShardedParameters(const FullyShardedParameters&) = delete;
  FullyShardedParameters& operator=(const FullyShardedParameters&) = delete;

  // DDP's callbacks: before a training forward (sync: not under no_sync()), and
  // finish_backward().
  void arm(bool sync);
  void finish();
  // Collective: gathers every unit and keeps them until the next forward in grad
  // mode (checkpoints, evaluation). The module's parameters are readable then.
  void gather_all();
  // Note [lockstep evaluation] in trainer/task.h. Collective: how many ranks have
  // an evaluation batch this round.
  int64_t ranks_with_batch(bool has_batch);
  // The collectives of one evaluation forward without it: each unit gathered and
  // released in the order of the last evaluation forward (else the last
  // training forward's, else unit order), as pre_forward and post_forward would.
  void shadow_forward();
  // Every unit's gradient shard dropped (zero_grad(set_to_none)), and any full
  // .grad a no_sync() backward accumulated.
  void zero_grad();

  const std::vector<Tensor>& parameters() const { return params_; }
  const std::vector<std::string>& parameter_names() const { return names_; }
  const std::vector<Unit>& units() const { return units_; }
  // The unit holding parameter i and its index in that unit's params.
  std::pair<size_t, size_t> owner(size_t i) const { return owner_[i]; }
  // This rank's pieces of unit u's parameters: calls fn(k, offset in parameter
  // units()[u].params[k], length, offset in the unit's shard) for each.
  template <typename F>
  void for_each_owned_piece(size_t u, F&& fn) const;
  int rank() const { return comm_->rank(); }
  int world_size() const { return comm_->size(); }
  // Bytes: this rank's shards; the gathered units now and at most since
  // reset_peak(); the gradient shards.
  int64_t shard_bytes() const;
  int64_t gathered_bytes() const;
  int64_t peak_gathered_bytes() const { return peak_gathered_; }
  void reset_peak() { peak_gathered_ = gathered_bytes(); }
  int64_t grad_shard_bytes() const;
  // The names of the units, the root first ("" shown as "(root)").
  std::vector<std::string> unit_names() const;

  // For the hooks (internal).
  void pre_forward(size_t u);
  Tensor post_forward(size_t u, const Tensor& output);
  void pre_backward(size_t u);
  void on_gradient(size_t i);
  // The optimizer stepped unit u (every rank alike: it had a gradient shard).
  void note_stepped(size_t u) { units_[u].stepped = true; }

 private:
  FullyShardedParameters(std::shared_ptr<Communicator> comm, FullyShardOptions options);
  void build(nn::Module& root);
  void install_hooks();
  void gather(size_t u);
  void wait(size_t u);
  void release(size_t u);
  void reduce(size_t u);
  void complete_oldest();
  static constexpr size_t kMaxReductions = 2;
  void note_gathered();

  std::shared_ptr<Communicator> comm_;
  FullyShardOptions options_;
  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::pair<size_t, size_t>> owner_;
  std::vector<Unit> units_;  // [0] is the root
  bool sync_ = true;
  // Units in the order their forwards ran: this step's and the last complete one's.
  std::vector<size_t> seen_, last_order_;
  // The same for evaluation (no-grad) forwards.
  std::vector<size_t> eval_seen_, eval_order_;
  struct Reduction {
    size_t unit;
    Tensor input, output;
    std::shared_ptr<Work> work;
  };
  std::deque<Reduction> reductions_;  // in flight, oldest first
  int64_t peak_gathered_ = 0;
};

template <typename F>
void FullyShardedParameters::for_each_owned_piece(size_t u, F&& fn) const {
  const Unit& unit = units_[u];
  const int64_t begin = static_cast<int64_t>(comm_->rank()) * unit.block;
  const int64_t end = std::min(begin + unit.block, unit.starts.back());
  for (size_t k = 0; k + 1 < unit.starts.size(); ++k) {
    const int64_t lo = std::max(begin, unit.starts[k]);
    const int64_t hi = std::min(end, unit.starts[k + 1]);
    if (lo < hi) fn(k, lo - unit.starts[k], hi - lo, lo - begin);
  }
}

}  // namespace ddp
