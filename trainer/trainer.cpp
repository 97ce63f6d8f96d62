#include "trainer/trainer.h"

#include "collectives/bootstrap.h"
#include "collectives/collective_events.h"
#include "collectives/elastic.h"
#include "collectives/trace_collectives.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/env.h"
#include "runtime/ops/nn_ops.h"
#include "runtime/ops/ops.h"
#include "trainer/elastic.h"
#include "trainer/run.h"
#include "trainer/uneven.h"

#include <signal.h>

#include <fmt/ranges.h>
#include "runtime/fmt.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>

namespace ddp::train {
namespace {

using Clock = std::chrono::steady_clock;

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
  // onecycle without --warmup-steps rises over torch's 30%, not the gpt's automatic warmup.
  s.warmup_steps = o.auto_warmup && s.kind != optim::LrSchedule::Kind::onecycle
                       ? std::min<int64_t>(100, s.total_steps / 10)
                       : o.warmup_steps;
  s.min_lr = o.lr * o.min_lr_fraction;
  // A rise past the run's end never reaches --lr: PyTorch's OneCycleLR refuses a
  // pct_start above 1 alike.
  DDP_CHECK(s.kind != optim::LrSchedule::Kind::onecycle || s.warmup_steps <= s.total_steps,
            "--warmup-steps {}: onecycle's rise is longer than the run's {} optimizer steps, so "
            "it never reaches --lr; pass at most {} (or more --epochs)",
            s.warmup_steps, s.total_steps, s.total_steps);
  return s;
}

std::string schedule_span_note(const optim::LrSchedule& s, int64_t saved_span, int64_t step,
                               const std::string& name) {
  using Kind = optim::LrSchedule::Kind;
  if (saved_span <= 0 || saved_span == s.total_steps || s.kind == Kind::constant ||
      s.kind == Kind::step)
    return "";
  optim::LrSchedule saved = s;
  saved.total_steps = saved_span;
  return fmt::format(
      "note: --lr-schedule {} spanned {} optimizer steps in the checkpoint's run and spans {} "
      "in this one (other --epochs, --max-steps or data): it is planned anew, so the lr at step {} "
      "is {:g} where it was to be {:g}\n",
      name, saved_span, s.total_steps, step, s.lr_at(step), saved.lr_at(step));
}

std::string warmup_note(const optim::LrSchedule& s) {
  using Kind = optim::LrSchedule::Kind;
  if ((s.kind != Kind::cosine && s.kind != Kind::linear) || s.warmup_steps == 0 ||
      s.warmup_steps < s.total_steps)
    return "";
  return fmt::format(
      "note: --warmup-steps {} is not shorter than the run's {} optimizer steps: the lr rises "
      "to {:g} and never decays ({}; pass fewer warmup steps, or more --epochs)\n",
      s.warmup_steps, s.total_steps, s.lr_at(s.total_steps - 1),
      s.warmup_steps > s.total_steps ? "nor reaches --lr" : "it reaches --lr at the last step");
}

Device resolve_device(const std::string& text) {
  if (text == "auto") return default_device();
  const Device d = Device::parse(text);
  check_available(d);
  return d;
}

namespace {

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

// --zero 1|2: the task's optimizer sharded over the ranks (collectives/ddp/zero.h),
// before a resume loads (and reshards) its state.
void wrap_zero(Run& r) {
  const TrainOptions& o = r.o;
  auto zero = make_zero(r, std::move(r.optimizer), r.pg->comm);
  r.zero = zero.get();
  r.optimizer = std::move(zero);
  if (o.quiet || o.optimizer != "sgd" || o.momentum != 0.0f) return;
  if (o.zero == 1) {
    r.out << "note: --zero 1 with SGD without momentum: there is no optimizer state to shard, so "
             "it saves no memory over --zero 0\n";
    return;
  }
  r.out << fmt::format(
      "note: --zero {} with SGD without momentum: there is no optimizer state to shard; only "
      "the gradients{} are sharded\n",
      o.zero, o.zero == 3 ? " and parameters" : "");
}

// Loads `path` ("" for none) into the run and checks a mid-epoch position fits
// this run's data order (Note [resume mid-epoch] in checkpoint.cpp).
void resume(Run& r, const std::string& path) {
  const TrainOptions& o = r.o;
  if (!path.empty()) {
    r.resumed =
        load_checkpoint(path, *r.model, *r.optimizer, r.task->model_spec(),
                        [&r](const std::string& saved) { return r.task->resumes_from(saved); });
    r.did_resume = true;
    r.first_epoch = r.resumed.epoch;
    r.step = r.resumed.step;
    r.best_metric = r.resumed.best_metric;  // Note [best so far] in epoch.cpp
    r.evals_since_best = r.resumed.evals_since_best;
    const std::string task = task_kind(r.task->is_language_model(), r.task->is_regression());
    DDP_CHECK(r.resumed.task.empty() || r.resumed.task == task,
              "{}: the checkpoint's task is {} and this run's is {} (by its data's targets), "
              "where its best so far ({}) would be read as another metric; resume on data of "
              "the same task, or start over",
              path, r.resumed.task, task, r.resumed.best_metric);
    const int64_t global_batch = o.batch_size * o.grad_accum * r.world_size;
    // A checkpoint that records its sample position (epoch_cursor: every mid-epoch
    // save since 2026-12-01, a group's stop included, Note [group stop]) goes on
    // from there at any global batch, the rest of the epoch shared out anew
    // (resumed_after_regroup in epoch.cpp). Not under --drop-last false: its uneven
    // shares start at the epoch's start only (DistributedSampler::set_epoch).
    const bool from_cursor =
        r.resumed.epoch_cursor >= 0 && r.task->reshardable() && o.drop_last != DropLast::uneven;
    DDP_CHECK(
        r.resumed.epoch_step == 0 ||
            (r.resumed.seed == o.seed && (r.resumed.global_batch == global_batch || from_cursor)),
        "{}: the checkpoint stopped in the middle of epoch {} with --seed {} and a global "
        "batch of {} (--batch-size x --grad-accum x ranks); this run has --seed {} and {}, "
        "so its data order differs. Resume with the same values",
        path, r.resumed.epoch + 1, r.resumed.seed, r.resumed.global_batch, o.seed, global_batch);
    // The epoch's order is a permutation of the training set: other data (a file
    // edited between runs) would repeat or skip samples from here on.
    DDP_CHECK(r.resumed.epoch_step == 0 || r.resumed.train_size == 0 ||
                  r.resumed.train_size == r.task->train_size(),
              "{}: the checkpoint stopped in the middle of epoch {} on a training set of {} "
              "(samples, or tokens), and this run's has {}: its data order differs, so samples "
              "would be repeated or skipped. Resume on the same data, or from a checkpoint at an "
              "epoch's end",
              path, r.resumed.epoch + 1, r.resumed.train_size, r.task->train_size());
    // The schedule's span is counted in steps of the global batch; another batch
    // would rescale it mid-run (older files record none: 0).
    DDP_CHECK(r.resumed.global_batch == 0 || r.resumed.global_batch == global_batch ||
                  r.schedule.kind == optim::LrSchedule::Kind::constant,
              "{}: the checkpoint was written with a global batch of {} (--batch-size x "
              "--grad-accum x ranks), this run has {}: the --lr-schedule {} would be rescaled to "
              "the new steps per epoch. Resume with the same values, or pass --lr-schedule "
              "constant",
              path, r.resumed.global_batch, global_batch, o.lr_schedule);
    // Each epoch stops at --max-steps: a checkpoint further into its epoch cannot
    // go on in it (its remaining steps would be none, its samples skipped).
    DDP_CHECK(o.max_steps == 0 || r.resumed.epoch_step <= o.max_steps,
              "{}: the checkpoint stopped after step {} of epoch {}, and --max-steps {} ends "
              "every epoch before that step; resume with --max-steps {} or more (or 0: the "
              "whole epoch)",
              path, r.resumed.epoch_step, r.resumed.epoch + 1, o.max_steps, r.resumed.epoch_step);
    if (!o.quiet) {
      r.out << fmt::format("resumed from {} at step {} (epoch {}, step {} of it)\n", path,
                           r.resumed.step, r.resumed.epoch + 1, r.resumed.epoch_step);
      r.out << schedule_span_note(r.schedule, r.resumed.schedule_steps, r.step, o.lr_schedule);
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
  using Kind = optim::LrSchedule::Kind;
  std::string text =
      s.kind == Kind::cosine || s.kind == Kind::linear
          ? fmt::format(" (warmup {}, {} to {:.3g} over {} steps)", s.warmup_steps, o.lr_schedule,
                        s.min_lr, s.total_steps)
      : s.kind == Kind::onecycle
          ? fmt::format(" (onecycle over {} steps, from {:.3g} up to {:.3g} down to {:.3g})",
                        s.total_steps, s.base_lr / 25, s.base_lr, s.base_lr / 25e4)
          : fmt::format(" ({})", o.lr_schedule);
  if (o.optimizer == "adamw") {
    text += fmt::format(", betas {} {}, weight decay {} (2-D weights)", o.beta1, o.beta2,
                        o.weight_decay);
  }
  text += o.clip_grad_norm > 0 ? fmt::format(", clip {}", o.clip_grad_norm) : ", no clip";
  return text;
}

// --precision bf16. On CUDA: the forwards run under autocast (Note [autocast] in
// runtime/autograd/autocast.h), on GPUs with bf16 tensor cores. On the CPU: oneDNN's
// bf16 matmuls (Note [cpu bf16]); DDP_TEST_BF16_EMULATE=1 lets tests run it on a
// CPU without AVX512_BF16 (oneDNN emulates it there, slowly). Returns the autocast
// state of the run's forwards.
AutocastState apply_precision(const TrainOptions& o, const std::vector<Device>& devices) {
  set_cpu_precision(CpuPrecision::f32);
  if (o.precision != "bf16") return {};
  const Device& device = devices.front();
  if (device.is_cuda()) {
    for (const Device& d : devices) {
      const cuda_api::Properties p = cuda_api::properties(d.index);
      check_bf16_gpu(d.str(), p.name, p.major, p.minor);
    }
    return {.enabled = true, .dtype = DType::bf16};
  }
  DDP_CHECK(device.is_cpu(),
            "--precision bf16 is implemented for CUDA (autocast) and the CPU (oneDNN); on {} use "
            "--precision fp32",
            device.str());
  if (env::get(env::kTestCpuAutocast).value_or("") == "1") {
    return {.enabled = true, .dtype = DType::bf16};  // a testing aid (runtime/env.h)
  }
  set_cpu_precision(CpuPrecision::bf16, env::get(env::kTestBf16Emulate).value_or("") == "1");
  return {};
}

}  // namespace

std::unique_ptr<ZeroOptimizer> make_zero(Run& r, std::unique_ptr<optim::Optimizer> inner,
                                         std::shared_ptr<Communicator> comm) {
  const TrainOptions& o = r.o;
  std::function<void()> after_update;
  if (r.faults.kill_in_update_step > 0) {  // DDP_TEST_KILL_IN_UPDATE (faults.h)
    after_update = [&r] {
      if (r.step + 1 == r.faults.kill_in_update_step) ::raise(SIGKILL);
    };
  }
  return std::make_unique<ZeroOptimizer>(
      std::move(inner), std::move(comm),
      ZeroOptions{.stage = o.zero,
                  .bucket_cap_mb = o.bucket_cap_mb,
                  .fully_shard = {.units = o.zero3_units,
                                  .reshard_after_forward = o.zero3_reshard_after_forward},
                  .replicas = o.zero_replicas,
                  .after_update = std::move(after_update)});
}

void make_ddp(Run& r) {
  const TrainOptions& o = r.o;
  DdpOptions ddp_options;
  ddp_options.bucket_cap_mb = o.bucket_cap_mb;
  ddp_options.first_bucket_mb = std::min(1.0, o.bucket_cap_mb);
  ddp_options.comm_hook = parse_comm_hook(o.comm_hook);
  ddp_options.gradient_as_bucket_view = true;  // Note [writing gradients back] in reducer.cpp
  ddp_options.zero_stage = o.zero;
  const CommHook hook = ddp_options.comm_hook;
  if (r.faults.skip_allreduce_step > 0) ddp_options.comm_hook = CommHook::none;
  r.ddp = std::make_unique<DistributedDataParallel>(r.model, r.pg->comm, ddp_options);
  // ZeRO-2: gradients reduce-scattered during the backward; ZeRO-3: the model
  // sharded, from the values a resume loaded and DDP made equal (Note [zero stages]).
  if (r.zero != nullptr && o.zero >= 2) r.zero->attach(*r.ddp);
  if (FullyShardedParameters* f = r.zero != nullptr ? r.zero->fully_sharded() : nullptr) {
    r.eval_lockstep = {.ranks_with_batch = [f](bool has) { return f->ranks_with_batch(has); },
                       .shadow = [f] { f->shadow_forward(); }};
    r.task->eval_lockstep = &r.eval_lockstep;
  }
  if (r.faults.skip_allreduce_step > 0)
    r.ddp->register_comm_hook(skip_allreduce_hook(r.faults.skip_allreduce_step, hook));
}

namespace {

// The epochs from r.first_epoch; under --on-failure continue a collective that
// fails sends the rank through a regroup and the epoch goes on (Note [elastic
// training] in elastic.h).
void train_epochs(Run& r, TrainResult& result) {
  for (int64_t epoch = r.first_epoch; epoch < r.o.epochs; ++epoch) {
    try {
      EpochMetrics m = train_epoch(r, epoch);
      report(r, m, /*epoch_end=*/true);
      result.epochs.push_back(std::move(m));
      r.position = EpochPosition{.epoch = epoch + 1};
    } catch (const CommError& e) {
      if (!r.elastic) throw;
      if (r.profiling) {  // Note [profiled steps]: a regroup ends the window
        finish_profile(r, "a regroup", /*print=*/false);
        if (!r.o.quiet) {
          r.out << fmt::format("profile: cut short at step {} by a regroup; nothing printed\n",
                               r.step);
        }
      }
      rejoin(r, e);
      // --early-stop decided in a report completed everywhere: the run is over.
      if (r.stop_early && r.rejoin_at->step == 0 && r.rejoin_at->epoch > 0) break;
      epoch = r.rejoin_at->epoch - 1;  // the most advanced rank may have finished this one
      continue;
    }
    if (r.stop_early) break;
  }
}

// pg: null for a single process.
// resume_from: resume_path()'s answer.
// writable, launch: Note [elastic training] (null: not elastic).
TrainResult run_on_rank(const TrainOptions& o, std::ostream& out, ProcessGroup* pg,
                        const std::string& resume_from, TrainOptions* writable = nullptr,
                        const TrainOptions* launch = nullptr) {
  const auto start = Clock::now();
  const bool dp = pg == nullptr && o.mode == "dp";
  const std::vector<Device> dp_devices = dp ? parse_device_list(o.devices) : std::vector<Device>{};
  if (dp) check_data_parallel_devices(dp_devices);  // before the data and the model
  Run r{.o = o,
        .out = out,
        .device = pg   ? pg->device
                  : dp ? dp_devices.front()
                       : resolve_device(o.device)};
  r.autocast = apply_precision(o, dp ? dp_devices : std::vector<Device>{r.device});
  r.pg = pg;
  r.world_size = pg ? pg->env.world_size : 1;
  r.mode = pg ? "ddp" : dp ? "dp" : "single";
  const int rank = pg ? pg->env.rank : 0;
  r.task = make_task(o, r.device, rank, r.world_size);
  r.model = r.task->model();
  r.optimizer = r.task->make_optimizer(o);
  if (o.cuda_graph) {  // Note [graphed steps] in epoch.cpp
    DDP_CHECK_T(DeviceError,
                r.device.is_cuda() || env::get(env::kTestCudaGraphOnCpu).value_or("") == "1",
                "--cuda-graph captures CUDA work; this run is on {} (pass --device cuda on a "
                "machine with a GPU, or drop --cuda-graph)",
                r.device.str());
    DDP_CHECK(pg == nullptr && !dp,
              "--cuda-graph captures one process's step on one GPU; this run is {} (train one "
              "process, or drop --cuda-graph)",
              pg ? fmt::format("rank {} of {} under a launcher", rank, r.world_size) : "--mode dp");
    r.optimizer->set_capturable(true);  // Note [captured optimizer steps]
    r.graphed = std::make_unique<GraphedStep>();
  }
  r.faults = TestFaults::from_env(rank);
  // A replacement has no communicator yet: its ZeroOptimizer comes with the group it
  // joins (Note [zero replicas] in collectives/ddp/zero.h).
  if (pg != nullptr && o.zero > 0 && !pg->env.joining) wrap_zero(r);
  r.schedule = make_schedule(o, r.task->num_batches_of(0));  // rank 0 has the most
  resume(r, resume_from);
  open_logs(r);
  r.nonfinite = std::make_unique<NonfiniteCheck>(
      o.on_nonfinite, r.device, pg ? pg->comm.get() : nullptr, rank, r.resumed.skipped_steps);
  if (pg != nullptr && pg->env.elastic()) {
    r.elastic = true;
    r.writable = writable;
    r.launch_options = launch;
    r.join_at_step = TestFaults::step_for("DDP_TEST_JOIN_AT", 0);  // every rank: *:STEP
    check_elastic(r);  // before the first step: what a regroup cannot carry on
    pg->store->set(elastic::kHandlesStopKey, std::string("1"));  // Note [group stop]
  }
  // After a resume, so every rank starts from the same (rank 0's) values.
  if (pg != nullptr && pg->comm != nullptr) make_ddp(r);
  if (dp) r.dp = std::make_unique<DataParallel>(r.model, dp_devices);
  TrainResult result{{}, r.device, r.model->num_parameters(), 0, rank, r.world_size, r.mode};
  if (!o.quiet) {
    out << fmt::format(
        "{}: {} ({} parameters) on {}{}, {}, batch {}{}, {} lr {}{}{}\n", o.program_name,
        r.task->model_spec(), result.num_parameters, r.device.str(),
        o.precision != "bf16" ? ""
        : r.autocast.enabled  ? " (bf16 autocast)"
                              : " (bf16 matmuls)",
        r.task->data_summary(), o.batch_size,
        o.grad_accum > 1 ? fmt::format(" x {} accumulated", o.grad_accum) : "", o.optimizer, o.lr,
        r.task->is_language_model() ? schedule_summary(o, r.schedule) : "",
        r.ddp  ? fmt::format(", ddp over {} ranks ({} backend, {} bucket(s), comm hook {}){}",
                             r.world_size, pg->comm->backend(), r.ddp->buckets().size(), o.comm_hook,
                            o.zero > 0 ? fmt::format(", ZeRO-{}", o.zero) : "")
        : r.dp ? fmt::format(", dp over {} replicas ({})", dp_devices.size(), o.devices)
               : "");
  }
  if (!o.quiet) out << warmup_note(r.schedule);
  if (!o.quiet && o.summary) out << r.task->model()->summary();
  if (!o.quiet) out << describe_uneven(*r.task, o, r.world_size);
  r.position.epoch = r.first_epoch;
  if (pg != nullptr && pg->env.joining) {  // a replacement: Note [elastic training]
    r.first_epoch = join_group(r) ? r.rejoin_at->epoch : o.epochs;
  }
  {
    // --profile-steps: a run that ends (or fails) inside the window stops the profile.
    struct ProfileOff {
      Run& r;
      ~ProfileOff() {
        try {
          finish_profile(r, "the run failed", /*print=*/false);
        } catch (...) {  // the device failed too: the error on its way says so
        }
      }
    } off{r};
    train_epochs(r, result);
    finish_profile(r);
    if (o.profile_steps > 0 && !r.profile_taken && !o.quiet) {
      out << fmt::format(
          "profile: nothing profiled: the run ended after step {}, before the "
          "first step --profile-steps may take ({}; Note [profiled steps])\n",
          r.step, r.profile_from < 0 ? o.profile_start : r.profile_from);
    }
  }
  if (result.epochs.empty()) result.saved_as_resumed = save_as_resumed(r, resume_from);
  mark_done(r);
  result.stopped_early = r.stop_early;
  result.best_metric = r.best_metric;
  result.saved_best = r.saved_best;
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
  if (!o.save_best.empty()) check_can_create("--save-best", o.save_best);
  if (!o.metrics.empty()) open_for_append("--metrics", o.metrics);
  if (!o.loss_log.empty()) open_for_append("--loss-log", o.loss_log);
}

// Note [same flags]: ranks started apart (mpirun's MPMD form `-np 1 train A :
// -np 1 train B`, RANK set by hand) can be given different training flags;
// ddprun gives every rank one command line. Before the first step every rank
// compares, with one all_gather, what decides the replicas' updates, the data
// order and the schedule with rank 0's: a rank with another --lr, --optimizer,
// --seed or --batch-size trained on silently, its replica diverging, exit 0. The
// model itself is DDP's check (verify_same_model); paths (--data, --save) may
// differ between nodes and are left out.
void check_same_flags(const TrainOptions& o, Communicator& comm) {
  const std::vector<std::pair<const char*, std::string>> fields = {
      {"--epochs", std::to_string(o.epochs)},
      {"--batch-size", std::to_string(o.batch_size)},
      {"--grad-accum", std::to_string(o.grad_accum)},
      {"--lr", fmt::format("{}", o.lr)},
      {"--optimizer", o.optimizer},
      {"--momentum", fmt::format("{}", o.momentum)},
      {"--nesterov", o.nesterov ? "on" : "off"},
      {"--weight-decay", fmt::format("{}", o.weight_decay)},
      {"the optimizer's betas", fmt::format("{},{}", o.beta1, o.beta2)},
      {"--lr-schedule", o.lr_schedule},
      {"--warmup-steps", fmt::format("{}{}", o.warmup_steps, o.auto_warmup ? " (auto)" : "")},
      {"the schedule's min_lr fraction", fmt::format("{}", o.min_lr_fraction)},
      {"--clip-grad-norm", fmt::format("{}", o.clip_grad_norm)},
      {"--seed", std::to_string(o.seed)},
      {"--max-steps", std::to_string(o.max_steps)},
      {"--synthetic-size", std::to_string(o.synthetic_size)},
      {"--task", o.task},
      {"--drop-last", drop_last_name(o.drop_last)},
      {"--join-divide", join_divide_name(o.join_divide)},
      {"--eval-every", std::to_string(o.eval_every)},
      {"--eval-batches", std::to_string(o.eval_batches)},
      {"--save-every", std::to_string(o.save_every)},
      {"--on-nonfinite", o.on_nonfinite},
      {"--early-stop", std::to_string(o.early_stop)},
      {"--precision", o.precision},
      {"--bucket-cap-mb", fmt::format("{}", o.bucket_cap_mb)},
      {"--comm-hook", o.comm_hook},
      {"--zero", std::to_string(o.zero)},
      {"--zero-replicas", std::to_string(o.zero_replicas)},
      {"--zero3-units", fmt::format("{}", fmt::join(o.zero3_units, ","))},
      {"--zero3-reshard-after-forward", o.zero3_reshard_after_forward ? "true" : "false"},
      {"--save-sharded", o.save_sharded ? "on" : "off"}};
  const auto n = static_cast<int64_t>(fields.size());
  std::vector<int64_t> mine;
  for (const auto& [flag, value] : fields) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (const unsigned char c : value) h = (h ^ c) * 1099511628211ull;
    mine.push_back(static_cast<int64_t>(h));
  }
  Tensor input = from_vector<int64_t>(mine, {n}, {.dtype = DType::i64, .device = comm.device()});
  Tensor all = zeros({n * comm.size()}, {.dtype = DType::i64, .device = comm.device()});
  {
    const CollectiveLabel labelled("train flags");
    comm.all_gather(input, all)->wait();
  }
  const std::vector<int64_t> seen = all.to_vector<int64_t>();
  for (int r = 1; r < comm.size(); ++r) {
    for (int64_t f = 0; f < n; ++f) {
      if (seen[static_cast<size_t>(r * n + f)] == seen[static_cast<size_t>(f)]) continue;
      // Every rank found this (r, f) first: the two values, from their ranks.
      const auto& [flag, value] = fields[static_cast<size_t>(f)];
      const auto value_of = [&, value = value](int from) {
        std::vector<uint8_t> bytes(256, 0);
        if (comm.rank() == from)
          std::copy_n(value.begin(), std::min<size_t>(value.size(), 255), bytes.begin());
        Tensor t =
            from_vector<uint8_t>(bytes, {256}, {.dtype = DType::u8, .device = comm.device()});
        const CollectiveLabel labelled("train flags");
        comm.broadcast(t, from)->wait();
        const auto got = t.to_vector<uint8_t>();
        return std::string(got.begin(), std::find(got.begin(), got.end(), uint8_t{0}));
      };
      const std::string at0 = value_of(0), at_r = value_of(r);
      throw ValueError(fmt::format(
          "the ranks were started with different training flags: rank {}'s {} is {}, rank 0's "
          "is {}. Every rank must be given the same flags (ddprun does; with mpirun's `-np 1 A "
          ": -np 1 B` form or RANK set by hand, check each command line)",
          r, flag, at_r, at0));
    }
  }
}

}  // namespace

// Note [distributed train]: with WORLD_SIZE > 1 (ddprun, mpirun, srun) every rank
// trains on its DistributedSampler shard with the model in DistributedDataParallel;
// rank 0 alone prints, writes metrics and saves; samples_per_s counts all ranks and
// test accuracy sums every rank's shard (the sampler pads the test set to a multiple
// of the world size, so up to world_size - 1 samples count twice, except under
// --drop-last false, whose uneven test shards count each sample once).
//
// --mode: auto is ddp when WORLD_SIZE > 1, else single; ddp alone (world size 1)
// runs DistributedDataParallel over the local backend (its overhead, measurable);
// single and dp under a launcher are errors (every rank would train alone).
TrainResult run_training(const TrainOptions& o, std::ostream& out) {
  const int world_size = read_launch_env().world_size;
  // --zero 1|2 alone is ddp over the local backend (its sharding, measurable).
  const std::string mode =
      o.mode == "auto" ? (world_size > 1 || o.zero > 0 ? "ddp" : "single") : o.mode;
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
  // A replacement joins with no communicator; its flags are its launch's own.
  if (pg.comm != nullptr && pg.env.world_size > 1) check_same_flags(o, *pg.comm);
  // Before the other ranks drop --save. A replacement joining the group
  // (trainer/elastic.h) takes its state from a member instead.
  const std::string resume_from = pg.env.joining ? "" : resume_path(o, &pg);
  TrainOptions mine = o;
  mine.save_everywhere = o.save;
  if (pg.env.rank != 0 || pg.env.joining) {  // a replacement is never the writer at first
    mine.quiet = true;
    mine.save.clear();
    mine.metrics.clear();
    mine.loss_log.clear();
  }
  TrainResult result = run_on_rank(mine, out, &pg, resume_from, &mine, &o);
  report_trace(finish_trace(&pg), mine, out);  // Note [timeline]
  return result;
}

}  // namespace ddp::train
