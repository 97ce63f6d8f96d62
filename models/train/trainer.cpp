#include "models/train/trainer.h"

#include "collectives/bootstrap.h"
#include "collectives/ddp/distributed_data_parallel.h"
#include "models/train/checkpoint.h"
#include "runtime/autograd/functions.h"
#include "runtime/data/loader.h"
#include "runtime/logging.h"
#include "runtime/ops/ops.h"
#include "runtime/stream.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>

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

optim::LrSchedule make_schedule(const TrainOptions& o, int64_t steps_per_epoch) {
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
    Tensor counts = from_vector<int64_t>({correct, total}, {2});
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
                          loss, rate)
           << std::flush;
    }
  }

 private:
  std::ostream& out_;
  bool quiet_;
  int64_t every_;
  bool bar_;
};

void write_metrics(const std::string& path, const EpochMetrics& m, int world_size) {
  if (path.empty()) return;
  std::ofstream f(path, std::ios::app);
  DDP_CHECK(f.good(), "--metrics {}: cannot open for appending", path);
  f << fmt::format(
      "{{\"epoch\": {}, \"train_loss\": {:.6f}, \"test_acc\": {:.6f}, \"samples_per_s\": {:.1f}, "
      "\"step_ms\": {:.4f}, \"time_s\": {:.3f}, \"lr\": {}, \"steps\": {}, \"world_size\": {}}}\n",
      m.epoch, m.train_loss, m.test_acc, m.samples_per_s, m.step_ms, m.time_s, m.lr, m.steps,
      world_size);
}

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
};

EpochMetrics train_epoch(Run& r, DataLoader& loader, DataLoader& test_loader, int64_t epoch) {
  const auto start = Clock::now();
  Progress progress(r.o, r.out);
  loader.start_epoch(epoch);
  const int64_t steps =
      r.o.max_steps > 0 ? std::min(r.o.max_steps, loader.num_batches()) : loader.num_batches();
  Tensor loss_sum = zeros({}, {.device = r.device});
  Batch batch;
  int64_t step = 0, samples = 0;
  while (step < steps && loader.next(batch)) {
    r.optimizer->zero_grad(/*set_to_none=*/true);  // backward then hands .grad its fresh tensors
    const Tensor logits = r.ddp ? r.ddp->forward(batch.inputs) : (*r.model)(batch.inputs);
    Tensor loss = functional::cross_entropy(logits, batch.labels);
    if (r.ddp) {
      r.ddp->backward(loss);  // gradients averaged over ranks
    } else {
      backward(loss);
    }
    r.optimizer->set_lr(r.schedule.lr_at(r.optimizer->steps()));
    r.optimizer->step();
    {
      NoGradGuard no_grad;
      axpy_(1.0f, loss, loss_sum);
    }
    ++step;
    samples += batch.labels.size(0) * r.world_size;  // global samples
    if (r.o.log_every > 0 ? step % r.o.log_every == 0 : step % 10 == 0 || step == steps) {
      progress.step(epoch + 1, r.o.epochs, step, steps, loss.item<float>(),
                    static_cast<double>(samples) / seconds_since(start));
    }
  }
  synchronize(r.device);
  const double train_s = seconds_since(start);
  EpochMetrics m;
  m.epoch = epoch + 1;
  m.steps = step;
  m.lr = r.optimizer->lr();
  m.train_loss = step == 0 ? 0.0 : loss_sum.item<float>() / static_cast<double>(step);
  m.samples_per_s = static_cast<double>(samples) / train_s;
  m.step_ms = step == 0 ? 0.0 : 1e3 * train_s / static_cast<double>(step);
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
void report_epoch(const Run& r, const EpochMetrics& m) {
  const TrainOptions& o = r.o;
  write_metrics(o.metrics, m, r.world_size);
  if (!o.save.empty()) {
    save_checkpoint(
        o.save, *r.model, *r.optimizer,
        {models::describe(r.config), r.optimizer->name(), m.epoch, r.optimizer->steps(), o.seed});
  }
  if (!o.quiet) {
    r.out << fmt::format(
                 "epoch {}/{}: train_loss {:.4f} test_acc {:.4f} {:.0f} samples/s {:.3f} ms/step "
                 "{:.1f} s\n",
                 m.epoch, o.epochs, m.train_loss, m.test_acc, m.samples_per_s, m.step_ms, m.time_s)
          << std::flush;
  }
}

// pg: null for a single process.
TrainResult run_on_rank(const TrainOptions& o, std::ostream& out, ProcessGroup* pg) {
  const auto start = Clock::now();
  Run r{o,
        out,
        pg ? pg->device : resolve_device(o.device),
        o.model,
        nullptr,
        nullptr,
        {},
        0,
        pg,
        nullptr,
        pg ? pg->env.world_size : 1};
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
  if (!o.resume.empty()) {
    const CheckpointInfo info =
        load_checkpoint(o.resume, *r.model, *r.optimizer, models::describe(r.config));
    r.first_epoch = info.epoch;
    if (!o.quiet)
      out << fmt::format("resumed from {} after epoch {} (step {})\n", o.resume, info.epoch,
                         info.step);
  }
  // After a resume, so every rank starts from the same (rank 0's) values.
  if (pg != nullptr) r.ddp = std::make_unique<DistributedDataParallel>(r.model, pg->comm);
  TrainResult result{{}, r.device, r.model->num_parameters(), 0, rank};
  if (!o.quiet) {
    out << fmt::format(
               "train: {} ({} parameters) on {}, {} ({} train / {} test), batch {}, {} lr {}\n",
               models::describe(r.config), result.num_parameters, r.device.str(), data.train.name,
               data.train.size(), data.test.size(), o.batch_size, o.optimizer, o.lr)
        << std::flush;
  }
  for (int64_t epoch = r.first_epoch; epoch < o.epochs; ++epoch) {
    result.epochs.push_back(train_epoch(r, loader, test_loader, epoch));
    report_epoch(r, result.epochs.back());
  }
  result.total_s = seconds_since(start);
  return result;
}

}  // namespace

// Note [distributed train]: with WORLD_SIZE > 1 (ddprun, mpirun, srun) every rank
// trains on its DistributedSampler shard with the model in DistributedDataParallel;
// rank 0 alone prints, writes metrics and saves; samples_per_s counts all ranks and
// test accuracy sums every rank's shard (the sampler pads the test set to a multiple
// of the world size, so up to world_size - 1 samples count twice).
TrainResult run_training(const TrainOptions& o, std::ostream& out) {
  if (read_launch_env().world_size <= 1) return run_on_rank(o, out, nullptr);
  ProcessGroupOptions pg_options;
  pg_options.device = o.device == "auto" ? "" : o.device;
  ProcessGroup pg = init_process_group(pg_options);
  TrainOptions mine = o;
  if (pg.env.rank != 0) {
    mine.quiet = true;
    mine.save.clear();
    mine.metrics.clear();
  }
  return run_on_rank(mine, out, &pg);
}

}  // namespace ddp::train
