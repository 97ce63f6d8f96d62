#include "trainer/straggler_stats.h"

#include "collectives/collective_events.h"
#include "collectives/flight/flight_recorder.h"
#include "collectives/flight/straggler.h"
#include "runtime/ops/ops.h"

namespace ddp::train {
namespace {

flight::RankStatus status_now() {
  const flight::FlightRecorder* r = flight::recorder();
  return r != nullptr ? r->status() : flight::RankStatus{};
}

}  // namespace

void StragglerMeter::start() {
  start_ = status_now();
}

StragglerStats StragglerMeter::measure(Communicator& comm) const {
  const bool recording = flight::recorder() != nullptr;
  const flight::RankStatus now = status_now();
  const int64_t steps = now.steps - start_.steps;
  const double per_step = steps > 0 ? 1e-6 / static_cast<double>(steps) : 0.0;
  const double wait_ms =
      static_cast<double>(now.step_blocked_ns - start_.step_blocked_ns) * per_step;
  const double compute_ms = static_cast<double>(now.step_ns - start_.step_ns) * per_step - wait_ms;
  // -1: this rank has no figures (no recorder, or no step since start()).
  const bool have = recording && steps > 0;
  constexpr int kFields = 3;  // compute and wait per step, steps (Note [straggler report])
  Tensor mine =
      from_vector<float>({have ? static_cast<float>(compute_ms) : -1.0f,
                          have ? static_cast<float>(wait_ms) : -1.0f, static_cast<float>(steps)},
                         {kFields}, {.device = comm.device()});
  Tensor all = empty({kFields * comm.size()}, {.device = comm.device()});
  {
    const CollectiveLabel labelled("straggler stats");
    comm.all_gather(mine, all)->wait();
  }
  const std::vector<float> v = all.to_vector<float>();
  StragglerStats out;
  std::vector<flight::RankActivity> ranks;
  for (int r = 0; r < comm.size(); ++r) {
    const size_t at = static_cast<size_t>(kFields * r);
    const float c = v[at], w = v[at + 1];
    const auto n = static_cast<int64_t>(v[at + 2]);
    if (c < 0) return {};  // some rank has no figures: none are shown
    out.compute_ms.push_back(c);
    out.wait_ms.push_back(w);
    const auto total = static_cast<double>(n) / 1e3;  // totals: the report's millisecond floor
    ranks.push_back({.rank = r, .compute_s = c * total, .wait_s = w * total, .steps = n});
  }
  out.stragglers = flight::straggler_report(ranks).stragglers;
  return out;
}

}  // namespace ddp::train
