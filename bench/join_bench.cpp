// bench join: what a Join (collectives/ddp/join.h) adds to a DDP training step
// when no rank has run out: its count all_reduce (Note [join] in join.cpp).
#include "bench/subcommands.h"
#include "collectives/bootstrap.h"
#include "collectives/ddp/distributed_data_parallel.h"
#include "collectives/ddp/join.h"
#include "models/zoo.h"
#include "runtime/autograd/functions.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "runtime/stream.h"

#include <algorithm>
#include <charconv>
#include <chrono>

namespace ddp::bench {
namespace {

using Clock = std::chrono::steady_clock;

int parse_steps(const BenchOptions& o) {
  const std::string text = o.flag("--steps", "50");
  int v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  DDP_CHECK(ec == std::errc() && ptr == text.data() + text.size() && v >= 1,
            "--steps expects an integer >= 1, got '{}'", text);
  return v;
}

// The upper median (for an even count the larger of the two middle values).
double upper_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The same value on every rank: rank 0's (the ranks' step times agree to the
// all_reduce's latency, since every step waits for all).
double from_rank0(Communicator& comm, double value) {
  Tensor t = full({1}, value, {.device = comm.device()});
  comm.broadcast(t, 0)->wait();
  return t.cpu().item<float>();
}

}  // namespace

int run_join_bench(const BenchOptions& o, const Reporter& reporter) {
  const int steps = parse_steps(o);
  const int rounds = o.repeats.value_or(40);
  ProcessGroupOptions pgo;
  pgo.device = o.device.str();
  ProcessGroup pg = init_process_group(pgo);
  Communicator& comm = *pg.comm;
  Generator gen(1);
  auto model = models::make_model({.name = "mlp"}, gen);
  model->to(pg.device);
  DdpOptions ddp_options;
  ddp_options.gradient_as_bucket_view = true;  // as train
  DistributedDataParallel ddp(model, pg.comm, ddp_options);
  optim::SGD sgd(model->parameters(), {.lr = 0.01f, .momentum = 0.9f});
  const int64_t batch = 64;
  const Tensor x =
      randn({batch, 1, 28, 28}, 100 + static_cast<uint64_t>(comm.rank())).to(pg.device);
  std::vector<int64_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[static_cast<size_t>(i)] = i % 10;
  const Tensor y = from_vector(labels, {batch}, {.dtype = DType::i64, .device = pg.device});
  auto step = [&] {
    sgd.zero_grad(true);
    ddp.backward(functional::cross_entropy(ddp(x), y));
    sgd.step();
  };
  // Rounds of `steps` steps, plain and under a Join in turn (ABBA), so drift in
  // the machine's load falls on both alike; the Join's finish() is outside the timing.
  auto timed = [&](bool join) {
    std::optional<Join> j;
    if (join) j.emplace(ddp);
    comm.barrier()->wait();
    const auto start = Clock::now();
    for (int s = 0; s < steps; ++s) step();
    synchronize(pg.device);
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (j) j->finish();
    return from_rank0(comm, us / steps);
  };
  for (int w = 0; w < o.warmup.value_or(2); ++w) timed(w % 2 == 1);
  std::vector<double> plain, joined, diff;
  for (int r = 0; r < rounds; ++r) {
    if (comm.rank() == 0 && r % 10 == 0) reporter.progress(fmt::format("round {}/{}", r, rounds));
    const bool join_first = r % 2 == 1;
    const double a = timed(join_first), b = timed(!join_first);
    plain.push_back(join_first ? b : a);
    joined.push_back(join_first ? a : b);
    diff.push_back(joined.back() - plain.back());
  }
  // The count on its own: an all_reduce(sum) of world-size i64 slots.
  Tensor count = zeros({comm.size()}, {.dtype = DType::i64, .device = comm.device()});
  for (int i = 0; i < 100; ++i) comm.all_reduce(count)->wait();
  comm.barrier()->wait();
  const int iters = 2000;
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) comm.all_reduce(count)->wait();
  const double count_us = from_rank0(
      comm, std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters);
  if (comm.rank() == 0) {
    const double p = upper_median(plain), j = upper_median(joined), d = upper_median(diff);
    reporter.section(
        fmt::format("DDP step of the mlp 784-256-10, batch {} per rank, {} ranks ({}), median of "
                    "{} rounds of {} steps each",
                    batch, comm.size(), comm.backend(), rounds, steps),
        {Row()
             .add("world", comm.size())
             .add("backend", comm.backend())
             .add("plain_us", p, 1)
             .add("join_us", j, 1)
             .add("diff_us", d, 1)
             .add("diff_pct", p > 0 ? 100.0 * d / p : 0.0, 2)
             .add("count_allreduce_us", count_us, 2)
             .add("rounds", rounds)
             .add("steps", steps)
             .add("device", pg.device.str())});
  }
  return 0;
}

}  // namespace ddp::bench
