// The epochs of `train` (run.h): the steps -- trained, or shadowed under a Join
// on a rank out of data (Note [uneven epochs] in uneven.h) -- and the epoch's
// metrics, progress, evaluations and checkpoints.
#include "collectives/collective_events.h"
#include "collectives/flight/flight_recorder.h"
#include "runtime/autograd/functions.h"
#include "runtime/logging.h"
#include "runtime/ops/ops.h"
#include "runtime/profile.h"
#include "runtime/stream.h"
#include "runtime/trace.h"
#include "trainer/elastic.h"
#include "trainer/memory_report.h"
#include "trainer/progress.h"
#include "trainer/run.h"
#include "trainer/sharded_checkpoint.h"
#include "trainer/straggler_stats.h"
#include "trainer/uneven.h"

#include <signal.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>
#include <thread>
#include <utility>

namespace ddp::train {
namespace {

using Clock = std::chrono::steady_clock;

// Times the phases of a step; on CUDA a lap synchronizes the device first when
// sync_timing is set (else it measures the host's launch time).
class PhaseClock {
 public:
  PhaseClock(const Device& device, bool sync) : device_(device), sync_(sync && device.is_cuda()) {}
  double lap() {
    if (sync_) synchronize(device_);
    const auto now = Clock::now();
    const double s = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return s;
  }

 private:
  Device device_;
  bool sync_;
  Clock::time_point last_ = Clock::now();
};

struct PhaseTotals {
  double data = 0, forward = 0, backward = 0, exposed = 0, optimizer = 0, comm = 0;
};

// A step's timing: its trace span ("step", with `span_args`; Note [timeline]) and
// phases, its clock, the epoch's totals.
struct StepTiming {
  StepTiming(const Run& r, PhaseTotals& totals, trace::Args span_args)
      : clock(r.device, r.o.sync_timing),
        span("step", "train", span_args),
        phase("train", r.device),
        t(totals) {}
  PhaseClock clock;
  trace::Span span;
  trace::Phases phase;
  PhaseTotals& t;
};

// The forward of one micro-batch and its loss, scaled by 1 / grad_accum; under
// DDP all but the step's last (sync) run under no_sync().
Tensor micro_batch_loss(Run& r, const Batch& batch, bool sync, int64_t step) {
  const AutocastGuard mixed_precision(r.autocast);  // the forward and the loss
  Tensor logits;
  if (r.ddp) {
    std::optional<DistributedDataParallel::NoSyncGuard> no_sync;
    if (!sync) no_sync.emplace(*r.ddp);
    logits = r.ddp->forward(batch.inputs);
  } else if (r.dp) {
    logits = r.dp->forward(batch.inputs);  // replicate, scatter, parallel apply, gather
  } else {
    logits = (*r.model)(batch.inputs);
  }
  if (r.faults.slow_ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(r.faults.slow_ms));
  Tensor loss = r.task->loss(logits, batch);
  const int64_t k = r.o.grad_accum;
  if (k > 1) loss = functional::scale(loss, 1.0f / static_cast<float>(k));
  if (sync && step == r.faults.nan_step) {
    loss = functional::scale(loss, std::numeric_limits<float>::quiet_NaN());
  }
  return loss;
}

// The weights this rank holds: ZeRO-3's shards, else the model's parameters.
std::vector<Tensor> weights(const Run& r) {
  return r.zero != nullptr ? r.zero->weights() : r.model->parameters();
}

// The step's gradients: the .grad tensors, or ZeRO-2's averaged shard (the full
// .grad tensors are released; Note [zero stages]). Collective at stage 2.
std::vector<Tensor> step_gradients(Run& r) {
  if (r.zero != nullptr && r.zero->stage() >= 2) {
    r.zero->reduce_gradients();    // nothing if the synchronized backward did it
    return r.zero->grad_shards();  // stage 3: one per unit
  }
  std::vector<Tensor> grads;
  for (const Tensor& p : r.model->parameters()) grads.push_back(grad(p));
  return grads;
}

// The end of a step on every rank, shadowing or not: the non-finite check, then
// clipping and the optimizer's update unless the check skips it. `prepared`: the
// optimizer's prepare_step() ran for this step already (Note [graphed steps]).
void update(Run& r, int64_t step, int64_t epoch, const Tensor& step_loss, StepTiming& timing,
            bool prepared = false) {
  timing.phase.next("optimizer");
  if (!r.nonfinite->after_backward(step, epoch + 1, step_loss, step_gradients(r))) {
    // After DDP's all_reduce has been waited for: every rank clips the same
    // averaged gradients by the same norm.
    if (r.o.clip_grad_norm > 0) {
      // ZeRO: the norm from the shards (sums of squares all-reduced). CUDA: the
      // norm stays on the device until it is reported (Note [clipping on the device]),
      // and AdamW applies the factor as it reads the gradients (Note [clipping in the
      // step]).
      if (r.zero != nullptr) {
        r.grad_norm = r.zero->clip_grad_norm(r.o.clip_grad_norm);
      } else if (r.device.is_cuda()) {
        r.grad_norm_on_device = optim::clip_grad_norm_on_device(
            r.model->parameters(), r.o.clip_grad_norm, r.optimizer.get());
      } else {
        r.grad_norm = optim::clip_grad_norm_(r.model->parameters(), r.o.clip_grad_norm);
      }
    }
    if (!prepared) r.optimizer->set_lr(r.schedule.lr_at(r.optimizer->steps()));
    const int64_t before = r.optimizer->steps();
    try {
      if (prepared) {
        r.optimizer->apply_step();
      } else {
        r.optimizer->step();
      }
    } catch (const CommError&) {
      // --zero-replicas 2: past its commit the update counts on every rank even
      // when the all-gather fails (Note [zero replicas] in collectives/ddp/zero.h).
      if (!r.elastic || r.zero == nullptr || r.optimizer->steps() == before) throw;
      r.failed_after_update = std::current_exception();
    }
    if (r.optimizer->steps() != before && r.has_previous_optimizer) {
      r.previous_optimizer.reset();  // Note [zero generations] in elastic.cpp
      r.has_previous_optimizer = false;
    }
  }
  timing.t.optimizer += timing.clock.lap();
}

// Note [graphed steps]: train --cuda-graph (docs/cuda_graphs.md). The first
// kEagerSteps steps run eagerly: they make the gradients, the optimizer's state,
// the cuBLAS handles and cuBLASLt's and cuDNN's plans. The next step is captured
// into a CUDA graph (runtime/cuda_graph.h) -- zero_grad, the forward and the loss,
// the backward, clipping on the device, the optimizer's apply_step() -- and
// replayed, and so is every later one: its batch is copied into the graph's inputs,
// the host's part of the update runs (the learning rate, the step counts: Note
// [captured optimizer steps] in runtime/optim/optimizer.h), the graph is launched
// and its loss copied out. The gradients are zeroed in place, never set to none, so
// the same tensors serve the eager and the replayed steps; a value differs from an
// eager run's only in the sign of a zero gradient, which no update sees. A batch of
// another shape (a padded or partial last batch) and the DDP_TEST_NAN_STEP step run
// eagerly, and the capture waits for a batch of the shape the eager step before it
// had. A capture or a replay that fails (a host read in the step, dropout, which would
// draw one mask for every replay) prints one line with the reason, and the run goes
// on eagerly from the same state: nothing captured ran.
constexpr int64_t kEagerSteps = 2;

// One step of one micro-batch without a graph, on `batch`: --cuda-graph's eager
// steps. `prepared`: as update()'s.
void eager_step(Run& r, const Batch& batch, int64_t step, int64_t epoch, Tensor& step_loss,
                Tensor& last_loss, StepTiming& timing, bool prepared) {
  r.optimizer->zero_grad(/*set_to_none=*/false);
  timing.phase.next("forward");
  const Tensor loss = micro_batch_loss(r, batch, /*sync=*/true, step);
  timing.t.forward += timing.clock.lap();
  timing.phase.next("backward");
  backward(loss);
  timing.t.backward += timing.clock.lap();
  step_loss = loss;
  last_loss = loss;
  update(r, step, epoch, step_loss, timing, prepared);
}

// Whether `batch` fits the graph's inputs.
bool fits(const Batch& graph_inputs, const Batch& batch) {
  const auto same = [](const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() && a.device() == b.device();
  };
  return graph_inputs.inputs.defined() && same(graph_inputs.inputs, batch.inputs) &&
         same(graph_inputs.labels, batch.labels);
}

// The step whose capture or replay failed (`what`): one warning, then this step and
// every later one eagerly; nothing captured ran, and prepare_step() did this step's
// host half. Returns the step's samples.
int64_t graph_failed(Run& r, int64_t step, int64_t epoch, Tensor& step_loss, Tensor& last_loss,
                     StepTiming& timing, const char* what, const std::exception& e) {
  GraphedStep& g = *r.graphed;
  g.off = true;
  g.loss = Tensor();
  g.grad_norm = Tensor();
  DDP_LOG_WARN("--cuda-graph: step {} could not be {} ({}); training goes on without a graph", step,
               what, e.what());
  eager_step(r, g.batch, step, epoch, step_loss, last_loss, timing, /*prepared=*/true);
  return g.batch.labels.size(0);
}

// A step under --cuda-graph (Note [graphed steps]); returns train_step's answer.
int64_t graphed_step(Run& r, Tensor& step_loss, Tensor& last_loss, PhaseTotals& t, int64_t epoch) {
  GraphedStep& g = *r.graphed;
  const int64_t step = r.step + 1;
  StepTiming timing(r, t, {{"step", step}});
  timing.phase.next("data wait");
  Batch batch;
  if (!r.task->next(batch)) return 0;
  t.data += timing.clock.lap();
  const int64_t samples = batch.labels.size(0);
  // Captured on a batch of the shape the last eager step had: not on a short last batch.
  const bool capture =
      !g.off && !g.graph.captured() && g.eager_steps >= kEagerSteps && fits(g.batch, batch);
  const bool replay = !g.off && g.graph.captured() && fits(g.batch, batch);
  if (step == r.faults.nan_step || !(capture || replay)) {
    if (!g.graph.captured()) {
      ++g.eager_steps;
      g.batch = batch;  // its shape; the capture clones a batch of its own
    }
    eager_step(r, batch, step, epoch, step_loss, last_loss, timing, /*prepared=*/false);
    return samples;
  }
  if (capture) {  // a batch requires no gradient: the copies record nothing
    g.batch = {batch.inputs.clone(), batch.labels.clone()};
  } else {
    copy_(g.batch.inputs, batch.inputs);
    copy_(g.batch.labels, batch.labels);
  }
  r.optimizer->set_lr(r.schedule.lr_at(r.optimizer->steps()));
  r.optimizer->prepare_step();
  if (capture) {
    timing.phase.next("graph capture");
    try {
      g.graph.capture(r.device, [&] {
        r.optimizer->zero_grad(/*set_to_none=*/false);
        g.loss = micro_batch_loss(r, g.batch, /*sync=*/true, step);
        backward(g.loss);
        if (r.o.clip_grad_norm > 0) {
          g.grad_norm = optim::clip_grad_norm_on_device(r.model->parameters(), r.o.clip_grad_norm,
                                                        r.optimizer.get());
        }
        r.optimizer->apply_step();
      });
    } catch (const std::exception& e) {
      return graph_failed(r, step, epoch, step_loss, last_loss, timing, "captured", e);
    }
  }
  timing.phase.next("graph replay");
  try {
    g.graph.replay();
  } catch (const std::exception& e) {  // a launch that failed ran nothing
    return graph_failed(r, step, epoch, step_loss, last_loss, timing, "replayed", e);
  }
  {
    NoGradGuard no_grad;
    step_loss = g.loss.clone();  // the next replay rewrites g.loss
    if (g.grad_norm.defined()) r.grad_norm_on_device = g.grad_norm.clone();
  }
  last_loss = step_loss;
  r.nonfinite->after_backward(step, epoch + 1, step_loss, {});  // stop: records the loss
  t.forward += timing.clock.lap();  // a replayed step's time is all forward_ms
  return samples;
}

// One training step: o.grad_accum micro-batches, each loss scaled by 1 /
// grad_accum so the gradient is the mean over the step's samples; then update().
// Returns the samples this rank used (0: the loader ran out). `step_loss` gets
// the step's loss (the sum of its micro-batches').
int64_t train_step(Run& r, Tensor& step_loss, Tensor& last_loss, PhaseTotals& t, int64_t epoch) {
  if (r.graphed) return graphed_step(r, step_loss, last_loss, t, epoch);
  const int64_t k = r.o.grad_accum;
  const int64_t step = r.step + 1;
  StepTiming timing(r, t, {{"step", step}});
  r.optimizer->zero_grad(/*set_to_none=*/true);  // backward then hands .grad its fresh tensors
  int64_t samples = 0;
  step_loss = Tensor();
  Batch batch;
  for (int64_t m = 0; m < k; ++m) {
    timing.phase.next("data wait");
    if (!r.task->next(batch)) return 0;
    t.data += timing.clock.lap();
    timing.phase.next("forward", {{"micro_batch", m}});
    const bool sync = m + 1 == k;
    const Tensor loss = micro_batch_loss(r, batch, sync, step);
    t.forward += timing.clock.lap();
    timing.phase.next("backward", {{"micro_batch", m}});
    backward(loss);
    t.backward += timing.clock.lap();
    if (r.ddp && sync) {
      timing.phase.next("grad sync (exposed)");
      r.ddp->finish_backward();  // every .grad now holds the average over ranks
      t.exposed += timing.clock.lap();
      const CommStats& stats = r.ddp->comm_stats();
      t.comm += stats.comm_s;
      // The backward waited for the last bucket (Note [last bucket on the
      // caller] in reducer.cpp): communication, not backward.
      t.backward -= stats.in_backward_s;
      t.exposed += stats.in_backward_s;
    }
    {
      NoGradGuard no_grad;
      const Tensor unscaled = k > 1 ? scale(loss, static_cast<float>(k)) : loss;
      step_loss = step_loss.defined() ? add(step_loss, unscaled) : unscaled;
    }
    last_loss = loss;
    samples += batch.labels.size(0);
  }
  update(r, step, epoch, step_loss, timing);
  return samples;
}

// A step this rank has no data for (Note [uneven epochs] in uneven.h): it
// shadows the step of the ranks that train -- the Join's count, zero buckets --
// and then updates with the average they made, as they do.
void shadow_step(Run& r, Tensor& step_loss, Tensor& last_loss, PhaseTotals& t, int64_t epoch) {
  const int64_t step = r.step + 1;
  StepTiming timing(r, t, {{"step", step}, {"shadow", 1}});
  r.optimizer->zero_grad(/*set_to_none=*/true);
  timing.phase.next("join shadow");  // out of data: the others' gradient sync, with zeros
  const bool shadowed = r.join->shadow_step();
  DDP_ASSERT(shadowed, "step {}: no rank trains, yet rank 0 has data", step);
  t.exposed += timing.clock.lap();
  t.comm += r.ddp->comm_stats().comm_s;
  step_loss = zeros({}, {.device = r.device});  // finite: the check counts others' losses
  if (!last_loss.defined()) last_loss = step_loss;
  update(r, step, epoch, step_loss, timing);
}

// Where the run stands, for a checkpoint: `completed` epochs done and `epoch_step`
// steps into the next one.
CheckpointInfo position(const Run& r, int64_t completed, int64_t epoch_step, const Tensor& loss_sum,
                        int64_t loss_count) {
  CheckpointInfo info{r.task->model_spec(),
                      r.optimizer->name(),
                      completed,
                      r.step,
                      r.o.seed,
                      epoch_step,
                      epoch_step > 0 ? loss_sum.item<float>() : 0.0f,
                      epoch_step > 0 ? loss_count : 0,
                      r.o.batch_size * r.o.grad_accum * r.world_size,
                      r.nonfinite->skipped()};
  info.best_metric = r.best_metric;
  info.evals_since_best = r.evals_since_best;
  info.train_size = r.task->train_size();
  if (r.task->is_language_model()) info.text_unit = r.task->corpus_entropy().unit;
  info.task = task_kind(r.task->is_language_model(), r.task->is_regression());
  if (epoch_step > 0 && r.position.epoch == completed) info.epoch_cursor = r.position.cursor;
  info.schedule_steps = r.schedule.total_steps;
  return info;
}

// --save-sharded: an id for this save's shard files and manifest, rank 0's random
// number sent to every rank (one small broadcast per save), so that a shard of
// another save with the same step, rank and world size is refused at load.
std::string shard_save_id(Run& r) {
  Communicator& comm = *r.pg->comm;
  int64_t id = 0;
  if (comm.rank() == 0) {
    std::random_device device;
    id = static_cast<int64_t>((static_cast<uint64_t>(device()) << 32) | device());
  }
  Tensor t = from_vector<int64_t>({id}, {1}, {.dtype = DType::i64, .device = comm.device()});
  {
    const CollectiveLabel labelled("checkpoint save id");
    comm.broadcast(t, 0)->wait();
  }
  return fmt::format("{:016x}", static_cast<uint64_t>(t.to_vector<int64_t>()[0]));
}

// Writes --save (rank 0; the others have no --save) for the run as it stands:
// `completed` epochs done and `epoch_step` steps into the next one. Every rank
// has checked the weights just before (NonfiniteCheck::check_weights).
void save(Run& r, int64_t completed, int64_t epoch_step, const Tensor& loss_sum,
          int64_t loss_count) {
  const bool sharded = r.zero != nullptr && !r.o.save_everywhere.empty() && r.o.save_sharded;
  std::string save_id;
  if (r.zero != nullptr && !r.o.save_everywhere.empty()) {
    if (sharded) {  // stage 3: the parameters too (Note [zero-3 shard files])
      save_id = shard_save_id(r);
      save_optimizer_shard(r.o.save_everywhere, *r.zero, r.step, save_id);
      r.pg->comm->barrier()->wait();  // every shard is written before the manifest names it
    } else {
      r.zero->gather_state();  // collective: rank 0 writes it
    }
  }
  if (r.step == r.faults.kill_in_save_step) ::raise(SIGKILL);  // a testing aid
  if (!r.o.save.empty()) {
    const trace::Span span("checkpoint", "train", {{"step", r.step}});
    r.loss_log->flush();  // Note [rows cut back] in run_log.cpp
    CheckpointInfo info = position(r, completed, epoch_step, loss_sum, loss_count);
    info.optimizer_shards = r.o.save_sharded ? r.world_size : 0;
    info.zero3_shards = r.o.save_sharded && r.o.zero == 3;  // no parameters: they stay sharded
    info.shard_save_id = save_id;
    std::vector<std::string> removed;
    save_checkpoint(r.o.save, *r.model, *r.optimizer, info, &removed);
    for (const auto& f : removed) {
      if (!r.o.quiet) r.out << "removed " << f << ", left by a save that did not finish\n";
    }
  }
  if (sharded) {
    // Note [shard generations]: the manifest names this step's shards now; the
    // others go (rank 0 every rank's, for files of another world size; each rank its
    // own, where the ranks do not share a file system).
    r.pg->comm->barrier()->wait();
    const int rank = r.zero->rank();
    remove_other_shard_generations(r.o.save_everywhere, rank == 0 ? -1 : rank, r.step);
  } else if (!r.o.save.empty()) {
    // A whole file replaced a sharded checkpoint: its shard files are no one's now.
    remove_other_shard_generations(r.o.save, -1, std::numeric_limits<int64_t>::min());
  }
}

}  // namespace

bool save_as_resumed(Run& r, const std::string& resumed_from) {
  // Every rank knows the file (save_everywhere; one process: --save), and decides
  // alike from the same strings (a path resolved per rank could differ between
  // nodes, and the save has collectives).
  const std::string& target = r.pg != nullptr ? r.o.save_everywhere : r.o.save;
  if (!r.did_resume || r.first_epoch < r.o.epochs || target.empty()) return false;
  const bool was_sharded = r.resumed.optimizer_shards > 0 || r.resumed.zero3_shards;
  const bool writes_sharded = r.zero != nullptr && r.o.save_sharded;
  if (resumed_from == target && was_sharded == writes_sharded) return false;  // the file it read
  const CheckpointInfo& c = r.resumed;
  Tensor loss_sum;
  if (c.epoch_step > 0) {  // a mid-epoch checkpoint stays one, at its position
    r.position = EpochPosition{.epoch = c.epoch_cursor >= 0 ? c.epoch : -1,  // -1: none recorded
                               .step = c.epoch_step,
                               .cursor = std::max<int64_t>(c.epoch_cursor, 0)};
    loss_sum = from_vector<float>({c.epoch_loss_sum}, {}, {.device = r.device});
  }
  r.nonfinite->check_weights(r.step, weights(r));
  save(r, c.epoch, c.epoch_step, loss_sum, c.epoch_loss_count);
  return true;
}

namespace {

// Note [resume mid-epoch] in checkpoint.cpp: the steps a resumed checkpoint took in
// this epoch are passed over, and their loss sum restored.
int64_t resume_in_epoch(Run& r, int64_t epoch, Tensor& loss_sum, int64_t& loss_count) {
  if (r.resumed.epoch != epoch || r.resumed.epoch_step == 0) return 0;
  const int64_t step = r.resumed.epoch_step;
  r.resumed.epoch_step = 0;  // once
  fill_(loss_sum, static_cast<double>(r.resumed.epoch_loss_sum));
  loss_count = r.resumed.epoch_loss_count;
  Batch skipped;
  // Under --drop-last false this rank may have fewer batches than the others took.
  const int64_t taken = std::min(step * r.o.grad_accum, r.task->num_batches());
  for (int64_t b = 0; b < taken; ++b) DDP_ASSERT(r.task->next(skipped), "batch {}", b);
  return step;
}

// The sampler positions (all ranks') that the first `steps` steps of `plan` take.
int64_t positions_taken(const Run& r, const EpochSteps& plan, int64_t steps) {
  const auto rows = [&r](int q, int64_t b) { return r.task->batch_rows(q, b); };
  int64_t cursor = 0;
  for (int64_t s = 0; s < steps; ++s) cursor += step_samples(plan, s, r.o.grad_accum, rows);
  return cursor;
}

// A checkpoint taken mid-epoch after a regroup changed the world size in that epoch
// (its epoch_cursor is not what its steps at this world size would have taken):
// the epoch goes on from the cursor as after a regroup, the rest of its samples
// shared out among this run's ranks, so none is taken twice or skipped. nullopt
// for every other start (the steps are passed over: resume_in_epoch).
std::optional<EpochPosition> resumed_after_regroup(Run& r, int64_t epoch, int rank) {
  const CheckpointInfo& c = r.resumed;
  if (c.epoch != epoch || c.epoch_step == 0 || c.epoch_cursor < 0) return std::nullopt;
  const int64_t cursor =
      positions_taken(r, epoch_steps(*r.task, r.o, rank, r.world_size), c.epoch_step);
  if (cursor == c.epoch_cursor) return std::nullopt;
  DDP_CHECK(r.task->reshardable(),
            "the checkpoint stopped in epoch {} at sample position {} after a change of the "
            "group's size, and {} cannot share the rest of an epoch out anew; resume from a "
            "checkpoint at an epoch's end",
            epoch + 1, c.epoch_cursor, r.task->model_spec());
  const EpochPosition at{.epoch = epoch,
                         .step = c.epoch_step,
                         .cursor = c.epoch_cursor,
                         .loss_sum_value = c.epoch_loss_sum,
                         .micro_batches = c.epoch_loss_count,
                         .reports = 2};
  r.resumed.epoch_step = 0;  // once
  if (!r.o.quiet) {
    r.out << fmt::format(
        "the checkpoint stopped in epoch {} after its step {} at sample position {}, where "
        "this run's steps would have taken {} (the global batch, or the group's size, "
        "changed): going on from {}, the rest of the epoch shared out among {} rank{}\n",
        epoch + 1, at.step, at.cursor, cursor, at.cursor, r.world_size,
        r.world_size == 1 ? "" : "s");
  }
  return at;
}

// Where an epoch stands, for its metrics: at its end and at each evaluation
// inside it (--eval-every).
struct EpochState {
  int64_t epoch = 0;  // 0-based
  int64_t first_step = 0, step = 0;
  Clock::time_point start = Clock::now();
  double eval_s = 0;  // evaluations so far: left out of the training time
  Tensor loss_sum;
  int64_t micro_batches = 0, samples = 0, tokens = 0;  // samples and tokens: all ranks'
  PhaseTotals t;
  StragglerMeter straggler;  // started with the epoch
};

// The epoch's metrics so far, then the evaluation (excluded from the rates).
EpochMetrics measure(Run& r, EpochState& e) {
  synchronize(r.device);
  const double train_s = seconds_since(e.start) - e.eval_s;
  EpochMetrics m;
  m.epoch = e.epoch + 1;
  m.steps = e.step;
  m.skipped_steps = r.nonfinite->skipped();
  m.lr = r.optimizer->lr();
  // No step counted (every one skipped by --on-nonfinite skip): no loss to average,
  // not a perfect 0 (null in --metrics, nan in the report).
  m.train_loss = e.micro_batches == 0
                     ? std::numeric_limits<double>::quiet_NaN()
                     : e.loss_sum.item<float>() / static_cast<double>(e.micro_batches);
  m.samples_per_s = static_cast<double>(e.samples) / train_s;
  m.tokens_per_s = static_cast<double>(e.tokens) / train_s;
  // The phases of the steps this process ran (after a resume, not those before it).
  const int64_t ran = e.step - e.first_step;
  m.step_ms = ran == 0 ? 0.0 : 1e3 * train_s / static_cast<double>(ran);
  const double per_step = ran == 0 ? 0.0 : 1e3 / static_cast<double>(ran);
  m.data_ms = e.t.data * per_step;
  m.forward_ms = e.t.forward * per_step;
  m.backward_ms = e.t.backward * per_step;
  m.comm_exposed_ms = e.t.exposed * per_step;
  m.optimizer_ms = e.t.optimizer * per_step;
  m.comm_ms = e.t.comm * per_step;
  if (r.pg != nullptr && r.world_size > 1) {
    const StragglerStats s = e.straggler.measure(*r.pg->comm);
    m.rank_compute_ms = s.compute_ms;
    m.rank_wait_ms = s.wait_ms;
    m.stragglers = s.stragglers;
  }
  measure_memory(r, m);  // before the evaluation's activations
  const auto eval_start = Clock::now();
  Evaluation ev;
  {
    const trace::Span span("evaluation", "train", {{"step", r.step}});
    const AutocastGuard mixed_precision(r.autocast);
    ev = r.task->evaluate(*r.model, r.pg ? r.pg->comm.get() : nullptr);
  }
  e.eval_s += seconds_since(eval_start);
  m.test_acc = ev.accuracy;
  m.regression = r.task->is_regression();
  m.test_loss = m.regression ? ev.loss : 0.0;
  m.language = r.task->is_language_model();
  m.val_loss = ev.loss;
  m.val_bpb = ev.loss / std::log(2.0);
  if (r.grad_norm_on_device.defined()) {
    r.grad_norm = r.grad_norm_on_device.cpu().item<float>();
  }
  m.grad_norm = r.grad_norm;
  const CorpusEntropy entropy = r.task->corpus_entropy();
  m.unigram_bits = entropy.unigram_bits;
  m.bigram_bits = entropy.bigram_bits;
  m.unit = entropy.unit;
  m.time_s = seconds_since(e.start);
  return m;
}

// After a training step that used `used` samples on this rank and `global` on all
// ranks: the counts, the epoch's loss sum (a skipped or shadowed step's loss left
// out) and the loss log. Returns the step's number in the epoch.
int64_t count_step(Run& r, EpochState& e, int64_t used, int64_t global, int64_t skipped_before,
                   const Tensor& step_loss, const Tensor& last_loss) {
  const int64_t step = ++e.step;
  ++r.step;
  if (r.step == r.faults.nan_weight_step) {
    NoGradGuard no_grad;
    fill_(weights(r).front(), std::numeric_limits<double>::quiet_NaN());  // ZeRO-3: a shard
  }
  if (r.nonfinite->skipped() == skipped_before && used > 0) {
    NoGradGuard no_grad;
    axpy_(1.0f, step_loss, e.loss_sum);
    e.micro_batches += r.o.grad_accum;
  }
  r.loss_log->step(e.epoch + 1, step, last_loss, r.o.grad_accum);
  e.samples += global;
  e.tokens += global * r.task->tokens_per_sample();
  // Note [elastic training]: the position a regroup goes on from.
  r.position.step = step;
  r.position.reports = 0;
  r.position.cursor += global;
  r.position.micro_batches = e.micro_batches;
  r.last_loss = last_loss;
  return step;
}

// The reports due after step `step` of `steps` that r.position.reports says are
// not done yet: the --eval-every evaluation, then the --save-every checkpoint.
// After a regroup, those the failure interrupted (Note [elastic training]).
void step_reports(Run& r, EpochState& e, int64_t step, int64_t steps) {
  if (r.position.reports < 1 && r.o.eval_every > 0 && r.step % r.o.eval_every == 0 &&
      step < steps) {
    if (r.step == r.faults.kill_in_eval_step) ::raise(SIGKILL);
    finish_profile(r, "an evaluation follows");
    r.nonfinite->check();
    report(r, measure(r, e), /*epoch_end=*/false, step, e.loss_sum, e.micro_batches);
  }
  r.position.reports = 1;
  if (r.o.save_every > 0 && r.step % r.o.save_every == 0 && step < steps) {
    finish_profile(r, "a checkpoint follows");
    // On every rank (--save-every is kept where --save is not), so no checkpoint
    // holds non-finite weights and every rank stops at the same step.
    r.nonfinite->check();
    r.nonfinite->check_weights(r.step, weights(r));
    save(r, e.epoch, step, e.loss_sum, e.micro_batches);
  }
  r.position.reports = 2;
}

// --profile-steps (docs/profile.md): the op profile from step o.profile_start on,
// started before that step. This process's first steps make plans, caches and
// --cuda-graph's capture: they are never profiled (Note [profiled steps]).
void begin_profile(Run& r) {
  if (r.o.profile_steps == 0 || r.profile_taken) return;
  if (r.profile_from < 0) r.profile_from = first_profiled_step(r.o, r.step, r.graphed != nullptr);
  if (r.step + 1 < r.profile_from) return;
  r.profile_taken = true;
  try {
    if (!profile::enabled()) {
      synchronize(r.device);  // the window's time starts with the device caught up
      profile::start();
      r.profiling = true;
      r.profile_first = r.step + 1;
      return;
    }
  } catch (const ValueError&) {  // another thread of the program started it meanwhile
  }
  if (!r.o.quiet) {  // a program around train_main profiles already
    r.out << "note: --profile-steps: the op profile is already on in this process "
             "(profile::start() of the program); train leaves it to the program\n";
  }
}

// Note [group stop] in collectives/elastic.h: the group's last membership formed
// (fewer ranks were left than ddprun's --min-ranks), the state the most advanced
// rank's. Every rank writes its part of --save where it stands, then stops. The
// save ends with a one-element all_reduce, as a report does (Note [reports
// committed]): no rank exits before the writer has written, so a rank that dies in
// the save fails the others' all_reduce, and they regroup into the stop ddprun
// publishes without it and save again.
[[noreturn]] void stop_with_group(Run& r, EpochState& e) {
  const ProcessGroup& pg = *r.pg;
  std::string saved = "; no checkpoint: the run has no --save";
  if (!r.o.save_everywhere.empty()) {
    finish_profile(r, "the group stops");
    r.nonfinite->check();
    r.nonfinite->check_weights(r.step, weights(r));
    save(r, e.epoch, e.step, e.loss_sum, e.micro_batches);
    const CollectiveLabel labelled("stop committed");
    Tensor done = zeros({1}, {.device = pg.comm->device()});
    pg.comm->all_reduce(done, ReduceOp::sum)->wait();
    saved = fmt::format(
        "; checkpoint {} written (epoch {}, step {} of it): go on with --resume {} (at any "
        "number of ranks)",
        r.o.save_everywhere, e.epoch + 1, e.step, r.o.save_everywhere);
  }
  if (pg.env.rank != 0) saved = "";  // rank 0 says what it wrote
  const std::string line =
      fmt::format("rank {} (launch rank {}): the group stopped at step {}: {}{}", pg.env.rank,
                  pg.launch_rank, r.step, r.group_stop, saved);
  r.out << line << "\n";
  r.out.flush();
  throw GroupStopped(line);
}

// After step `step` of `steps`, on every rank at the same steps: the progress
// line, the --eval-every report, the --save-every checkpoint, the kill fault.
void after_step(Run& r, EpochState& e, Progress& progress, int64_t step, int64_t steps,
                const Tensor& last_loss) {
  if (r.o.log_every > 0 ? step % r.o.log_every == 0 : step % 10 == 0 || step == steps) {
    const float shown = last_loss.item<float>() * static_cast<float>(r.o.grad_accum);
    r.nonfinite->check();  // the device is read here anyway
    const double rate = static_cast<double>(r.task->is_language_model() ? e.tokens : e.samples);
    progress.step(e.epoch + 1, r.o.epochs, step, steps, shown,
                  rate / (seconds_since(e.start) - e.eval_s));
  }
  step_reports(r, e, step, steps);
  // A replacement that DDP_TEST_JOIN_AT takes in at this very step joins first (the
  // kill comes once the group it joins has formed, in rejoin()): the schedule a test
  // replays ("joined after s, then these ranks died after s") must not depend on
  // whether ddprun sees the deaths or the join first.
  if (r.step == r.faults.kill_step && r.step != r.join_at_step) ::raise(SIGKILL);
  check_membership(r);  // a replacement joining (Note [elastic membership])
}

}  // namespace

EpochMetrics train_epoch(Run& r, int64_t epoch) {
  EpochState e;
  e.epoch = epoch;
  Progress progress(r.o, r.out, r.task->is_language_model() ? "tokens" : "samples");
  const int rank = r.pg ? r.pg->env.rank : 0;
  // After a regroup (Note [elastic training] in elastic.h): the epoch goes on from
  // the most advanced rank's position, the rest of its samples shared out anew.
  std::optional<EpochPosition> at;
  if (r.rejoin_at && r.rejoin_at->epoch == epoch) at = r.rejoin_at;
  r.rejoin_at.reset();
  if (!at) at = resumed_after_regroup(r, epoch, rank);
  if (at) {
    r.task->start_epoch_at(epoch, at->cursor);
  } else {
    r.task->start_epoch(epoch);
  }
  const int64_t offset = at ? at->step : 0;  // the steps `plan` does not count
  const EpochSteps plan = at ? rest_of_epoch(*r.task, r.o, rank, r.world_size, offset)
                             : epoch_steps(*r.task, r.o, rank, r.world_size);
  if (at) note_schedule_span(r, epoch, plan.steps);  // after a regroup, on rank 0
  if (plan.uneven && r.ddp) {
    JoinOptions join_options;
    join_options.divide_by_initial_world_size = r.o.join_divide == JoinDivide::world;
    r.join = std::make_unique<Join>(*r.ddp, join_options);
  }
  const auto rows = [&r](int q, int64_t b) { return r.task->batch_rows(q, b); };
  e.loss_sum = zeros({}, {.device = r.device});
  Tensor step_loss, last_loss;
  if (at) {
    fill_(e.loss_sum, static_cast<double>(at->loss_sum_value));
    e.micro_batches = at->micro_batches;
    e.first_step = offset;
  } else {
    e.first_step = resume_in_epoch(r, epoch, e.loss_sum, e.micro_batches);
  }
  e.step = e.first_step;
  r.position = EpochPosition{.epoch = epoch,
                             .step = e.step,
                             .cursor = at ? at->cursor : 0,
                             .loss_sum = e.loss_sum,
                             .micro_batches = e.micro_batches,
                             .reports = at ? at->reports : 2};
  // A checkpoint's mid-epoch position: the samples its steps took.
  if (!at) r.position.cursor = positions_taken(r, plan, e.first_step);
  const int64_t steps = offset + plan.steps;
  // After a regroup: the reports of the step the group went on from that the
  // failure interrupted (Note [elastic training]).
  if (at && at->step > 0 && at->reports < 2) step_reports(r, e, at->step, steps);
  e.straggler.start();
  // After a regroup --early-stop may already have decided (in a report taken
  // again, or before the epoch's report the group takes again): no more steps.
  while (e.step < steps && !r.stop_early) {
    if (!r.group_stop.empty()) stop_with_group(r, e);
    const int64_t skipped_before = r.nonfinite->skipped();
    begin_profile(r);
    int64_t used = 0;
    if (r.join != nullptr && e.step - offset >= plan.mine) {
      // Not a step for the flight recorder's marks (Note [uneven epochs]).
      shadow_step(r, step_loss, last_loss, e.t, epoch);
    } else {
      flight::mark_step_begin();  // Note [straggler report]
      used = train_step(r, step_loss, last_loss, e.t, epoch);
      flight::mark_step_end();
      if (used == 0) break;
    }
    const int64_t global = step_samples(plan, e.step - offset, r.o.grad_accum, rows);
    const int64_t step = count_step(r, e, used, global, skipped_before, step_loss, last_loss);
    if (r.failed_after_update) std::rethrow_exception(std::exchange(r.failed_after_update, {}));
    if (r.profiling && r.step - r.profile_first + 1 >= r.o.profile_steps) finish_profile(r);
    after_step(r, e, progress, step, steps, last_loss);
    if (r.stop_early) break;  // --early-stop, decided alike on every rank
  }
  finish_profile(r, "the epoch ended");  // before its evaluation and checkpoint
  if (r.join) {
    r.join->finish();  // every rank is out of data: the last joiner's model everywhere
    r.join.reset();
  }
  r.nonfinite->check();
  // Before the epoch's checkpoint, and after the run's last step: a run without
  // --save does not end with exit 0 and non-finite weights either.
  r.nonfinite->check_weights(r.step, weights(r));
  r.loss_log->flush();
  return measure(r, e);
}

int64_t first_profiled_step(const TrainOptions& o, int64_t process_start, bool graphed) {
  const int64_t warm = graphed ? kEagerSteps + 1 : 2;  // + the capture
  return std::max(o.profile_start, process_start + warm + 1);
}

void finish_profile(Run& r, std::string_view cut, bool print) {
  if (!r.profiling) return;
  r.profiling = false;
  if (!profile::enabled()) return;  // the program stopped it
  profile::Report report;
  try {
    report = profile::stop();    // waits for the device
  } catch (const ValueError&) {  // the program stopped it meanwhile
    return;
  }
  if (!print || r.o.quiet) return;
  const int64_t steps = r.step - r.profile_first + 1;
  if (steps <= 0) {
    r.out << fmt::format("profile: no step profiled ({} before step {})\n", cut, r.profile_first);
    return;
  }
  const double wall = report.wall_ms, ops = report.ops_ms();
  const char* plural = steps == 1 ? "" : "s";
  r.out << fmt::format(
      "profile: steps {}-{} ({} step{} of {:.2f} ms{}; docs/profile.md): the ops {:.2f} ms a "
      "step ({:.0f}%), outside any op {:.2f} ms; totals over the {} step{}\n",
      r.profile_first, r.step, steps, plural, wall / static_cast<double>(steps),
      steps < r.o.profile_steps ? fmt::format(", cut short of {}", r.o.profile_steps) : "",
      ops / static_cast<double>(steps), wall > 0 ? 100.0 * ops / wall : 0.0,
      (wall - ops) / static_cast<double>(steps), steps, plural);
  if (steps < r.o.profile_steps) {
    r.out << fmt::format("profile: cut short after step {}: {} (docs/profile.md)\n", r.step, cut);
  }
  r.out << profile::format_table(report.ops, wall, 15) << "by op:\n"
        << profile::format_table(report.by_op(), wall, 0);
  if (report.dropped > 0) {
    r.out << fmt::format("profile: {} op(s) not recorded, the first because: {}\n", report.dropped,
                         report.first_error);
  }
}

namespace {

// Note [best so far]: --save-best and --early-stop watch one metric, the one each
// report line leads with: test_acc (higher is better) for classification,
// test_loss for a regression, val_loss for a language model (lower is better). An
// evaluation improves on the best only when strictly better (ties and NaN do not:
// Keras' EarlyStopping and Lightning's ModelCheckpoint with min_delta 0). Every rank
// evaluates the same all-reduced value, so every rank decides alike: the gather for
// a ZeRO checkpoint and the early stop happen on all of them at one step. The best
// value and the count since travel in --save's checkpoints, so a resumed run keeps
// its patience. The best checkpoint is a whole --save-form checkpoint (resumable);
// it replaces the previous best whatever its step (the best is not the latest).
struct Monitored {
  double value;
  bool higher_is_better;
  const char* name;
};
Monitored monitored(const EpochMetrics& m) {
  if (m.language) return {m.val_loss, false, "val_loss"};
  if (m.regression) return {m.test_loss, false, "test_loss"};
  return {m.test_acc, true, "test_acc"};
}

bool track_best(Run& r, const Monitored& now) {
  const bool improved =
      std::isfinite(now.value) &&
      (std::isnan(r.best_metric) ||
       (now.higher_is_better ? now.value > r.best_metric : now.value < r.best_metric));
  if (improved) {
    r.best_metric = now.value;
    r.evals_since_best = 0;
  } else {
    ++r.evals_since_best;
  }
  return improved;
}

void save_best(Run& r, int64_t completed, int64_t epoch_step, const Tensor& loss_sum,
               int64_t loss_count) {
  if (r.zero != nullptr) r.zero->gather_state();  // collective: rank 0 writes it
  if (r.pg != nullptr && r.pg->env.rank != 0) return;
  const trace::Span span("checkpoint", "train", {{"step", r.step}, {"best", 1}});
  const CheckpointInfo info = position(r, completed, epoch_step, loss_sum, loss_count);
  save_checkpoint(r.o.save_best, *r.model, *r.optimizer, info, nullptr, /*never_older=*/false);
  r.saved_best = true;
}

}  // namespace

// Note [reports committed]: under --on-failure continue a report ends with a
// one-element all_reduce, so no rank completes it before the writer has written
// its row and checkpoint. Without it, a writer that died inside the report while
// the others completed it lost both (at the last epoch's end, the final --save):
// the group went on from past the report. Now the others fail there too and the
// group takes the report again after the regroup (the position counts a report
// done only once report() returned). Taking it again must not count the
// evaluation twice, so the best so far as the report found it is kept until the
// all_reduce (Run::report_in_flight); the source of a regroup sends it instead of
// its own (elastic.cpp), and the writer drops an evaluation row of that step
// that a rank wrote before (take_over_writing). DDP_TEST_KILL_IN_REPORT kills a
// rank right after its row.
// The metrics row first, so the checkpoint never covers a row not on disk.
void report(Run& r, const EpochMetrics& m, bool epoch_end, int64_t epoch_step,
            const Tensor& loss_sum, int64_t loss_count) {
  const TrainOptions& o = r.o;
  if (r.elastic) r.report_in_flight = {r.best_metric, r.evals_since_best, r.stop_early};
  r.metrics->write(m, r.step, r.world_size, r.mode);
  if (r.step == r.faults.kill_in_report_step) ::raise(SIGKILL);
  const Monitored now = monitored(m);
  const bool improved = track_best(r, now);
  // At an epoch's end the position is the next epoch's start.
  const int64_t completed = epoch_end ? m.epoch : m.epoch - 1;
  if (improved && !o.save_best.empty()) {
    save_best(r, completed, epoch_end ? 0 : epoch_step, loss_sum, loss_count);
  }
  if (epoch_end) save(r, m.epoch, 0, Tensor(), 0);
  if (!o.quiet) r.out << report_line(m, o, r.step, r.mode);
  if (!o.quiet && improved && !o.save_best.empty()) {
    r.out << fmt::format("best {} so far ({:.4f}): saved {}\n", now.name, now.value, o.save_best);
  }
  if (o.early_stop > 0 && r.evals_since_best >= o.early_stop && !r.stop_early) {
    r.stop_early = true;
    if (!o.quiet) {
      r.out << fmt::format(
          "early stop: {} has not improved on its best {:.4f} in {} evaluation{}; stopping at "
          "step {}\n",
          now.name, r.best_metric, r.evals_since_best, r.evals_since_best == 1 ? "" : "s", r.step);
    }
  }
  if (r.elastic) {  // Note [reports committed]
    const CollectiveLabel labelled("report committed");
    Tensor done = zeros({1}, {.device = r.pg->comm->device()});
    r.pg->comm->all_reduce(done, ReduceOp::sum)->wait();
    r.report_in_flight.reset();
  }
}

}  // namespace ddp::train
