// bench flight: what the flight recorder (collectives/flight/flight_recorder.h)
// adds to each collective: the five moments of a collective that its caller
// waits for (enqueued, started, wait_begin, completed, wait_end) told through
// notify_collective with no observer, with an observer that does nothing (the
// registry's share) and with a flight recorder of 2000 records, samples
// interleaved. The 4 KiB shm all_reduce it is measured
// against: `ddprun -n 2 bench allreduce` (docs/flight_recorder.md).
#include "bench/subcommands.h"
#include "collectives/collective_events.h"
#include "collectives/flight/flight_recorder.h"

#include <memory>

namespace ddp::bench {
namespace {

constexpr int kCollectivesPerCall = 1000;

void run_collectives(CollectiveInfo& info) {
  for (int i = 0; i < kCollectivesPerCall; ++i) {
    ++info.sequence;
    notify_collective(info, CollectiveState::enqueued);
    notify_collective(info, CollectiveState::started);
    notify_collective(info, CollectiveState::wait_begin);
    notify_collective(info, CollectiveState::completed);
    notify_collective(info, CollectiveState::wait_end);
  }
}

// The registry's own cost, apart from the recorder's.
class NoopObserver : public CollectiveObserver {
 public:
  void on_collective(const CollectiveEvent&) noexcept override {}
};

}  // namespace

int run_flight_bench(const BenchOptions& options, const Reporter& reporter) {
  CollectiveInfo info{.comm_id = 0,
                      .rank = 0,
                      .world_size = 2,
                      .backend = "shm",
                      .kind = CollectiveKind::all_reduce,
                      .op = ReduceOp::avg,
                      .count = 1024,
                      .dtype = DType::f32,
                      .bytes = 4096,
                      .label = "ddp bucket 3"};
  flight::RecorderOptions o{.capacity = flight::kDefaultCapacity,
                            .shm_dir = "",
                            .dump_dir = "/nonexistent",
                            .handle_sigusr1 = false,
                            .dump_on_failure = false};
  auto recorder = std::make_shared<flight::FlightRecorder>(o, 0, 2);
  auto noop = std::make_shared<NoopObserver>();
  DDP_CHECK(!collective_observers_present(),
            "bench flight measures an empty observer registry first; run it alone");
  const auto timings = time_interleaved(Device::cpu(), options.timing(3, 15, 20.0),
                                        {[&] { run_collectives(info); },
                                         [&] {
                                           add_collective_observer(noop);
                                           run_collectives(info);
                                           remove_collective_observer(noop.get());
                                         },
                                         [&] {
                                           add_collective_observer(recorder);
                                           run_collectives(info);
                                           remove_collective_observer(recorder.get());
                                         }});
  const double per = 1e6 / kCollectivesPerCall;  // ms per call -> ns per collective
  const double none = timings[0].min_ms * per, with = timings[2].min_ms * per;
  std::vector<Row> rows;
  const char* names[] = {"none", "an empty observer", "flight recorder (2000)"};
  for (size_t i = 0; i < timings.size(); ++i) {
    rows.push_back(Row()
                       .add("observers", names[i])
                       .add("ns_per_collective", timings[i].min_ms * per, 1)
                       .add("median_ns", timings[i].median_ms * per, 1));
  }
  reporter.section("flight recorder cost per collective (5 moments)", rows);
  reporter.note(
      fmt::format("the flight recorder adds {:.0f} ns per collective (minimum of {} "
                  "samples of {} collectives)",
                  with - none, timings[2].repeats, kCollectivesPerCall));
  return 0;
}

}  // namespace ddp::bench
