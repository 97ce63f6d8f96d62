#include "bench/timing.h"

#include "runtime/error.h"
#include "runtime/stream.h"

#include <algorithm>
#include <cmath>

namespace ddp::bench {

Timing summarize(std::vector<double> samples_ms, int calls_per_sample) {
  DDP_ASSERT(!samples_ms.empty(), "summarize needs at least one sample");
  std::sort(samples_ms.begin(), samples_ms.end());
  const size_t n = samples_ms.size();
  const double calls = static_cast<double>(calls_per_sample);
  Timing t;
  t.repeats = static_cast<int>(n);
  t.calls_per_sample = calls_per_sample;
  t.median_ms =
      (n % 2 == 1 ? samples_ms[n / 2] : 0.5 * (samples_ms[n / 2 - 1] + samples_ms[n / 2])) / calls;
  t.min_ms = samples_ms.front() / calls;
  const size_t p90_rank = static_cast<size_t>(std::ceil(0.9 * static_cast<double>(n)));
  t.p90_ms = samples_ms[std::max<size_t>(p90_rank, 1) - 1] / calls;
  return t;
}

namespace {

// One timed callable: its event pair is made once and reused for every sample.
class Sampler {
 public:
  Sampler(const Device& device, const std::function<void()>& fn)
      : stream_(current_stream(device)), start_(device), end_(device), fn_(fn) {}

  double sample_ms(int calls) {
    start_.record(stream_);
    for (int i = 0; i < calls; ++i) fn_();
    end_.record(stream_);
    end_.synchronize();
    return static_cast<double>(start_.elapsed_ms(end_));
  }
  void warm_up(int calls) {
    for (int i = 0; i < calls; ++i) fn_();
    stream_.synchronize();
  }

 private:
  Stream stream_;
  Event start_;
  Event end_;
  const std::function<void()>& fn_;
};

// Calls per sample so that a sample lasts options.min_sample_ms: measured on a
// growing batch (a single microsecond call says little on a busy machine).
int calibrate_calls(Sampler& sampler, const TimingOptions& options) {
  if (options.min_sample_ms <= 0.0) return 1;
  const int max_calls = std::max(options.max_calls_per_sample, 1);
  int calls = 1;
  double ms = sampler.sample_ms(calls);
  while (ms < 0.25 * options.min_sample_ms && calls < max_calls) {
    calls = std::min(calls * 4, max_calls);
    ms = sampler.sample_ms(calls);
  }
  const double per_call_ms = std::max(ms / calls, 1e-9);
  const double wanted = std::ceil(options.min_sample_ms / per_call_ms);
  return static_cast<int>(std::clamp(wanted, 1.0, static_cast<double>(max_calls)));
}

}  // namespace

std::vector<Timing> time_interleaved(const Device& device, const TimingOptions& options,
                                     const std::vector<std::function<void()>>& fns) {
  DDP_CHECK(options.repeats >= 1, "repeats must be at least 1, got {}", options.repeats);
  DDP_CHECK(options.warmup >= 0, "warmup must be 0 or more, got {}", options.warmup);
  std::vector<Sampler> samplers;
  samplers.reserve(fns.size());
  for (const auto& fn : fns) samplers.emplace_back(device, fn);

  // Each callable gets its own batch size: the callables compared may differ a
  // lot in cost (a cached allocation and a cudaMalloc).
  std::vector<int> calls;
  for (Sampler& sampler : samplers) {
    sampler.warm_up(options.warmup);
    calls.push_back(calibrate_calls(sampler, options));
  }
  std::vector<std::vector<double>> samples(fns.size());
  // Odd repeats run the callables in reverse order (a b, b a, a b, ...), so
  // that none always follows the same neighbour.
  const size_t n = samplers.size();
  for (int r = 0; r < options.repeats; ++r) {
    for (size_t j = 0; j < n; ++j) {
      const size_t i = r % 2 == 0 ? j : n - 1 - j;
      samples[i].push_back(samplers[i].sample_ms(calls[i]));
    }
  }
  std::vector<Timing> timings;
  for (size_t i = 0; i < samplers.size(); ++i) {
    timings.push_back(summarize(std::move(samples[i]), calls[i]));
  }
  return timings;
}

Timing time_op(const Device& device, const TimingOptions& options,
               const std::function<void()>& fn) {
  return time_interleaved(device, options, {fn}).front();
}

}  // namespace ddp::bench
