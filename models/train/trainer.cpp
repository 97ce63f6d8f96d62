#include "models/train/trainer.h"

#include "collectives/bootstrap.h"
#include "collectives/data_parallel/data_parallel.h"
#include "collectives/ddp/distributed_data_parallel.h"
#include "models/train/checkpoint.h"
#include "models/train/nonfinite.h"
#include "models/train/run_log.h"
#include "runtime/autograd/functions.h"
#include "runtime/data/loader.h"
#include "runtime/logging.h"
#include "runtime/ops/ops.h"
#include "runtime/stream.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>

namespace ddp::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Data {
  Dataset train, test;
};

Data load_data(const TrainOptions& o) {
  if (o.data == "synthetic") {
    SyntheticOptions s{.n = o.synthetic_size, .seed = 1234, .noise = 6.0f, .split = Split::train};
    Data d{make_synthetic(s), {}};
    s.n = std::max<int64_t>(o.synthetic_size / 5, 10);
    s.split = Split::test;
    d.test = make_synthetic(s);
    return d;
  }
  return {load_fashion_mnist(o.data, Split::train), load_fashion_mnist(o.data, Split::test)};
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& o, const nn::Module& model) {
  if (o.optimizer == "adamw") {
    return std::make_unique<optim::AdamW>(
        model.parameters(), optim::AdamWOptions{.lr = o.lr, .weight_decay = o.weight_decay});
  }
  return std::make_unique<optim::SGD>(model.parameters(),
                                      optim::SgdOptions{.lr = o.lr,
                                                        .momentum = o.momentum,
                                                        .weight_decay = o.weight_decay,
                                                        .nesterov = o.nesterov});
}

// micro_batches: the loader's batches per epoch on this rank; the schedule counts
// optimizer steps, grad_accum micro-batches each.
optim::LrSchedule make_schedule(const TrainOptions& o, int64_t micro_batches) {
  const int64_t steps_per_epoch = micro_batches / o.grad_accum;
  optim::LrSchedule s;
  s.kind = optim::LrSchedule::parse_kind(o.lr_schedule);
  s.base_lr = o.lr;
  s.step_size = 3 * steps_per_epoch;
  s.gamma = 0.1f;
  s.warmup_steps = o.warmup_steps;
  s.total_steps = o.epochs * steps_per_epoch;
  return s;
}

// comm (world size > 1): every rank evaluates its shard; correct and total are summed.
double evaluate(nn::Module& model, DataLoader& loader, Communicator* comm) {
  NoGradGuard no_grad;
  model.eval();
  loader.start_epoch(0);
  int64_t correct = 0, total = 0;
  Batch batch;
  while (loader.next(batch)) {
    const auto predicted = argmax(model(batch.inputs), 1).to_vector<int64_t>();
    const auto labels = batch.labels.to_vector<int64_t>();
    for (size_t i = 0; i < labels.size(); ++i) correct += predicted[i] == labels[i] ? 1 : 0;
    total += static_cast<int64_t>(labels.size());
  }
  model.train();
  if (comm != nullptr) {
    Tensor counts = from_vector<int64_t>({correct, total}, {2},
                                         {.dtype = DType::i64, .device = comm->device()});
    comm->all_reduce(counts)->wait();
    const auto summed = counts.to_vector<int64_t>();
    correct = summed[0];
    total = summed[1];
  }
  return total == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(total);
}

class Progress {
 public:
  Progress(const TrainOptions& o, std::ostream& out)
      : out_(out), quiet_(o.quiet), every_(o.log_every), bar_(o.log_every == 0 && isatty(2)) {}
  void step(int64_t epoch, int64_t epochs, int64_t step, int64_t steps, double loss, double rate) {
    if (quiet_) return;
    if (bar_ && (step % 10 == 0 || step == steps)) {
      const int width = 30;
      const int filled = static_cast<int>(width * step / std::max<int64_t>(steps, 1));
      std::fprintf(stderr, "\repoch %lld/%lld [%s%s] %lld/%lld loss %.4f %.0f samples/s ",
                   static_cast<long long>(epoch), static_cast<long long>(epochs),
                   std::string(static_cast<size_t>(filled), '#').c_str(),
                   std::string(static_cast<size_t>(width - filled), '.').c_str(),
                   static_cast<long long>(step), static_cast<long long>(steps), loss, rate);
      if (step == steps) std::fprintf(stderr, "\r%*s\r", 90, "");
    } else if (!bar_ && every_ > 0 && step % every_ == 0) {
      out_ << fmt::format("epoch {} step {}/{} loss {:.4f} {:.0f} samples/s\n", epoch, step, steps,
                          loss, rate);  // stdout is line-buffered (main.cpp)
    }
  }

 private:
  std::ostream& out_;
  bool quiet_;
  int64_t every_;
  bool bar_;
};

// Testing aids (docs/train.md, "Fault injection"): DDP_TEST_KILL_AT=RANK:STEP
// makes that rank SIGKILL itself after training step STEP (and its checkpoint, if
// one is due); DDP_TEST_NAN_AT=RANK:STEP makes its loss NaN at step STEP;
// DDP_TEST_NAN_WEIGHT_AT=RANK:STEP makes a weight NaN after step STEP's update (as
// a non-finite gradient with a finite loss would). RANK * is every rank. All act
// only in a group's first attempt (DDPRUN_RESTART_COUNT unset or 0), so the
// restarted group runs clean.
struct TestFaults {
  int64_t kill_step = -1, nan_step = -1, nan_weight_step = -1;

  static int64_t step_for(const char* name, int rank) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') return -1;
    int r = -1;
    long long step = -1;
    char tail = 0;
    const bool any = value[0] == '*';
    if (any) r = rank;
    DDP_CHECK((any ? std::sscanf(value, "*:%lld%c", &step, &tail) == 1
                   : std::sscanf(value, "%d:%lld%c", &r, &step, &tail) == 2) &&
                  step >= 1,
              "{}='{}': expected RANK:STEP or *:STEP, e.g. 1:7 (a testing aid)", name, value);
    return r == rank ? step : -1;
  }
  static TestFaults from_env(int rank) {
    const char* restart = std::getenv("DDPRUN_RESTART_COUNT");
    if (restart != nullptr && std::string(restart) != "0") return {};
    return {step_for("DDP_TEST_KILL_AT", rank), step_for("DDP_TEST_NAN_AT", rank),
            step_for("DDP_TEST_NAN_WEIGHT_AT", rank)};
  }
};

struct Run {
  const TrainOptions& o;
  std::ostream& out;
  Device device;
  models::ModelConfig config;
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Optimizer> optimizer;
  optim::LrSchedule schedule;
  int64_t first_epoch = 0;
  // World size > 1 only (launched by ddprun, mpirun, srun): the process group and
  // the model wrapped in DistributedDataParallel.
  ProcessGroup* pg = nullptr;
  std::unique_ptr<DistributedDataParallel> ddp;
  int world_size = 1;
  std::string mode = "single";  // single | ddp | dp
  // --mode dp: the model wrapped in DataParallel over --devices (device = devices[0]).
  std::unique_ptr<DataParallel> dp;
  // Where the run stands (Note [resume mid-epoch] in checkpoint.cpp).
  int64_t step = 0;        // training steps of the whole run, skipped ones included
  CheckpointInfo resumed;  // epoch, epoch_step and epoch_loss_sum to start from
  bool did_resume = false;
  std::unique_ptr<MetricsLog> metrics;
  std::unique_ptr<LossLog> loss_log;
  std::unique_ptr<NonfiniteCheck> nonfinite;
  TestFaults faults;
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
int64_t train_step(Run& r, DataLoader& loader, Tensor& step_loss, Tensor& last_loss, PhaseTotals& t,
                   int64_t epoch) {
  const int64_t k = r.o.grad_accum;
  const int64_t step = r.step + 1;
  PhaseClock clock(r.device, r.o.sync_timing);
  r.optimizer->zero_grad(/*set_to_none=*/true);  // backward then hands .grad its fresh tensors
  int64_t samples = 0;
  step_loss = Tensor();
  Batch batch;
  for (int64_t m = 0; m < k; ++m) {
    if (!loader.next(batch)) return 0;
    t.data += clock.lap();
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
    Tensor loss = functional::cross_entropy(logits, batch.labels);
    if (k > 1) loss = functional::scale(loss, 1.0f / static_cast<float>(k));
    if (sync && step == r.faults.nan_step) {
      loss = functional::scale(loss, std::numeric_limits<float>::quiet_NaN());
    }
    t.forward += clock.lap();
    backward(loss);
    t.backward += clock.lap();
    if (r.ddp && sync) {
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
  if (!r.nonfinite->after_backward(step, epoch + 1, step_loss, r.model->parameters())) {
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
  r.loss_log->flush();  // Note [rows cut back] in run_log.cpp
  CheckpointInfo info{models::describe(r.config),
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
int64_t resume_in_epoch(Run& r, DataLoader& loader, int64_t epoch, Tensor& loss_sum,
                        int64_t& loss_count) {
  if (r.resumed.epoch != epoch || r.resumed.epoch_step == 0) return 0;
  const int64_t step = r.resumed.epoch_step;
  r.resumed.epoch_step = 0;  // once
  fill_(loss_sum, static_cast<double>(r.resumed.epoch_loss_sum));
  loss_count = r.resumed.epoch_loss_count;
  Batch skipped;
  for (int64_t b = 0; b < step * r.o.grad_accum; ++b)
    DDP_ASSERT(loader.next(skipped), "batch {}", b);
  return step;
}

EpochMetrics train_epoch(Run& r, DataLoader& loader, DataLoader& test_loader, int64_t epoch) {
  const auto start = Clock::now();
  Progress progress(r.o, r.out);
  loader.start_epoch(epoch);
  const int64_t available = loader.num_batches() / r.o.grad_accum;
  const int64_t steps = r.o.max_steps > 0 ? std::min(r.o.max_steps, available) : available;
  Tensor loss_sum = zeros({}, {.device = r.device});
  Tensor step_loss, last_loss;
  PhaseTotals t;
  int64_t micro_batches = 0, samples = 0;
  const int64_t first_step = resume_in_epoch(r, loader, epoch, loss_sum, micro_batches);
  int64_t step = first_step;
  while (step < steps) {
    const int64_t skipped_before = r.nonfinite->skipped();
    const int64_t used = train_step(r, loader, step_loss, last_loss, t, epoch);
    if (used == 0) break;
    ++step;
    ++r.step;
    if (r.step == r.faults.nan_weight_step) {
      NoGradGuard no_grad;
      fill_(r.model->parameters().front(), std::numeric_limits<double>::quiet_NaN());
    }
    if (r.nonfinite->skipped() == skipped_before) {
      NoGradGuard no_grad;
      axpy_(1.0f, step_loss, loss_sum);
      micro_batches += r.o.grad_accum;
    }
    r.loss_log->step(epoch + 1, step, last_loss, r.o.grad_accum);
    samples += used * r.world_size;  // global samples
    if (r.o.log_every > 0 ? step % r.o.log_every == 0 : step % 10 == 0 || step == steps) {
      const float shown = last_loss.item<float>() * static_cast<float>(r.o.grad_accum);
      r.nonfinite->check();  // the device is read here anyway
      progress.step(epoch + 1, r.o.epochs, step, steps, shown,
                    static_cast<double>(samples) / seconds_since(start));
    }
    if (r.o.save_every > 0 && r.step % r.o.save_every == 0 && step < steps) {
      // On every rank (--save-every is kept where --save is not), so no checkpoint
      // holds non-finite weights and every rank stops at the same step.
      r.nonfinite->check();
      r.nonfinite->check_weights(r.step, r.model->parameters());
      save(r, epoch, step, loss_sum, micro_batches);
    }
    if (r.step == r.faults.kill_step) ::raise(SIGKILL);
  }
  r.nonfinite->check();
  // Before the epoch's checkpoint, and after the run's last step: a run without
  // --save does not end with exit 0 and non-finite weights either.
  r.nonfinite->check_weights(r.step, r.model->parameters());
  r.loss_log->flush();
  synchronize(r.device);
  const double train_s = seconds_since(start);
  EpochMetrics m;
  m.epoch = epoch + 1;
  m.steps = step;
  m.skipped_steps = r.nonfinite->skipped();
  m.lr = r.optimizer->lr();
  m.train_loss =
      micro_batches == 0 ? 0.0 : loss_sum.item<float>() / static_cast<double>(micro_batches);
  m.samples_per_s = static_cast<double>(samples) / train_s;
  // The phases of the steps this process ran (after a resume, not those before it).
  const int64_t ran = step - first_step;
  m.step_ms = ran == 0 ? 0.0 : 1e3 * train_s / static_cast<double>(ran);
  const double per_step = ran == 0 ? 0.0 : 1e3 / static_cast<double>(ran);
  m.data_ms = t.data * per_step;
  m.forward_ms = t.forward * per_step;
  m.backward_ms = t.backward * per_step;
  m.comm_exposed_ms = t.exposed * per_step;
  m.optimizer_ms = t.optimizer * per_step;
  m.comm_ms = t.comm * per_step;
  m.test_acc = evaluate(*r.model, test_loader, r.pg ? r.pg->comm.get() : nullptr);
  m.time_s = seconds_since(start);
  return m;
}

}  // namespace

Device resolve_device(const std::string& text) {
  if (text == "auto") return default_device();
  const Device d = Device::parse(text);
  check_available(d);
  return d;
}

namespace {

// Metrics, checkpoint and the epoch line (each only where the options ask for it).
// The metrics row goes first, so the checkpoint never covers a row not on disk
// (Note [rows cut back] in run_log.cpp).
void report_epoch(Run& r, const EpochMetrics& m) {
  const TrainOptions& o = r.o;
  r.metrics->write(m, r.step, r.world_size, r.mode);
  save(r, m.epoch, 0, Tensor(), 0);
  if (!o.quiet) {
    r.out << fmt::format(
        "epoch {}/{}: train_loss {:.4f} test_acc {:.4f} {:.0f} samples/s {:.3f} ms/step "
        "{:.1f} s{}\n",
        m.epoch, o.epochs, m.train_loss, m.test_acc, m.samples_per_s, m.step_ms, m.time_s,
        r.mode == "single"
            ? ""
            : fmt::format(" (ms: forward {:.3f} backward {:.3f} comm exposed {:.3f} of "
                          "{:.3f} optimizer {:.3f})",
                          m.forward_ms, m.backward_ms, m.comm_exposed_ms, m.comm_ms,
                          m.optimizer_ms));
  }
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
    r.resumed = load_checkpoint(path, *r.model, *r.optimizer, models::describe(r.config));
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

// pg: null for a single process.
// resume_from: resume_path()'s answer.
TrainResult run_on_rank(const TrainOptions& o, std::ostream& out, ProcessGroup* pg,
                        const std::string& resume_from) {
  const auto start = Clock::now();
  const bool dp = pg == nullptr && o.mode == "dp";
  const std::vector<Device> dp_devices = dp ? parse_device_list(o.devices) : std::vector<Device>{};
  if (dp) check_data_parallel_devices(dp_devices);  // before the data and the model
  Run r{o,
        out,
        pg   ? pg->device
        : dp ? dp_devices.front()
             : resolve_device(o.device),
        o.model,
        nullptr,
        nullptr,
        {},
        0,
        pg,
        nullptr,
        pg ? pg->env.world_size : 1,
        pg   ? "ddp"
        : dp ? "dp"
             : "single",
        nullptr,
        0,
        {},
        false,
        nullptr,
        nullptr,
        nullptr,
        {}};
  const int rank = pg ? pg->env.rank : 0;
  const Data data = load_data(o);
  const auto& in = data.train.inputs.shape();
  r.config.in_channels = in.size() == 4 ? in[1] : 1;
  r.config.height = in.size() == 4 ? in[2] : in[1];
  r.config.width = in.size() == 4 ? in[3] : 1;
  r.config.num_classes = data.train.num_classes;
  Generator gen(o.seed);
  r.model = models::make_model(r.config, gen);
  r.model->to(r.device);
  r.optimizer = make_optimizer(o, *r.model);
  DataLoader loader(
      data.train, {.batch_size = o.batch_size, .device = r.device},
      DistributedSampler(data.train.size(), rank, r.world_size, {.shuffle = true, .seed = o.seed}));
  DataLoader test_loader(
      data.test, {.batch_size = 1000, .device = r.device},
      DistributedSampler(data.test.size(), rank, r.world_size, {.shuffle = false}));
  r.schedule = make_schedule(o, loader.num_batches());
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
    r.ddp = std::make_unique<DistributedDataParallel>(r.model, pg->comm, ddp_options);
  }
  if (dp) r.dp = std::make_unique<DataParallel>(r.model, dp_devices);
  TrainResult result{{}, r.device, r.model->num_parameters(), 0, rank, r.world_size, r.mode};
  if (!o.quiet) {
    out << fmt::format(
        "train: {} ({} parameters) on {}, {} ({} train / {} test), batch {}{}, {} lr {}{}\n",
        models::describe(r.config), result.num_parameters, r.device.str(), data.train.name,
        data.train.size(), data.test.size(), o.batch_size,
        o.grad_accum > 1 ? fmt::format(" x {} accumulated", o.grad_accum) : "", o.optimizer, o.lr,
        r.ddp  ? fmt::format(", ddp over {} ranks ({} backend, {} bucket(s), comm hook {})",
                             r.world_size, pg->comm->backend(), r.ddp->buckets().size(), o.comm_hook)
        : r.dp ? fmt::format(", dp over {} replicas ({})", dp_devices.size(), o.devices)
               : "");
  }
  for (int64_t epoch = r.first_epoch; epoch < o.epochs; ++epoch) {
    result.epochs.push_back(train_epoch(r, loader, test_loader, epoch));
    report_epoch(r, result.epochs.back());
  }
  result.total_s = seconds_since(start);
  return result;
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
  if (mode == "single" || mode == "dp")
    return run_on_rank(o, out, nullptr, resume_path(o, nullptr));
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
  return run_on_rank(mine, out, &pg, resume_from);
}

}  // namespace ddp::train
