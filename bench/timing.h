// Timing of benchmark steps with ddp::Event pairs on a device's current stream.
//
// Each sample records a start event, runs the callable `calls_per_sample` times,
// records an end event and synchronizes on it; the sample's time divided by the
// calls is one per-call time. On the CPU the events record the host clock, so
// the same code times CPU work (and host-side work such as allocation when the
// CPU device is passed).
#pragma once

#include "runtime/device.h"

#include <functional>
#include <vector>

namespace ddp::bench {

struct TimingOptions {
  int warmup = 2;    // untimed calls first (first-touch, caches, cuBLAS heuristics)
  int repeats = 10;  // timed samples
  // When > 0, each sample runs the callable back to back often enough to last at
  // least this long (measured once after the warmup), so that microsecond steps
  // are not timed at the resolution and overhead of the clock.
  double min_sample_ms = 0.0;
  int max_calls_per_sample = 100000;
};

struct Timing {  // per call, in milliseconds
  double median_ms = 0.0;
  double min_ms = 0.0;
  double p90_ms = 0.0;
  int repeats = 0;
  int calls_per_sample = 1;
};

// Median (mean of the middle two for an even count), minimum and nearest-rank p90.
Timing summarize(std::vector<double> samples_ms, int calls_per_sample);

Timing time_op(const Device& device, const TimingOptions& options, const std::function<void()>& fn);

// Times several callables with their samples interleaved (a b, b a, a b, ...),
// so that load from other processes or clock changes on a shared machine
// affect each alike: the fair way to compare ours with a bare library call.
std::vector<Timing> time_interleaved(const Device& device, const TimingOptions& options,
                                     const std::vector<std::function<void()>>& fns);

// Keeps the compiler from removing work whose result is otherwise unused
// (for example a malloc/free pair).
inline void do_not_optimize(const void* p) {
  asm volatile("" : : "g"(p) : "memory");
}

// bytes / ms in GB/s (10^9 bytes per second); 0 for a zero time.
inline double gb_per_s(double bytes, double ms) {
  return ms > 0.0 ? bytes / (ms * 1e6) : 0.0;
}

}  // namespace ddp::bench
