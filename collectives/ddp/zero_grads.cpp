#include "collectives/ddp/zero_grads.h"

#include "collectives/collective_events.h"
#include "runtime/autograd/autograd.h"
#include "runtime/ops/ops.h"

#include <algorithm>

namespace ddp {

ZeroGradReducer::ZeroGradReducer(ZeroGradLayout layout, std::shared_ptr<Communicator> comm)
    : layout_(std::move(layout)), comm_(std::move(comm)) {
  const int64_t c = layout_.chunk;
  rounds_of_.resize(layout_.params.size());
  needed_.assign(static_cast<size_t>(rounds()), 0);
  released_at_.resize(static_cast<size_t>(rounds()));
  for (int64_t k = 0; k < rounds(); ++k) {
    for (const ShardRange& s : layout_.shards) {
      const int64_t len = std::clamp<int64_t>(s.size - k * c, 0, c);
      for_each_flat_piece(layout_.starts, s.begin + k * c, len,
                          [&](size_t i, int64_t, int64_t, int64_t) {
                            std::vector<int64_t>& of = rounds_of_[i];
                            if (!of.empty() && of.back() == k) return;
                            of.push_back(k);
                            ++needed_[static_cast<size_t>(k)];
                          });
    }
  }
  for (size_t i = 0; i < rounds_of_.size(); ++i) {
    if (!rounds_of_[i].empty())
      released_at_[static_cast<size_t>(rounds_of_[i].front())].push_back(i);
  }
  seen_.assign(layout_.params.size(), false);
}

int64_t ZeroGradReducer::rounds() const {
  return (layout_.max_shard + layout_.chunk - 1) / layout_.chunk;
}

void ZeroGradReducer::arm(bool sync) {
  DDP_CHECK(in_flight_.empty(),
            "ZeroOptimizer (stage 2): a forward began while {} gradient reduce-scatter rounds "
            "of the last synchronized backward are unfinished; call ddp.finish_backward() after "
            "ddp::backward(loss) (ddp.backward(loss) does both), before the next forward",
            in_flight_.size());
  armed_ = sync;
  if (!sync) return;
  reduced_ = false;  // this backward's average replaces the shard
  missing_ = needed_;
  seen_.assign(layout_.params.size(), false);
  next_ = rounds() - 1;
  launched_early_ = 0;
  unseen_ = static_cast<int64_t>(std::count_if(rounds_of_.begin(), rounds_of_.end(),
                                               [](const auto& r) { return !r.empty(); }));
}

void ZeroGradReducer::on_gradient(size_t i) {
  if (!armed_ || seen_[i]) return;
  seen_[i] = true;
  if (!rounds_of_[i].empty()) --unseen_;
  for (int64_t k : rounds_of_[i]) --missing_[static_cast<size_t>(k)];
  launch_ready();
}

void ZeroGradReducer::launch_ready() {
  while (next_ >= 0 && missing_[static_cast<size_t>(next_)] == 0) {
    launch(next_--);
    if (unseen_ > 0) ++launched_early_;
  }
}

// Round k's pieces of .grad (zero where a parameter has none) into its input,
// the reduce-scatter launched; this rank's block lands in the shard directly
// when it is a whole one.
void ZeroGradReducer::launch(int64_t k) {
  NoGradGuard no_grad;
  const int world = comm_->size();
  const int64_t c = layout_.chunk;
  const ShardRange own = layout_.shards[static_cast<size_t>(comm_->rank())];
  if (!shard_.defined()) shard_ = zeros({own.size}, {.device = layout_.device});
  if (in_flight_.size() >= kMaxInFlight) complete_oldest();
  Round round;
  round.k = k;
  if (spare_.empty()) {
    round.input = zeros({c * world}, {.device = layout_.device});
  } else {
    round.input = spare_.back();
    spare_.pop_back();
    fill_(round.input, 0.0);  // padding, and parameters without a gradient
  }
  for (int q = 0; q < world; ++q) {
    const ShardRange& s = layout_.shards[static_cast<size_t>(q)];
    const int64_t len = std::clamp<int64_t>(s.size - k * c, 0, c);
    for_each_flat_piece(layout_.starts, s.begin + k * c, len,
                        [&](size_t i, int64_t off, int64_t n, int64_t at) {
                          const Tensor g = grad(layout_.params[i]);
                          if (!g.defined()) return;
                          Tensor dst = round.input.flat_view(q * c + at, {n});
                          copy_(dst, g.flat_view(off, {n}));
                        });
  }
  const bool whole = own.size - k * c >= c;
  round.output = whole ? shard_.flat_view(k * c, {c}) : empty({c}, {.device = layout_.device});
  {
    const CollectiveLabel labelled("zero reduce_scatter");
    round.work = comm_->reduce_scatter(round.input, round.output, ReduceOp::avg);
  }
  in_flight_.push_back(std::move(round));
  // Their elements are all in launched rounds now (Note [zero stage 2 rounds]).
  for (size_t i : released_at_[static_cast<size_t>(k)]) set_grad(layout_.params[i], Tensor());
}

void ZeroGradReducer::complete_oldest() {
  Round r = std::move(in_flight_.front());
  in_flight_.pop_front();
  r.work->wait();
  const int64_t c = layout_.chunk;
  const int64_t mine = std::clamp<int64_t>(shard_.numel() - r.k * c, 0, c);
  if (mine > 0 && mine < c) {  // a whole block was reduced in place
    Tensor dst = shard_.flat_view(r.k * c, {mine});
    copy_(dst, r.output.flat_view(0, {mine}));
  }
  spare_.push_back(r.input);
}

void ZeroGradReducer::finish() {
  if (!armed_) {
    if (reduced_) return;
    next_ = rounds() - 1;  // a backward without arm(): everything at once
  }
  armed_ = false;
  NoGradGuard no_grad;
  while (next_ >= 0) launch(next_--);
  while (!in_flight_.empty()) complete_oldest();
  spare_.clear();
  for (Tensor& p : layout_.params) set_grad(p, Tensor());  // only the shard is kept
  reduced_ = true;
}

}  // namespace ddp
