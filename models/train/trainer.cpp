#include "models/train/trainer.h"

#include "collectives/bootstrap.h"
#include "collectives/collective_events.h"
#include "collectives/data_parallel/data_parallel.h"
#include "collectives/ddp/distributed_data_parallel.h"
#include "collectives/ddp/join.h"
#include "collectives/flight/flight_recorder.h"
#include "collectives/trace_collectives.h"
#include "models/train/checkpoint.h"
#include "models/train/faults.h"
#include "models/train/nonfinite.h"
#include "models/train/progress.h"
#include "models/train/run_log.h"
#include "models/train/straggler_stats.h"
#include "models/train/task.h"
#include "models/train/uneven.h"
#include "runtime/autograd/functions.h"
#include "runtime/logging.h"
#include "runtime/ops/ops.h"
#include "runtime/stream.h"
#include "runtime/trace.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <thread>

namespace ddp::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Run {
  const TrainOptions& o;
  std::ostream& out;
  Device device;
  std::unique_ptr<Task> task{};
  std::shared_ptr<nn::Module> model{};
  std::unique_ptr<optim::Optimizer> optimizer{};
  optim::LrSchedule schedule{};
  int64_t first_epoch = 0;
  // World size > 1 only (launched by ddprun, mpirun, srun): the process group and
  // the model wrapped in DistributedDataParallel.
  ProcessGroup* pg = nullptr;
  std::unique_ptr<DistributedDataParallel> ddp{};
  int world_size = 1;
  std::string mode = "single";  // single | ddp | dp
  // --mode dp: the model wrapped in DataParallel over --devices (device = devices[0]).
  std::unique_ptr<DataParallel> dp{};
  // Where the run stands (Note [resume mid-epoch] in checkpoint.cpp).
  int64_t step = 0;          // training steps of the whole run, skipped ones included
  CheckpointInfo resumed{};  // epoch, epoch_step and epoch_loss_sum to start from
  bool did_resume = false;
  std::unique_ptr<MetricsLog> metrics{};
  std::unique_ptr<LossLog> loss_log{};
  std::unique_ptr<NonfiniteCheck> nonfinite{};
  TestFaults faults{};
  // --clip-grad-norm: the last update's gradient norm before clipping (NaN: none yet).
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  // --drop-last false with uneven step counts: the epoch's Join (Note [uneven epochs]).
  std::unique_ptr<Join> join{};
};

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

// One training step: o.grad_accum micro-batches (under DDP all but the last run
// under no_sync()), each loss scaled by 1 / grad_accum so the gradient is the
// mean over the step's samples; then the non-finite check and the optimizer's
// update, unless the check skips it. Returns the samples this rank used (0: the
// loader ran out). `step_loss` gets the step's loss (the sum of its micro-batches').
// shadow: this rank is out of data (Note [uneven epochs] in uneven.h): it shadows
// the step of the ranks that train, then updates with their average (0 samples).
int64_t train_step(Run& r, Tensor& step_loss, Tensor& last_loss, PhaseTotals& t, int64_t epoch,
                   bool shadow) {
  const int64_t k = r.o.grad_accum;
  const int64_t step = r.step + 1;
  PhaseClock clock(r.device, r.o.sync_timing);
  const trace::Span step_span("step", "train", {{"step", step}});  // Note [timeline]
  trace::Phases phase("train", r.device);
  r.optimizer->zero_grad(/*set_to_none=*/true);  // backward then hands .grad its fresh tensors
  int64_t samples = 0;
  step_loss = Tensor();
  Batch batch;
  for (int64_t m = 0; m < k && !shadow; ++m) {
    phase.next("data wait");
    if (!r.task->next(batch)) return 0;
    t.data += clock.lap();
    phase.next("forward", {{"micro_batch", m}});
    const bool sync = m + 1 == k;
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
    if (k > 1) loss = functional::scale(loss, 1.0f / static_cast<float>(k));
    if (sync && step == r.faults.nan_step) {
      loss = functional::scale(loss, std::numeric_limits<float>::quiet_NaN());
    }
    t.forward += clock.lap();
    phase.next("backward", {{"micro_batch", m}});
    backward(loss);
    t.backward += clock.lap();
    if (r.ddp && sync) {
      phase.next("grad sync (exposed)");
      r.ddp->finish_backward();  // every .grad now holds the average over ranks
      t.exposed += clock.lap();
      t.comm += r.ddp->comm_stats().comm_s;
    }
    {
      NoGradGuard no_grad;
      const Tensor unscaled = k > 1 ? scale(loss, static_cast<float>(k)) : loss;
      step_loss = step_loss.defined() ? add(step_loss, unscaled) : unscaled;
    }
    last_loss = loss;
    samples += batch.labels.size(0);
  }
  if (shadow) {
    phase.next("join shadow");  // out of data: the others' gradient sync, with zeros
    const bool shadowed = r.join->shadow_step();
    DDP_ASSERT(shadowed, "step {}: no rank trains, yet rank 0 has data", step);
    t.exposed += clock.lap();
    t.comm += r.ddp->comm_stats().comm_s;
    step_loss = zeros({}, {.device = r.device});  // finite: the check counts others' losses
    if (!last_loss.defined()) last_loss = step_loss;
  }
  phase.next("optimizer");
  if (!r.nonfinite->after_backward(step, epoch + 1, step_loss, r.model->parameters())) {
    // After DDP's all_reduce has been waited for: every rank clips the same
    // averaged gradients by the same norm.
    if (r.o.clip_grad_norm > 0) {
      r.grad_norm = optim::clip_grad_norm_(r.model->parameters(), r.o.clip_grad_norm);
    }
    r.optimizer->set_lr(r.schedule.lr_at(r.optimizer->steps()));
    r.optimizer->step();
  }
  t.optimizer += clock.lap();
  return samples;
}

// Writes --save (rank 0; the others have no --save) for the run as it stands:
// `completed` epochs done and `epoch_step` steps into the next one. Every rank
// has checked the weights just before (NonfiniteCheck::check_weights).
void save(Run& r, int64_t completed, int64_t epoch_step, const Tensor& loss_sum,
          int64_t loss_count) {
  if (r.o.save.empty()) return;
  const trace::Span span("checkpoint", "train", {{"step", r.step}});
  r.loss_log->flush();  // Note [rows cut back] in run_log.cpp
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
  std::vector<std::string> removed;
  save_checkpoint(r.o.save, *r.model, *r.optimizer, info, &removed);
  for (const auto& f : removed) {
    if (!r.o.quiet) r.out << "removed " << f << ", left by a save that did not finish\n";
  }
}

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
  m.train_loss =
      e.micro_batches == 0 ? 0.0 : e.loss_sum.item<float>() / static_cast<double>(e.micro_batches);
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
  const auto eval_start = Clock::now();
  Evaluation ev;
  {
    const trace::Span span("evaluation", "train", {{"step", r.step}});
    ev = r.task->evaluate(*r.model, r.pg ? r.pg->comm.get() : nullptr);
  }
  e.eval_s += seconds_since(eval_start);
  m.test_acc = ev.accuracy;
  m.language = r.task->is_language_model();
  m.val_loss = ev.loss;
  m.val_bpb = ev.loss / std::log(2.0);
  m.grad_norm = r.grad_norm;
  const CorpusEntropy entropy = r.task->corpus_entropy();
  m.unigram_bits = entropy.unigram_bits;
  m.bigram_bits = entropy.bigram_bits;
  m.time_s = seconds_since(e.start);
  return m;
}

void report(Run& r, const EpochMetrics& m, bool epoch_end);

// After a training step that used `used` samples on this rank and `global` on all
// ranks: the counts, the epoch's loss sum (a skipped or shadowed step's loss left
// out) and the loss log. Returns the step's number in the epoch.
int64_t count_step(Run& r, EpochState& e, int64_t used, int64_t global, int64_t skipped_before,
                   const Tensor& step_loss, const Tensor& last_loss) {
  const int64_t step = ++e.step;
  ++r.step;
  if (r.step == r.faults.nan_weight_step) {
    NoGradGuard no_grad;
    fill_(r.model->parameters().front(), std::numeric_limits<double>::quiet_NaN());
  }
  if (r.nonfinite->skipped() == skipped_before && used > 0) {
    NoGradGuard no_grad;
    axpy_(1.0f, step_loss, e.loss_sum);
    e.micro_batches += r.o.grad_accum;
  }
  r.loss_log->step(e.epoch + 1, step, last_loss, r.o.grad_accum);
  e.samples += global;
  e.tokens += global * r.task->tokens_per_sample();
  return step;
}

EpochMetrics train_epoch(Run& r, int64_t epoch) {
  EpochState e;
  e.epoch = epoch;
  Progress progress(r.o, r.out, r.task->is_language_model() ? "tokens" : "samples");
  r.task->start_epoch(epoch);
  const EpochSteps plan = epoch_steps(*r.task, r.o, r.pg ? r.pg->env.rank : 0, r.world_size);
  const int64_t steps = plan.steps;
  if (plan.uneven && r.ddp) {
    JoinOptions join_options;
    join_options.divide_by_initial_world_size = r.o.join_divide == "world";
    r.join = std::make_unique<Join>(*r.ddp, join_options);
  }
  e.loss_sum = zeros({}, {.device = r.device});
  Tensor step_loss, last_loss;
  e.first_step = resume_in_epoch(r, epoch, e.loss_sum, e.micro_batches);
  e.step = e.first_step;
  e.straggler.start();
  while (e.step < steps) {
    const int64_t skipped_before = r.nonfinite->skipped();
    const bool shadow = r.join != nullptr && e.step >= plan.mine;
    const int64_t global =
        r.task->global_samples(e.step * r.o.grad_accum, (e.step + 1) * r.o.grad_accum);
    flight::mark_step_begin();  // Note [straggler report]
    const int64_t used = train_step(r, step_loss, last_loss, e.t, epoch, shadow);
    flight::mark_step_end();
    if (used == 0 && !shadow) break;
    const int64_t step = count_step(r, e, used, global, skipped_before, step_loss, last_loss);
    if (r.o.log_every > 0 ? step % r.o.log_every == 0 : step % 10 == 0 || step == steps) {
      const float shown = last_loss.item<float>() * static_cast<float>(r.o.grad_accum);
      r.nonfinite->check();  // the device is read here anyway
      const double rate = static_cast<double>(r.task->is_language_model() ? e.tokens : e.samples);
      progress.step(epoch + 1, r.o.epochs, step, steps, shown,
                    rate / (seconds_since(e.start) - e.eval_s));
    }
    if (r.o.eval_every > 0 && r.step % r.o.eval_every == 0 && step < steps) {
      r.nonfinite->check();
      report(r, measure(r, e), /*epoch_end=*/false);
    }
    if (r.o.save_every > 0 && r.step % r.o.save_every == 0 && step < steps) {
      // On every rank (--save-every is kept where --save is not), so no checkpoint
      // holds non-finite weights and every rank stops at the same step.
      r.nonfinite->check();
      r.nonfinite->check_weights(r.step, r.model->parameters());
      save(r, epoch, step, e.loss_sum, e.micro_batches);
    }
    if (r.step == r.faults.kill_step) ::raise(SIGKILL);
  }
  if (r.join) {
    r.join->finish();  // every rank is out of data: the last joiner's model everywhere
    r.join.reset();
  }
  r.nonfinite->check();
  // Before the epoch's checkpoint, and after the run's last step: a run without
  // --save does not end with exit 0 and non-finite weights either.
  r.nonfinite->check_weights(r.step, r.model->parameters());
  r.loss_log->flush();
  return measure(r, e);
}

}  // namespace

// Note [schedule span]: cosine
// spans the steps the run takes, --max-steps included (it stops every epoch
// there), so a short run decays fully rather than stopping near the peak.
optim::LrSchedule make_schedule(const TrainOptions& o, int64_t micro_batches) {
  const int64_t available = micro_batches / o.grad_accum;
  const int64_t steps_per_epoch = o.max_steps > 0 ? std::min(o.max_steps, available) : available;
  optim::LrSchedule s;
  s.kind = optim::LrSchedule::parse_kind(o.lr_schedule);
  s.base_lr = o.lr;
  s.step_size = 3 * steps_per_epoch;
  s.gamma = 0.1f;
  s.total_steps = o.epochs * steps_per_epoch;
  s.warmup_steps = o.auto_warmup ? std::min<int64_t>(100, s.total_steps / 10) : o.warmup_steps;
  s.min_lr = o.lr * o.min_lr_fraction;
  return s;
}

Device resolve_device(const std::string& text) {
  if (text == "auto") return default_device();
  const Device d = Device::parse(text);
  check_available(d);
  return d;
}

namespace {

// Metrics, checkpoint (epoch_end) and the report line (each only where the options
// ask for it). The metrics row goes first, so the checkpoint never covers a row not
// on disk (Note [rows cut back] in run_log.cpp).
void report(Run& r, const EpochMetrics& m, bool epoch_end) {
  const TrainOptions& o = r.o;
  r.metrics->write(m, r.step, r.world_size, r.mode);
  if (epoch_end) save(r, m.epoch, 0, Tensor(), 0);
  if (!o.quiet) r.out << report_line(m, o, r.step, r.mode);
}

// The checkpoint to resume from: --resume PATH, or with --resume auto the --save
// file when every rank sees one ("" when none does: a fresh start). Every rank
// must find the same step, or they would train from different states.
std::string resume_path(const TrainOptions& o, ProcessGroup* pg) {
  if (o.resume != "auto") return o.resume;
  const auto header = read_checkpoint_header(o.save);
  const int64_t found = header ? header->step : -1;
  if (pg != nullptr && pg->env.world_size > 1) {
    Tensor v = from_vector<int64_t>({found, -found}, {2},
                                    {.dtype = DType::i64, .device = pg->comm->device()});
    const CollectiveLabel labelled("resume step check");
    pg->comm->all_reduce(v, ReduceOp::max)->wait();
    const auto most = v.to_vector<int64_t>();
    DDP_CHECK(most[0] == -most[1],
              "--resume auto: rank {} finds {} in {}, but the ranks disagree (steps {} to {}; -1: "
              "no file); --save must be on a file system every rank reads",
              pg->env.rank, found < 0 ? "no checkpoint" : fmt::format("step {}", found), o.save,
              -most[1], most[0]);
  }
  if (found >= 0) return o.save;
  if (!o.quiet && (pg == nullptr || pg->env.rank == 0)) {
    fmt::print("no checkpoint at {} yet: starting fresh\n", o.save);
  }
  return "";
}

// Loads `path` ("" for none) into the run and checks a mid-epoch position fits
// this run's data order (Note [resume mid-epoch] in checkpoint.cpp).
void resume(Run& r, const std::string& path) {
  const TrainOptions& o = r.o;
  if (!path.empty()) {
    r.resumed = load_checkpoint(path, *r.model, *r.optimizer, r.task->model_spec());
    r.did_resume = true;
    r.first_epoch = r.resumed.epoch;
    r.step = r.resumed.step;
    const int64_t global_batch = o.batch_size * o.grad_accum * r.world_size;
    DDP_CHECK(r.resumed.epoch_step == 0 ||
                  (r.resumed.seed == o.seed && r.resumed.global_batch == global_batch),
              "{}: the checkpoint stopped in the middle of epoch {} with --seed {} and a global "
              "batch of {} (--batch-size x --grad-accum x ranks); this run has --seed {} and {}, "
              "so its data order differs. Resume with the same values",
              path, r.resumed.epoch + 1, r.resumed.seed, r.resumed.global_batch, o.seed,
              global_batch);
    // The schedule's span is counted in steps of the global batch; another batch
    // would rescale it mid-run (older files record none: 0).
    DDP_CHECK(r.resumed.global_batch == 0 || r.resumed.global_batch == global_batch ||
                  r.schedule.kind == optim::LrSchedule::Kind::constant,
              "{}: the checkpoint was written with a global batch of {} (--batch-size x "
              "--grad-accum x ranks), this run has {}: the --lr-schedule {} would be rescaled to "
              "the new steps per epoch. Resume with the same values, or pass --lr-schedule "
              "constant",
              path, r.resumed.global_batch, global_batch, o.lr_schedule);
    if (!o.quiet) {
      r.out << fmt::format("resumed from {} at step {} (epoch {}, step {} of it)\n", path,
                           r.resumed.step, r.resumed.epoch + 1, r.resumed.epoch_step);
    }
  }
  // Note [never older]: found now rather than at the first save.
  if (const auto existing = o.save.empty() ? std::nullopt : read_checkpoint_header(o.save)) {
    DDP_CHECK(existing->step <= r.step,
              "--save {} already holds a checkpoint at step {} (epoch {}), later than this run's "
              "start (step {}{}); pass --resume auto to continue from it, or remove it (or choose "
              "another --save path) to start over",
              o.save, existing->step, existing->epoch, r.step,
              path.empty() ? "" : ", from " + path);
  }
}

// --metrics and --loss-log; with --resume (a fresh start under auto included) cut
// back to where the run starts (Note [rows cut back] in run_log.cpp).
void open_logs(Run& r) {
  std::optional<RunPosition> start;
  if (r.did_resume) {
    start = RunPosition{r.resumed.step, r.resumed.epoch, r.resumed.epoch_step};
  } else if (!r.o.resume.empty()) {
    start = RunPosition{};
  }
  r.metrics = std::make_unique<MetricsLog>(r.o.metrics, start);
  r.loss_log = std::make_unique<LossLog>(r.o.loss_log, start);
  const int64_t cut_metrics = r.metrics->rows_cut(), cut_losses = r.loss_log->rows_cut();
  if (!r.o.quiet && cut_metrics + cut_losses > 0) {
    r.out << fmt::format(
        "cut {} --metrics and {} --loss-log rows beyond step {}: they are "
        "written again\n",
        cut_metrics, cut_losses, start->step);
  }
}

// ", warmup 100, cosine to 0.0001 over 5000 steps, clip 1" for the header line.
std::string schedule_summary(const TrainOptions& o, const optim::LrSchedule& s) {
  std::string text = s.kind == optim::LrSchedule::Kind::cosine
                         ? fmt::format(" (warmup {}, cosine to {:.3g} over {} steps)",
                                       s.warmup_steps, s.min_lr, s.total_steps)
                         : fmt::format(" ({})", o.lr_schedule);
  if (o.optimizer == "adamw") {
    text += fmt::format(", betas {} {}, weight decay {} (2-D weights)", o.beta1, o.beta2,
                        o.weight_decay);
  }
  text += o.clip_grad_norm > 0 ? fmt::format(", clip {}", o.clip_grad_norm) : ", no clip";
  return text;
}

// pg: null for a single process.
// resume_from: resume_path()'s answer.
TrainResult run_on_rank(const TrainOptions& o, std::ostream& out, ProcessGroup* pg,
                        const std::string& resume_from) {
  const auto start = Clock::now();
  const bool dp = pg == nullptr && o.mode == "dp";
  const std::vector<Device> dp_devices = dp ? parse_device_list(o.devices) : std::vector<Device>{};
  if (dp) check_data_parallel_devices(dp_devices);  // before the data and the model
  Run r{.o = o,
        .out = out,
        .device = pg   ? pg->device
                  : dp ? dp_devices.front()
                       : resolve_device(o.device)};
  r.pg = pg;
  r.world_size = pg ? pg->env.world_size : 1;
  r.mode = pg ? "ddp" : dp ? "dp" : "single";
  const int rank = pg ? pg->env.rank : 0;
  r.task = make_task(o, r.device, rank, r.world_size);
  r.model = r.task->model();
  r.optimizer = r.task->make_optimizer(o);
  r.schedule = make_schedule(o, r.task->num_batches_of(0));  // rank 0 has the most
  resume(r, resume_from);
  open_logs(r);
  r.nonfinite = std::make_unique<NonfiniteCheck>(
      o.on_nonfinite, r.device, pg ? pg->comm.get() : nullptr, rank, r.resumed.skipped_steps);
  r.faults = TestFaults::from_env(rank);
  // After a resume, so every rank starts from the same (rank 0's) values.
  if (pg != nullptr) {
    DdpOptions ddp_options;
    ddp_options.bucket_cap_mb = o.bucket_cap_mb;
    ddp_options.first_bucket_mb = std::min(1.0, o.bucket_cap_mb);
    ddp_options.comm_hook = parse_comm_hook(o.comm_hook);
    ddp_options.gradient_as_bucket_view = true;  // Note [writing gradients back] in reducer.cpp
    const CommHook hook = ddp_options.comm_hook;
    if (r.faults.skip_allreduce_step > 0) ddp_options.comm_hook = CommHook::none;
    r.ddp = std::make_unique<DistributedDataParallel>(r.model, pg->comm, ddp_options);
    if (r.faults.skip_allreduce_step > 0)
      r.ddp->register_comm_hook(skip_allreduce_hook(r.faults.skip_allreduce_step, hook));
  }
  if (dp) r.dp = std::make_unique<DataParallel>(r.model, dp_devices);
  TrainResult result{{}, r.device, r.model->num_parameters(), 0, rank, r.world_size, r.mode};
  if (!o.quiet) {
    out << fmt::format(
        "train: {} ({} parameters) on {}, {}, batch {}{}, {} lr {}{}{}\n", r.task->model_spec(),
        result.num_parameters, r.device.str(), r.task->data_summary(), o.batch_size,
        o.grad_accum > 1 ? fmt::format(" x {} accumulated", o.grad_accum) : "", o.optimizer, o.lr,
        r.task->is_language_model() ? schedule_summary(o, r.schedule) : "",
        r.ddp  ? fmt::format(", ddp over {} ranks ({} backend, {} bucket(s), comm hook {})",
                             r.world_size, pg->comm->backend(), r.ddp->buckets().size(), o.comm_hook)
        : r.dp ? fmt::format(", dp over {} replicas ({})", dp_devices.size(), o.devices)
               : "");
  }
  if (!o.quiet) out << describe_uneven(*r.task, o, r.world_size);
  for (int64_t epoch = r.first_epoch; epoch < o.epochs; ++epoch) {
    result.epochs.push_back(train_epoch(r, epoch));
    report(r, result.epochs.back(), /*epoch_end=*/true);
  }
  result.total_s = seconds_since(start);
  result.steps = r.step;
  return result;
}

// What the trace merge did (finish_trace), for the rank that did it.
void report_trace(const std::string& merged, const TrainOptions& o, std::ostream& out) {
  if (!merged.empty() && !o.quiet) out << "trace: " << merged << "\n";
}

// Up-front validation (rank 0 writes the files): an unwritable --save, --metrics
// or --loss-log path fails before the data is loaded, not after the first epoch.
void check_output_paths(const TrainOptions& o) {
  if (!o.save.empty()) check_can_create("--save", o.save);
  if (!o.metrics.empty()) open_for_append("--metrics", o.metrics);
  if (!o.loss_log.empty()) open_for_append("--loss-log", o.loss_log);
}

}  // namespace

// Note [distributed train]: with WORLD_SIZE > 1 (ddprun, mpirun, srun) every rank
// trains on its DistributedSampler shard with the model in DistributedDataParallel;
// rank 0 alone prints, writes metrics and saves; samples_per_s counts all ranks and
// test accuracy sums every rank's shard (the sampler pads the test set to a multiple
// of the world size, so up to world_size - 1 samples count twice).
//
// --mode: auto is ddp when WORLD_SIZE > 1, else single; ddp alone (world size 1)
// runs DistributedDataParallel over the local backend (its overhead, measurable);
// single and dp under a launcher are errors (every rank would train alone).
TrainResult run_training(const TrainOptions& o, std::ostream& out) {
  const int world_size = read_launch_env().world_size;
  const std::string mode = o.mode == "auto" ? (world_size > 1 ? "ddp" : "single") : o.mode;
  DDP_CHECK(mode == "ddp" || world_size <= 1,
            "--mode {} under a launcher with WORLD_SIZE={}: every rank would train its own "
            "model. Use --mode ddp (the default there), or run train without ddprun/mpirun",
            mode, world_size);
  if (read_launch_env().rank == 0) check_output_paths(o);
  if (mode == "single" || mode == "dp") {
    TrainResult result = run_on_rank(o, out, nullptr, resume_path(o, nullptr));
    report_trace(finish_trace(nullptr), o, out);  // Note [timeline]
    return result;
  }
  ProcessGroupOptions pg_options;
  pg_options.device = o.device == "auto" ? "" : o.device;
  pg_options.backend = o.backend;
  ProcessGroup pg = init_process_group(pg_options);
  const std::string resume_from = resume_path(o, &pg);  // before the other ranks drop --save
  TrainOptions mine = o;
  if (pg.env.rank != 0) {
    mine.quiet = true;
    mine.save.clear();
    mine.metrics.clear();
    mine.loss_log.clear();
  }
  TrainResult result = run_on_rank(mine, out, &pg, resume_from);
  report_trace(finish_trace(&pg), mine, out);  // Note [timeline]
  return result;
}

}  // namespace ddp::train
