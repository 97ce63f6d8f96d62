// The gradient reducer behind DistributedDataParallel (internal): owns one flat
// tensor per bucket of the plan, fills it from post-accumulate-grad hooks and
// hands full buckets to the comm hook in bucket order while backward goes on
// (Note [comm hooks] in collectives/ddp/comm_hook.h).
#pragma once

#include "collectives/communicator.h"
#include "collectives/ddp/bucket_plan.h"
#include "collectives/ddp/comm_hook.h"
#include "collectives/ddp/ddp_types.h"
#include "collectives/ddp/hook_communicator.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

struct ReducerOptions {
  BucketCaps caps;
  bool find_unused = false;
  bool gradient_as_bucket_view = false;
  CommHookFn comm_hook = allreduce_hook;
};

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  // params and names in reverse registration order (Note [bucket order]);
  // every param requires grad.
  Reducer(std::vector<Tensor> params, std::vector<std::string> names,
          std::shared_ptr<Communicator> comm, ReducerOptions options);
  // Clears the gradient destinations it set (Note [gradient destinations]).
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;
  // Registers one hook per parameter; each holds this reducer weakly.
  void install_hooks();
  // Called by every forward: whether the coming backward synchronizes.
  void prepare(bool sync);
  // The hook of param i: its gradient for this backward is complete.
  void mark_ready(size_t i);
  // Launches what is left, waits, and gives every param its averaged .grad,
  // multiplied by grad_scale() (empty: 1). The scale is asked for once every
  // bucket is launched: a Join dividing by the ranks that still train reads the
  // count that goes with bucket 0, which an unused parameter (find_unused)
  // may hold back until finish() launches it.
  void finish(const std::function<double()>& grad_scale = {});
  // A joined rank's side of a synchronized backward (Note [join] in join.cpp):
  // every gradient arrives as zero (a "bucket b ready" on the timeline, as in
  // a backward), every bucket goes through the comm hook in bucket order; then
  // as finish(), the bucket rebuild included. Between backwards only.
  void shadow(double grad_scale);
  // A synchronized backward has begun (a gradient arrived or a bucket was
  // launched) and finish() has not ended it.
  bool in_backward() const;
  // Replaces the comm hook; between backwards only.
  void set_comm_hook(CommHookFn hook);
  // Bucket::params index the params given to the constructor.
  const std::vector<Bucket>& buckets() const { return plan_; }
  bool rebuilt() const { return rebuilt_; }
  const CommStats& stats() const;
  // Runs before bucket 0 of every synchronized backward (and shadow()) is handed to
  // the comm hook: a Join's count (Note [join] in join.cpp). Empty: nothing.
  void set_before_first_bucket(std::function<void()> f) { before_first_bucket_ = std::move(f); }

 private:
  void allocate_buckets();
  // One more gradient of bucket b is ready.
  void count_ready(size_t b);
  void launch_ready_buckets();
  // Runs the comm hook of bucket b; abandons the backward if it throws.
  void launch_bucket(size_t b);
  // Waits for bucket b's result and writes it into the bucket (ValueError if
  // the hook returned a tensor of another shape).
  void collect_bucket(size_t b);
  void handle_unused();
  // finish() once every bucket is launched: waits, scales, writes, rebuilds.
  void complete(const std::function<double()>& grad_scale);
  // After a failed backward: moves the buckets and futures to the orphans,
  // fresh buckets, state reset.
  void abandon_buckets();
  void write_grads();
  void rebuild_buckets();
  void reset();

  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<Communicator> comm_;
  ReducerOptions options_;
  std::vector<ParamInfo> infos_;
  std::vector<Bucket> plan_;
  std::shared_ptr<HookCommunicator> hook_comm_;  // what the hook's collectives send
  std::vector<Tensor> flats_;                    // one per bucket
  std::vector<Tensor> views_;                    // param i's slice of its bucket, param-shaped
  std::vector<size_t> bucket_of_;
  bool rebuilt_ = false;             // Note [bucket rebuild]
  std::vector<size_t> ready_order_;  // of the first synchronized backward
  // State of the current backward.
  bool sync_ = true;
  // A synchronized forward since the last finish(): a second finish() without one
  // is refused (it would reduce, or with find_unused zero, gradients again).
  bool armed_ = false;
  std::vector<char> ready_;
  std::vector<size_t> pending_;                  // per bucket: params not ready yet
  size_t next_launch_ = 0;                       // buckets below it have been launched
  std::vector<BucketFuture> futures_;            // per launched bucket
  std::vector<std::shared_ptr<Work>> measured_;  // the last synchronized backward's works
  mutable CommStats stats_;                      // comm_s is summed in stats()
  // Buckets and works abandoned by a failed backward: kept alive until the
  // communicator is done with them (Communicator contract).
  std::vector<Tensor> orphaned_flats_;
  std::vector<BucketFuture> orphaned_futures_;
  std::function<void()> before_first_bucket_;
  double last_wait_s_ = 0;  // Note [last bucket on the caller]
};

}  // namespace ddp
