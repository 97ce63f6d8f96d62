// bench trace, section "step": a DDP training step with the timeline on and off
// in one process, alternating every few steps, so that the load of a shared
// machine falls on both alike (docs/observability.md, "Overhead").
//
// The step is train's (trainer/trainer.cpp) with the same records: a `step`
// span, the phases data wait, forward, backward, grad sync, optimizer, and what
// DDP and the collectives record by themselves (bucket ready, bucket launch,
// enqueue, run, wait). Under ddprun every rank toggles at the same steps.
#include "bench/subcommands.h"
#include "collectives/bootstrap.h"
#include "collectives/ddp/distributed_data_parallel.h"
#include "collectives/trace_collectives.h"
#include "models/gpt.h"
#include "models/zoo.h"
#include "runtime/autograd/functions.h"
#include "runtime/optim/optimizer.h"
#include "runtime/rng/generator.h"
#include "runtime/stream.h"
#include "runtime/trace.h"

#include "runtime/fmt.h"

#include <time.h>

#include <algorithm>
#include <charconv>
#include <chrono>

namespace ddp::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct StepModel {
  std::shared_ptr<nn::Module> module;
  std::unique_ptr<optim::Optimizer> optimizer;
  Tensor inputs, labels;
  int64_t classes = 0;
  std::string name;
};

StepModel make_step_model(const std::string& name, const Device& device) {
  StepModel m;
  m.name = name;
  Generator gen(1234);
  if (name == "mlp") {
    m.module = models::make_model({}, gen);
    m.optimizer = std::make_unique<optim::SGD>(m.module->parameters(),
                                               optim::SgdOptions{.lr = 0.01f, .momentum = 0.9f});
    m.inputs = rand({64, 1, 28, 28}, 7, {.device = device});
    std::vector<int64_t> labels(64);
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 10);
    m.labels = from_vector(labels, {64}).to(device);
    m.classes = 10;
    return m;
  }
  const models::GptConfig config = models::gpt_config(name);
  auto gpt = models::make_gpt(config, gen);
  gpt->to(device);
  m.module = gpt;
  m.optimizer = std::make_unique<optim::AdamW>(m.module->parameters(), optim::AdamWOptions{});
  std::vector<int64_t> ids(static_cast<size_t>(2 * config.context));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 31) % config.vocab);
  m.inputs = from_vector(ids, {2, config.context}).to(device);
  std::rotate(ids.begin(), ids.begin() + 1, ids.end());
  m.labels = from_vector(ids, {2 * config.context}).to(device);
  m.classes = config.logits_width();
  return m;
}

// One step as train takes it, with its records when tracing is on.
void step(StepModel& m, DistributedDataParallel& ddp, int64_t number) {
  const trace::Span span("step", "train", {{"step", number}});
  trace::Phases phase("train");
  phase.next("data wait");
  m.optimizer->zero_grad(/*set_to_none=*/true);
  phase.next("forward", {{"micro_batch", 0}});
  const Tensor logits = ddp.forward(m.inputs);
  const Tensor loss =
      functional::cross_entropy(functional::reshape(logits, {-1, m.classes}), m.labels);
  phase.next("backward", {{"micro_batch", 0}});
  backward(loss);
  phase.next("grad sync (exposed)");
  ddp.finish_backward();
  phase.next("optimizer");
  m.optimizer->step();
}

int flag_int(const BenchOptions& o, std::string_view name, int fallback) {
  const std::string text = o.flag(name, std::to_string(fallback));
  int v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  DDP_CHECK(ec == std::errc() && ptr == text.data() + text.size() && v >= 1,
            "{} expects an integer >= 1, got '{}'", name, text);
  return v;
}

// This process's CPU time (every thread), in ms: unlike the wall clock it does not
// count the time other processes of a shared machine held the cores.
double cpu_ms() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int run_trace_step_bench(const BenchOptions& o, const Reporter& reporter) {
  const std::string model = o.flag("--model", "mlp");
  const bool mlp = model == "mlp";
  const int steps = flag_int(o, "--steps", mlp ? 20 : 1);
  const int rounds = flag_int(o, "--rounds", mlp ? 15 : 3);
  ProcessGroup pg = init_process_group({.backend = "", .timeout = std::nullopt, .device = ""});
  StepModel m = make_step_model(model, pg.device);
  DistributedDataParallel ddp(m.module, pg.comm, {.gradient_as_bucket_view = true});
  reporter.progress(
      fmt::format("step: {} under DDP over {} rank(s) ({}), {} rounds of {} steps "
                  "off and on",
                  model, pg.comm->size(), pg.comm->backend(), rounds, steps));
  int64_t number = 0;
  for (int s = 0; s < 2; ++s) step(m, ddp, number++);  // warm-up (and DDP's bucket rebuild)
  std::vector<double> off, on, ratio, cpu_off, cpu_on, cpu_ratio;
  int64_t records = 0, on_steps = 0;
  for (int r = 0; r < rounds; ++r) {
    double ms[2] = {0, 0}, cpu[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const bool tracing = (k == 0) == (r % 2 == 1);  // off-on, on-off, ...
      trace::start({.dir = "", .max_events = 4'000'000, .handle_signals = false});
      if (tracing) {
        attach_trace_observer();
      } else {
        trace::stop();
      }
      const auto start = Clock::now();
      const double cpu_start = cpu_ms();
      for (int s = 0; s < steps; ++s) step(m, ddp, number++);
      synchronize(pg.device);
      ms[tracing] = std::chrono::duration<double, std::milli>(Clock::now() - start).count() / steps;
      cpu[tracing] = (cpu_ms() - cpu_start) / steps;
      if (tracing) {
        records += static_cast<int64_t>(trace::snapshot().events.size());
        on_steps += steps;
      }
      trace::stop();
    }
    off.push_back(ms[0]);
    on.push_back(ms[1]);
    ratio.push_back(ms[1] / ms[0]);
    cpu_off.push_back(cpu[0]);
    cpu_on.push_back(cpu[1]);
    cpu_ratio.push_back(cpu[1] / cpu[0]);
  }
  std::vector<Row> rows;
  rows.push_back(Row()
                     .add("model", model)
                     .add("world", static_cast<int64_t>(pg.comm->size()))
                     .add("backend", pg.comm->backend())
                     .add("rounds", rounds)
                     .add("steps", steps)
                     .add("off_step_ms", median(off), 4)
                     .add("on_step_ms", median(on), 4)
                     .add("overhead_pct", 100 * (median(ratio) - 1), 2)
                     .add("off_cpu_ms", median(cpu_off), 4)
                     .add("on_cpu_ms", median(cpu_on), 4)
                     .add("cpu_overhead_pct", 100 * (median(cpu_ratio) - 1), 2)
                     .add("records_per_step",
                          static_cast<double>(records) / static_cast<double>(on_steps), 1));
  reporter.section("step (medians; overhead: the median of each round's on/off ratio)", rows);
  return 0;
}

}  // namespace ddp::bench
