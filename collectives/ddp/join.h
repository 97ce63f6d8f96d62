// Uneven inputs: a Join lets ranks with different numbers of steps train one
// DistributedDataParallel model without a hang (PyTorch's
// torch.distributed.algorithms.Join / ddp.join()).
//
//   ddp::Join join(ddp_model);                 // no collectives
//   for (auto& [x, y] : my_batches) {          // as many as this rank has
//     opt.zero_grad();
//     ddp_model.backward(loss_of(ddp_model(x), y));
//     opt.step();
//   }
//   join.finish();                             // collective: shadows, then syncs the model
//
// Contract (Note [join] in join.cpp):
// - While a Join is attached, every synchronized backward (outside no_sync()) of
//   a rank that still trains all-reduces a count of the ranks that still train,
//   just before its first bucket (for a model with buffers: in its forward, which
//   must then be followed by its backward and finish_backward()).
// - A rank out of data calls finish(): it shadows each remaining step of the
//   others -- the count (adding 0) and the gradient buckets, all-reduced as
//   zeros in the same order and sizes through the same comm hook, the bucket
//   rebuild included -- until the count is 0, then every rank takes the model
//   (parameters and buffers) of the highest-ranked of the ranks that joined last.
//   Every rank calls finish() exactly once, the last ones when they run out too.
// - A synchronized step's gradient is the sum over the ranks that still train
//   divided by the world size (divide_by_initial_world_size, the default, as
//   PyTorch), or by the number of ranks that still train: the comm hook's result
//   is then scaled by W / n, whatever the hook. The built-in hooks return the
//   world mean (sum / W), and a custom hook must too for that scale to be right;
//   PyTorch 1.13 instead applies its divisor only when no comm hook is
//   registered, leaving it to a custom hook.
// - Collectives the caller issues outside DDP (metrics, checks) are not shadowed:
//   either give them to after_shadow_step, or call shadow_step() from the
//   caller's own loop and issue them there too (as `train` does).
// - The destructor never communicates (a destructor must not throw): it detaches
//   the Join from the model, and when finish() was not called and no exception
//   is unwinding it logs a warning -- the other ranks' next collective then
//   waits for this rank and fails after the communicator's timeout.
// - The model must outlive finish(): after the DistributedDataParallel is
//   destroyed, finish() and shadow_step() are a ValueError (not a silent return,
//   which would leave the other ranks waiting).
// - Errors: a CommError of the count or a bucket propagates from forward,
//   finish_backward, shadow_step or finish; misuse is a ValueError.
#pragma once

#include "collectives/communicator.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace ddp {

class DistributedDataParallel;

struct JoinOptions {
  // false: the Join does nothing (no count, finish() returns at once): for
  // inputs known to be even (PyTorch's enable=False).
  bool enable = true;
  // true: a step's gradient is the sum over the ranks that still train divided
  // by the world size, so every sample weighs the same (a joined rank adds
  // zeros). false: divided by the number of ranks that still train, as if the
  // world had shrunk.
  bool divide_by_initial_world_size = true;
  // Called on a joined rank after each step it shadowed, with every
  // parameter's .grad holding that step's averaged gradient; e.g. the
  // optimizer's step() keeps the model and the optimizer's state equal to the
  // ranks that still train. It may issue collectives of its own that the
  // training ranks issue after their backward.
  std::function<void()> after_shadow_step;
};

class Join {
 public:
  // Attaches to `ddp`: one Join per model at a time, not during a synchronized
  // backward (before its finish_backward()), and not to a model without a
  // parameter that requires a gradient (ValueErrors). No collectives.
  explicit Join(DistributedDataParallel& ddp, JoinOptions options = {});
  // Detaches; never communicates (see the contract above).
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // This rank has run out of inputs: shadows the others' steps until every rank
  // has joined, then broadcasts the model from the highest-ranked of the ranks
  // that joined last (those with the most steps) and detaches.
  // Collective; once per rank.
  void finish();
  // One step of finish(): all-reduces the count (adding 0); when ranks still
  // train, shadows their step and returns true (then after_shadow_step runs);
  // when none does, returns false. From then on this rank must not run a
  // synchronized forward under this Join; call finish() after the last.
  bool shadow_step();

  bool joined() const { return joined_; }      // shadow_step() or finish() was called
  bool finished() const { return finished_; }  // finish() returned
  int64_t shadowed_steps() const { return shadowed_; }
  // Ranks that still trained at the last count this rank read (the world size
  // before any was read). A rank that trains reads the counts only where it
  // needs them (buffers: every forward), so without buffers its answer stays
  // the world size until it joins.
  int active_ranks() const;
  // The rank whose model finish() broadcast (-1 before).
  int authoritative_rank() const { return authoritative_; }

 private:
  friend class DistributedDataParallel;
  // DistributedDataParallel's side (Note [join] in join.cpp).
  void on_forward(bool synchronized);
  void before_first_bucket();
  double grad_scale();
  void issue_count(bool training);

  std::vector<int64_t> read_count();
  void adopt_own_count();
  int highest_active() const;
  void broadcast_buffers(int root);
  void sync_final_model();
  void detach();
  // ~DistributedDataParallel: detaches; finish() and shadow_step() then throw.
  void model_destroyed();
  void check_model_alive(const char* what) const;

  DistributedDataParallel* ddp_;  // null once detached
  bool model_destroyed_ = false;
  std::shared_ptr<Communicator> comm_;
  JoinOptions options_;
  // The last count this rank issued or read: slot r is 1 when rank r still trains.
  Tensor count_;
  std::shared_ptr<Work> count_work_;
  // The ranks that still trained at the last count with any (all at the start).
  std::vector<int64_t> last_active_;
  bool step_pending_ = false;      // a count of this step that finish_backward has not used
  bool count_in_forward_ = false;  // buffers: this step's count went with its forward
  bool joined_ = false;
  bool all_joined_ = false;
  bool finished_ = false;
  int64_t shadowed_ = 0;
  int authoritative_ = -1;
};

}  // namespace ddp
