// DistributedDataParallel: wraps a module so that every rank computes gradients
// on its own shard of the batch and, after backward, every parameter's .grad
// holds the average over ranks (as torch.nn.parallel.DistributedDataParallel).
//
// Contract:
// - Construction is collective: every rank checks that all ranks hold the same
//   parameters and buffers (count, shapes, dtypes; a ValueError names the first
//   difference and the ranks) and then takes rank 0's values.
// - Gradients are reduced in buckets (collectives/ddp/bucket_plan.h). A
//   parameter's post-accumulate-grad hook copies its gradient into its bucket;
//   a bucket whose gradients are all in goes to the comm hook (default: an
//   asynchronous all_reduce(avg)), in bucket order on every rank, while backward
//   goes on (Note [comm hooks] in collectives/ddp/comm_hook.h).
// - Note [finishing backward]: PyTorch finishes the reduction from a callback of
//   the autograd engine; here ddp.backward(loss) runs backward and then
//   finish_backward(), which launches what is left, waits, and writes the
//   averages into every .grad. Calling ddp::backward directly needs a
//   finish_backward() after it, before optimizer.step().
// - forward() must be used (not module().forward) for no_sync() and buffer
//   broadcast to take effect. The object must outlive the backward passes it
//   reduces; after it is destroyed its hooks do nothing.
// - A CommError of a collective propagates from finish_backward().
// - Uneven inputs (ranks with different numbers of steps): collectives/ddp/join.h.
#pragma once

#include "collectives/communicator.h"
#include "collectives/ddp/bucket_plan.h"
#include "collectives/ddp/comm_hook.h"
#include "collectives/ddp/ddp_types.h"
#include "runtime/nn/module.h"

#include <concepts>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

struct DdpOptions {
  double bucket_cap_mb = 25;
  double first_bucket_mb = 1;
  // false: a parameter that got no gradient in a synchronized backward is a
  // ValueError naming it. true: its bucket slice is zero and it takes part.
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;  // rank 0's buffers before every forward
  // true: after a synchronized backward every .grad is a view into its bucket
  // (no copy back, less memory; the next backward overwrites it). false: the
  // averages are copied into the existing .grad tensors.
  bool gradient_as_bucket_view = false;
  // The built-in hook to register (Note [comm hooks] in comm_hook.h); none is
  // allreduce_hook. register_comm_hook() takes any other.
  CommHook comm_hook = CommHook::none;
  // Note [zero stages] in collectives/ddp/zero.h: 0 and 1 reduce gradients as
  // above (1: with a ZeroOptimizer updating this rank's shard); 2: DDP has no
  // buckets; the ZeroOptimizer attached to it reduce-scatters the gradients of
  // every synchronized backward in rounds during the backward (without one
  // attached, every backward is local and its step() reduces them); 3: as 2,
  // and the attached ZeroOptimizer shards the module's parameters too
  // (collectives/ddp/fully_shard.h).
  int zero_stage = 0;
};

class Reducer;
class Join;

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<Communicator> comm,
                          DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  // ddp::backward(loss) then finish_backward() (Note [finishing backward]).
  void backward(const Tensor& loss);
  // After a synchronized backward: every .grad holds the average over ranks.
  // After a backward under no_sync(): nothing to do.
  void finish_backward();

  // Note [comm hooks]: `hook` reduces every bucket from now on (PyTorch's
  // ddp.register_comm_hook(state, hook)). Once per DistributedDataParallel, on
  // every rank, before a forward; a ValueError if DdpOptions::comm_hook already
  // chose a compressing built-in.
  void register_comm_hook(CommHookFn hook);
  // The same with a state the hook keeps between calls (error feedback, ...):
  // hook(*state, comm, bucket). DDP holds `state` as long as the hook.
  template <typename State, typename Hook>
  requires std::invocable<Hook&, State&, Communicator&, GradBucket&>
  void register_comm_hook(std::shared_ptr<State> state, Hook hook) {
    register_comm_hook([state = std::move(state), hook = std::move(hook)](
                           Communicator& comm, GradBucket& bucket) mutable -> BucketFuture {
      return hook(*state, comm, bucket);
    });
  }

  // While alive, forward passes do not synchronize: their backward only
  // accumulates .grad locally; the next synchronized backward reduces the sum.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  nn::Module& module() { return *module_; }
  const std::shared_ptr<Communicator>& comm() const { return comm_; }
  const DdpOptions& options() const { return options_; }
  // The current plan: over the parameters in reverse registration order until
  // the first synchronized backward, then over the order rank 0 observed
  // (Note [bucket rebuild]). Bucket::params index bucket_parameters().
  const std::vector<Bucket>& buckets() const;
  // The names of the parameters that Bucket::params index.
  const std::vector<std::string>& bucket_parameters() const { return bucket_names_; }
  bool buckets_rebuilt() const;

  // zero_stage 2, 3 (ZeroOptimizer::attach): on_forward(sync) before every forward
  // that records a graph (sync: its backward is synchronized, not under
  // no_sync()); on_finish() from finish_backward(). Replaces earlier ones.
  struct ZeroCallbacks {
    std::function<void(bool sync)> on_forward;
    std::function<void()> on_finish;
  };
  void set_zero_callbacks(ZeroCallbacks callbacks);
  // Timing and bytes of the last synchronized backward.
  const CommStats& comm_stats() const;

 private:
  friend class Join;
  void check_devices() const;
  void verify_same_model();
  void broadcast_from_rank0(std::vector<Tensor>& tensors);
  void broadcast_from(int root, std::vector<Tensor>& tensors, const char* label);

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<Communicator> comm_;
  DdpOptions options_;
  std::shared_ptr<Reducer> reducer_;  // hooks hold it weakly
  std::vector<std::string> bucket_names_;
  bool no_sync_ = false;
  bool hook_registered_ = false;
  Join* join_ = nullptr;  // attached by a Join (Note [join] in join.cpp)
  ZeroCallbacks zero_;
};

}  // namespace ddp
