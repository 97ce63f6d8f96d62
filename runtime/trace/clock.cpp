#include "runtime/trace/clock.h"

#include "runtime/error.h"

#include <algorithm>

namespace ddp::trace {

OffsetBound bound_from_request(int64_t send_ns, int64_t remote_ns, int64_t receive_ns) {
  return {.local_ns = send_ns + (receive_ns - send_ns) / 2,
          .low_ns = remote_ns - receive_ns,
          .high_ns = remote_ns - send_ns};
}

OffsetBound bound_from_round(int64_t my_enter_ns, int64_t my_exit_ns, int64_t ref_enter_ns,
                             int64_t ref_exit_ns) {
  return {.local_ns = my_enter_ns + (my_exit_ns - my_enter_ns) / 2,
          .low_ns = ref_enter_ns - my_exit_ns,
          .high_ns = ref_exit_ns - my_enter_ns};
}

OffsetEstimate estimate_offset(const std::vector<OffsetBound>& bounds) {
  DDP_CHECK(!bounds.empty(), "estimate_offset: no clock measurements");
  int64_t low = bounds.front().low_ns, high = bounds.front().high_ns;
  const OffsetBound* narrowest = &bounds.front();
  int64_t local_sum = 0;
  for (const OffsetBound& b : bounds) {
    DDP_CHECK(b.low_ns <= b.high_ns,
              "estimate_offset: a bound [{}, {}] ns has its low end above its high end (a clock "
              "ran backwards?)",
              b.low_ns, b.high_ns);
    low = std::max(low, b.low_ns);
    high = std::min(high, b.high_ns);
    if (b.high_ns - b.low_ns < narrowest->high_ns - narrowest->low_ns) narrowest = &b;
    local_sum += b.local_ns - bounds.front().local_ns;
  }
  OffsetEstimate e;
  e.local_ns = bounds.front().local_ns + local_sum / static_cast<int64_t>(bounds.size());
  if (low <= high) {
    e.offset_ns = low + (high - low) / 2;
    e.error_ns = (high - low + 1) / 2;
    return e;
  }
  e.intersected = false;
  e.local_ns = narrowest->local_ns;
  e.offset_ns = narrowest->low_ns + (narrowest->high_ns - narrowest->low_ns) / 2;
  e.error_ns = (narrowest->high_ns - narrowest->low_ns + 1) / 2;
  return e;
}

ClockMap::ClockMap(std::vector<ClockSample> samples) : samples_(std::move(samples)) {
  std::stable_sort(samples_.begin(), samples_.end(),
                   [](const auto& a, const auto& b) { return a.local_ns < b.local_ns; });
}

int64_t ClockMap::offset_at(int64_t local_ns) const {
  if (samples_.empty()) return 0;
  if (local_ns <= samples_.front().local_ns) return samples_.front().offset_ns;
  if (local_ns >= samples_.back().local_ns) return samples_.back().offset_ns;
  // The first sample at or after local_ns; the one before it is strictly before.
  const auto after =
      std::lower_bound(samples_.begin(), samples_.end(), local_ns,
                       [](const ClockSample& s, int64_t t) { return s.local_ns < t; });
  const ClockSample& b = *after;
  const ClockSample& a = *(after - 1);
  if (b.local_ns == local_ns) return b.offset_ns;
  const long double f = static_cast<long double>(local_ns - a.local_ns) /
                        static_cast<long double>(b.local_ns - a.local_ns);
  return a.offset_ns +
         static_cast<int64_t>(f * static_cast<long double>(b.offset_ns - a.offset_ns));
}

int64_t offset_at(const std::vector<ClockSample>& samples, int64_t local_ns) {
  return ClockMap(samples).offset_at(local_ns);
}

}  // namespace ddp::trace
