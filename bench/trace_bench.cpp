// bench trace: what the timeline's recording costs per event (docs/observability.md,
// "Overhead"), next to an empty loop; the end-to-end step times are
// bench/trace_overhead.sh's.
#include "bench/subcommands.h"
#include "collectives/collective_events.h"
#include "collectives/trace_collectives.h"
#include "runtime/trace.h"

#include "runtime/fmt.h"

#include <filesystem>
#include <random>

namespace ddp::bench {
namespace {

constexpr int kOps = 10000;         // per sample
constexpr int kCollectives = 2000;  // per sample

// A fresh recording (the records of the previous measurement are dropped).
void fresh(const std::string& dir, bool on) {
  trace::start({.dir = dir, .max_events = 4'000'000, .handle_signals = false});
  if (!on) trace::stop();
}

CollectiveInfo sample_info() {
  CollectiveInfo info;
  info.backend = "shm";
  info.kind = CollectiveKind::all_reduce;
  info.world_size = 2;
  info.count = 1 << 18;
  info.dtype = DType::f32;
  info.bytes = info.count * 4;
  info.label = "ddp bucket 3";
  return info;
}

// The five moments a DDP bucket's all-reduce has on a CPU backend.
void collective_moments(CollectiveInfo& info) {
  for (int i = 0; i < kCollectives; ++i) {
    info.sequence = i;
    notify_collective(info, CollectiveState::enqueued);
    notify_collective(info, CollectiveState::started);
    notify_collective(info, CollectiveState::completed);
    notify_collective(info, CollectiveState::wait_begin);
    notify_collective(info, CollectiveState::wait_end);
  }
}

// The "recording" section: each kind of record, on and off.
void record_costs(const BenchOptions& options, const Reporter& reporter) {
  const TimingOptions timing = options.timing(1, 15);
  std::vector<Row> rows;
  auto add = [&](std::string_view what, const Timing& t, int ops, double baseline_ns) {
    const double ns = t.median_ms * 1e6 / ops;
    rows.push_back(Row()
                       .add("what", std::string(what))
                       .add("ns_per_op", ns, 1)
                       .add("ns_over_loop", ns - baseline_ns, 1)
                       .add("ops_per_sample", ops)
                       .add("repeats", t.repeats));
    return ns;
  };
  reporter.progress("an empty loop, spans with tracing off and on");
  fresh("", false);
  const double loop = add("empty loop",
                          time_op(Device::cpu(), timing,
                                  [] {
                                    for (int i = 0; i < kOps; ++i) do_not_optimize(&i);
                                  }),
                          kOps, 0);
  auto spans = [] {
    for (int i = 0; i < kOps; ++i) {
      const trace::Span span("forward", "train", {{"step", i}});
      do_not_optimize(&span);
    }
  };
  add("span, tracing off", time_op(Device::cpu(), timing, spans), kOps, loop);
  fresh("", true);
  add("span (begin + end), on", time_op(Device::cpu(), timing, spans), kOps, loop);
  fresh("", true);
  add("phases.next(), on",
      time_op(Device::cpu(), timing,
              [] {
                trace::Phases phases("train");
                for (int i = 0; i < kOps; ++i) phases.next("forward");
              }),
      kOps, loop);
  fresh("", true);
  add("instant, on",
      time_op(Device::cpu(), timing,
              [] {
                for (int i = 0; i < kOps; ++i)
                  trace::instant("bucket 3 ready", "ddp", {{"bucket", 3}});
              }),
      kOps, loop);
  reporter.progress("a collective's five moments through the timeline's observer");
  CollectiveInfo info = sample_info();
  // Tracing off installs no observer: the moments cost what they cost without ddp's
  // timeline (unless the process has other observers; this one has none yet).
  add("collective (5 moments), off",
      time_op(Device::cpu(), timing, [&] { collective_moments(info); }), kCollectives, loop);
  fresh("", true);
  attach_trace_observer();
  add("collective (5 moments), on",
      time_op(Device::cpu(), timing, [&] { collective_moments(info); }), kCollectives, loop);
  reporter.section("recording", rows);
}

// The "rank file" section: snapshot, format and write 100000 records.
void file_cost(const BenchOptions& options, const Reporter& reporter) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           fmt::format("ddp_bench_trace_{}", std::random_device{}()))
                              .string();
  reporter.progress("writing a rank file of 100000 records");
  fresh(dir, true);
  for (int i = 0; i < 50000; ++i) {
    const trace::Span span("forward", "train", {{"step", i}});
  }
  std::string path;
  const Timing write =
      time_op(Device::cpu(), options.timing(1, 5), [&] { path = trace::write_file(); });
  const auto bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  std::vector<Row> file;
  file.push_back(Row()
                     .add("records", int64_t{100000})
                     .add("write_ms", write.median_ms, 1)
                     .add("bytes", bytes)
                     .add("ns_per_record", write.median_ms * 1e6 / 100000, 0));
  reporter.section("rank file", file);
  fresh("", false);  // no file at exit
  std::filesystem::remove_all(dir);
}

}  // namespace

int run_trace_bench(const BenchOptions& options, const Reporter& reporter) {
  record_costs(options, reporter);
  file_cost(options, reporter);
  return run_trace_step_bench(options, reporter);
}

}  // namespace ddp::bench
