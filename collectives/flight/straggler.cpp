#include "collectives/flight/straggler.h"

#include "collectives/flight/diagnosis.h"

#include "runtime/fmt.h"

#include <algorithm>

namespace ddp::flight {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string figures(const std::vector<RankActivity>& ranks, double RankActivity::*field) {
  std::string out;
  if (ranks.size() <= 8) {
    for (const RankActivity& r : ranks)
      out += fmt::format("{}{:.3g}", out.empty() ? "" : " ", r.*field);
    return out + " s";
  }
  const auto [lo, hi] =
      std::minmax_element(ranks.begin(), ranks.end(),
                          [&](const auto& a, const auto& b) { return a.*field < b.*field; });
  std::vector<double> values;
  for (const RankActivity& r : ranks) values.push_back(r.*field);
  return fmt::format("{:.3g}-{:.3g} s (median {:.3g})", (*lo).*field, (*hi).*field, median(values));
}

}  // namespace

RankActivity activity_of(int rank, const RankStatus& s) {
  RankActivity a;
  a.rank = rank;
  a.steps = s.steps;
  if (s.steps > 0) {
    int64_t step_ns = s.step_ns, blocked_ns = s.step_blocked_ns;
    if (s.steps > 1 && s.first_step_ns > 0) {  // the first step is a warm-up: left out
      step_ns -= s.first_step_ns;
      blocked_ns -= s.first_step_blocked_ns;
      a.first_step_left_out = true;
    }
    a.wait_s = seconds(std::max<int64_t>(0, blocked_ns));
    a.compute_s = std::max(0.0, seconds(step_ns - blocked_ns));
  } else {
    a.wait_s = seconds(s.blocked_ns);
    const int64_t span = s.first_ns > 0 && s.last_ns > s.first_ns ? s.last_ns - s.first_ns : 0;
    a.compute_s = std::max(0.0, seconds(span - s.blocked_ns));
  }
  return a;
}

namespace {

// "computes 40% more than the median (0.7 s vs 0.5 s)"; a median of 0 has no ratio.
std::string excess_text(double value, double median, const char* unit) {
  if (median <= 0) return fmt::format("computes {:.3g} s{}, the median 0", value, unit);
  return fmt::format("computes {:.0f}% more than the median ({:.3g} s vs {:.3g} s{})",
                     100 * (value / median - 1), value, median, unit);
}

}  // namespace

StragglerReport straggler_report(std::vector<RankActivity> ranks, const StragglerOptions& options) {
  const double threshold = options.threshold;
  StragglerReport out;
  std::erase_if(ranks, [](const RankActivity& r) { return r.compute_s <= 0 && r.wait_s <= 0; });
  std::sort(ranks.begin(), ranks.end(), [](auto& a, auto& b) { return a.rank < b.rank; });
  out.ranks = ranks;
  if (ranks.size() < 2) return out;
  int64_t min_steps = ranks.front().steps, max_steps = ranks.front().steps;
  for (const RankActivity& r : ranks) {
    min_steps = std::min(min_steps, r.steps);
    max_steps = std::max(max_steps, r.steps);
  }
  // Note [straggler report]: uneven shares compare compute per step.
  out.per_step = min_steps > 0 && min_steps != max_steps;
  auto compared = [&](const RankActivity& r) {
    return out.per_step ? r.compute_s / static_cast<double>(r.counted_steps()) : r.compute_s;
  };
  std::vector<double> compute;
  for (const RankActivity& r : ranks) compute.push_back(compared(r));
  out.median_compute_s = median(compute);
  for (const RankActivity& r : ranks) {
    const double c = compared(r), excess = c - out.median_compute_s;
    const double total_excess =
        out.per_step ? excess * static_cast<double>(r.counted_steps()) : excess;
    if (c > (1 + threshold) * out.median_compute_s && total_excess >= kMinExcessS)
      out.stragglers.push_back(r.rank);
  }
  // Note [straggler report after a failure]
  const bool uneven = out.per_step && (!options.after_failure || max_steps - min_steps > 1);
  const bool others_too = !out.stragglers.empty();
  if (options.after_failure) {
    std::erase_if(out.stragglers, [&](int r) {
      return std::find(options.blamed.begin(), options.blamed.end(), r) == options.blamed.end();
    });
  }
  std::vector<int> listed;
  for (const RankActivity& r : ranks) listed.push_back(r.rank);
  const std::string over = max_steps == 0 ? "from the first collective to the last"
                           : min_steps == max_steps
                               ? fmt::format("over {} steps", max_steps)
                               : fmt::format("over {}-{} steps", min_steps, max_steps);
  std::vector<RankActivity> shown = ranks;
  if (out.per_step) {
    for (RankActivity& r : shown) r.compute_s = compared(r);
  }
  out.text = fmt::format(
      "straggler report{} ({}, {}{}): compute {}{}, waiting in collectives {}; ",
      options.after_failure ? " up to the failure (a stalled rank's stall is in no figure)" : "",
      rank_list(listed), over,
      uneven         ? ", uneven shares: compute per step compared"
      : out.per_step ? ", compute per step compared"
                     : "",
      out.per_step ? "per step " : "", figures(shown, &RankActivity::compute_s),
      figures(ranks, &RankActivity::wait_s));
  const char* unit = out.per_step ? " per step" : "";
  if (out.stragglers.empty() && others_too) {
    out.text +=
        "no rank named: the figures end before the failure, and the rank it blames is "
        "not among those above the median";
    return out;
  }
  if (out.stragglers.empty()) {
    out.text += fmt::format("no rank computes more than {:.0f}% above the median ({:.3g} s{})",
                            100 * threshold, out.median_compute_s, unit);
    return out;
  }
  for (size_t i = 0; i < out.stragglers.size(); ++i) {
    const int rank = out.stragglers[i];
    const auto& r =
        *std::find_if(ranks.begin(), ranks.end(), [&](auto& x) { return x.rank == rank; });
    out.text += fmt::format("{}rank {} {}", i == 0 ? "" : ", ", rank,
                            excess_text(compared(r), out.median_compute_s, unit));
  }
  out.text +=
      out.stragglers.size() == 1 ? ": the others wait for it" : ": the others wait for them";
  return out;
}

}  // namespace ddp::flight
