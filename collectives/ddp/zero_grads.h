// ZeroGradReducer: ZeRO-2's gradient reduction (collectives/ddp/zero.h), in the
// collective rounds of Note [zero layout], launched during the backward.
//
// Note [zero stage 2 rounds]: round k reduce-scatters (avg) the flat ranges
// [begin_q + kC, begin_q + (k+1)C) of every rank q's shard; rank q receives its
// own. A round is ready once every parameter with elements in it has its gradient
// (a post-accumulate-grad hook counts them). Rounds launch asynchronously in one
// fixed order, descending k, every rank the same: round k goes once it and every
// round above it are ready, never in the order the gradients happen to arrive
// (ranks would pair different collectives). Descending, because autograd produces
// the last parameters' gradients first and round k's highest-numbered pieces lie
// furthest back. A round copies its pieces of .grad into an input buffer when it
// launches (at most kMaxInFlight rounds in flight: a launch first waits for the
// oldest, whose buffer it reuses; waiting is safe, every rank has launched that
// round or will without waiting on this one), and a parameter's .grad is released
// as soon as the last round holding its elements (the lowest) has launched.
// finish() (DDP's finish_backward(), or the optimizer's step) launches the rounds
// still waiting (a parameter that got no gradient this backward counts as zero),
// waits for all, writes the averages into the gradient shard and releases every
// .grad: after a synchronized backward a rank holds its averaged gradient shard
// and no full .grad. The overlap is as large as the layout allows: round k needs
// rank 0's piece [kC, (k+1)C), near the model's first parameters, so the rounds
// become ready during roughly the last 1/W of the backward.
// Only a synchronized backward is reduced: arm(false) (a forward under
// ddp.no_sync()) leaves the backward local, gradients accumulating in .grad.
// Without arm() (a backward outside DDP), finish() reduces everything at once.
#pragma once

#include "collectives/communicator.h"
#include "collectives/ddp/zero.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <vector>

namespace ddp {

// Calls fn(i, offset in parameter i, length, offset from `begin`) for every
// parameter piece of the flat range [begin, begin + len), `starts` being every
// parameter's flat offset, then the total.
template <typename F>
void for_each_flat_piece(const std::vector<int64_t>& starts, int64_t begin, int64_t len, F&& fn) {
  if (len <= 0) return;
  auto it = std::upper_bound(starts.begin(), starts.end(), begin);
  auto i = static_cast<size_t>(it - starts.begin()) - 1;
  const int64_t end = begin + len;
  for (int64_t pos = begin; pos < end;) {
    while (starts[i + 1] <= pos) ++i;  // parameters without elements
    const int64_t take = std::min(end, starts[i + 1]) - pos;
    fn(i, pos - starts[i], take, pos - begin);
    pos += take;
  }
}

struct ZeroGradLayout {
  std::vector<Tensor> params;
  std::vector<int64_t> starts;     // flat offset of each parameter, then N
  std::vector<ShardRange> shards;  // per rank
  int64_t max_shard = 0;
  int64_t chunk = 1;  // elements per rank and round
  Device device = Device::cpu();
};

class ZeroGradReducer {
 public:
  // Rounds in flight at once: their input buffers (W x C elements each) are what
  // the reduction adds to the gradients it releases.
  static constexpr size_t kMaxInFlight = 2;

  ZeroGradReducer(ZeroGradLayout layout, std::shared_ptr<Communicator> comm);

  // Before a forward that records a graph: `sync` true reduces its backward in
  // rounds (Note [zero stage 2 rounds]), false leaves it local. A ValueError if
  // the last synchronized backward was not finished.
  void arm(bool sync);
  // Parameter i's gradient for this backward is accumulated.
  void on_gradient(size_t i);
  // Collective: launches what is left, waits, fills shard() with the averaged
  // gradient and releases every .grad. Nothing if this step's is there already.
  void finish();
  // DDP's finish_backward(): finish() after a synchronized backward, nothing
  // after a local one (its gradients wait in .grad for the next).
  void end_backward() {
    if (armed_) finish();
  }
  // Elastic training: drops the communicator and the rounds in flight (the shard
  // stays); nothing collective may follow (ZeroOptimizer::leave_group()).
  void leave_group() {
    in_flight_.clear();
    armed_ = false;
    comm_.reset();
  }
  // After the optimizer's step: the next backward starts a new average.
  void consumed() { reduced_ = false; }
  bool reduced() const { return reduced_; }
  // This rank's averaged gradient shard (undefined before the first finish()).
  const Tensor& shard() const { return shard_; }
  int64_t rounds() const;
  // Rounds of the last synchronized backward launched while some parameter's
  // gradient was still to come: overlapped with the rest of the backward.
  int64_t launched_early() const { return launched_early_; }

 private:
  struct Round {
    int64_t k = 0;
    Tensor input, output;  // alive until the collective is waited for
    std::shared_ptr<Work> work;
  };
  void launch(int64_t k);
  void launch_ready();
  // Waits for the oldest round in flight and writes its block into the shard.
  void complete_oldest();

  ZeroGradLayout layout_;
  std::shared_ptr<Communicator> comm_;
  std::vector<std::vector<int64_t>> rounds_of_;   // per parameter, ascending
  std::vector<int64_t> needed_;                   // per round: parameters with elements in it
  std::vector<std::vector<size_t>> released_at_;  // per round: parameters whose last round it is
  // The backward in progress.
  bool armed_ = false;
  std::vector<int64_t> missing_;  // per round
  std::vector<bool> seen_;        // per parameter
  int64_t next_ = -1;             // the next round to launch (descending), -1: all launched
  std::deque<Round> in_flight_;   // at most kMaxInFlight
  std::vector<Tensor> spare_;     // input buffers of completed rounds, for reuse
  int64_t launched_early_ = 0;
  int64_t unseen_ = 0;       // parameters with elements whose gradient is still to come
  bool reduced_ = false;     // shard_ holds this step's average
  bool accumulate_ = false;  // add this backward's average to shard_
  Tensor shard_;
};

}  // namespace ddp
