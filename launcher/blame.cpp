#include "launcher/blame.h"

#include "collectives/flight/diagnosis.h"
#include "launcher/process.h"

#include <sys/wait.h>
#include "runtime/fmt.h"

#include <algorithm>

namespace ddp::launcher {
namespace {

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

bool failed_on_its_own(const RankRecord& r) {
  if (!r.wait_status || r.signalled) return false;
  return !WIFEXITED(*r.wait_status) || WEXITSTATUS(*r.wait_status) != 0;
}

struct Candidate {
  size_t index = 0;
  BlameReason reason = BlameReason::failed;
  Clock::time_point since;  // when its trouble began
};

std::optional<size_t> first_failure(const std::vector<RankRecord>& ranks) {
  std::optional<size_t> first;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (failed_on_its_own(ranks[i]) && (!first || ranks[i].exit_time < ranks[*first].exit_time))
      first = i;
  }
  return first;
}

// The candidates of a rank still running: stopped, or making no progress,
// past its limit at `now` or before the first failure (Note [blame]).
// `paused`: every running rank is stopped, and no limit applies (Note [stop clocks]).
void add_stuck(std::vector<Candidate>& out, size_t i, const RankRecord& r, Clock::time_point now,
               const std::optional<Clock::time_point>& failure_time, const BlamePolicy& policy,
               bool paused) {
  if (r.wait_status) return;
  if (r.stopped_since) {
    const auto since = *r.stopped_since;
    const auto counted = std::max(since, r.stop_clock_restart.value_or(since));
    const bool limit =
        !paused && policy.stopped_timeout.count() > 0 && now - counted >= policy.stopped_timeout;
    if (limit || (failure_time && since <= *failure_time))
      out.push_back({i, BlameReason::stopped, since});
  }
  if (r.last_progress) {
    const auto since = *r.last_progress;
    const bool limit =
        policy.progress_timeout.count() > 0 && now - since >= policy.progress_timeout;
    if (limit || (failure_time && since <= *failure_time))
      out.push_back({i, BlameReason::no_progress, since});
  }
}

std::string failure_text(const RankRecord& r) {
  return fmt::format("rank {} (pid {}) failed: {} after {:.1f} s", r.rank, r.pid,
                     describe_status(*r.wait_status), seconds(r.exit_time - r.start));
}

std::string stuck_text(const Candidate& c, const RankRecord& r, Clock::time_point now,
                       const RankRecord* failure, const BlamePolicy& policy) {
  const std::string who = fmt::format("rank {} (pid {})", r.rank, r.pid);
  const std::string state = c.reason == BlameReason::stopped
                                ? fmt::format("was stopped by {}", signal_name(r.stop_signal))
                                : std::string("made no progress");
  if (failure != nullptr) {
    return fmt::format(
        "{} {} {:.1f} s before {}, and still {}: the others most likely failed waiting for it", who,
        state, seconds(failure->exit_time - c.since), failure_text(*failure),
        c.reason == BlameReason::stopped ? "is stopped" : "makes none");
  }
  if (c.reason == BlameReason::stopped) {
    return fmt::format(
        "{} has been stopped by {} for {:.1f} s (--stopped-timeout {:g} s; 0 waits "
        "for ever)",
        who, signal_name(r.stop_signal), seconds(now - c.since), seconds(policy.stopped_timeout));
  }
  return fmt::format("{} made no progress for {:.1f} s (--hang-timeout {:g} s)", who,
                     seconds(now - c.since), seconds(policy.progress_timeout));
}

}  // namespace

bool every_running_rank_stopped(const std::vector<RankRecord>& ranks) {
  bool any = false;
  for (const RankRecord& r : ranks) {
    if (r.wait_status) continue;
    if (!r.stopped_since) return false;
    any = true;
  }
  return any;
}

bool job_paused(const std::vector<RankRecord>& ranks, const BlamePolicy& policy) {
  return !policy.across_nodes && every_running_rank_stopped(ranks);
}

bool stop_clocks_restart(const std::vector<RankRecord>& ranks, Clock::time_point previous,
                         Clock::time_point now, const BlamePolicy& policy) {
  return job_paused(ranks, policy) || now - previous > kStopClockGap;
}

std::optional<Blame> find_blame(const std::vector<RankRecord>& ranks, Clock::time_point now,
                                const BlamePolicy& policy) {
  const auto failure = first_failure(ranks);
  std::optional<Clock::time_point> failure_time;
  std::vector<Candidate> candidates;
  if (failure) {
    failure_time = ranks[*failure].exit_time;
    candidates.push_back({*failure, BlameReason::failed, *failure_time});
  }
  const bool paused = job_paused(ranks, policy);
  for (size_t i = 0; i < ranks.size(); ++i)
    add_stuck(candidates, i, ranks[i], now, failure_time, policy, paused);
  if (candidates.empty()) return std::nullopt;
  const Candidate* pick = &candidates.front();
  for (const Candidate& c : candidates) {
    if (c.since < pick->since || (c.since == pick->since && c.index < pick->index)) pick = &c;
  }
  const RankRecord& r = ranks[pick->index];
  Blame blame;
  blame.index = pick->index;
  blame.reason = pick->reason;
  if (pick->reason == BlameReason::failed) {
    blame.exit_code = exit_code_of(*r.wait_status);
    blame.what = failure_text(r);
    return blame;
  }
  blame.exit_code =
      pick->reason == BlameReason::stopped ? 128 + r.stop_signal : kNoProgressExitCode;
  blame.what = stuck_text(*pick, r, now, failure ? &ranks[*failure] : nullptr, policy);
  return blame;
}

Blame blame_hang(const std::vector<RankRecord>& ranks, Clock::time_point now,
                 const BlamePolicy& policy, const HangVerdict& hang) {
  if (auto blame = find_blame(ranks, now, policy)) return *blame;
  Blame blame;
  blame.reason = BlameReason::no_progress;
  blame.exit_code = kNoProgressExitCode;
  const std::string silent =
      fmt::format("no rank made progress for {:.1f} s (--hang-timeout {:g} s)", hang.silent_s,
                  seconds(policy.progress_timeout));
  const std::string waiting = hang.waiting.empty()
                                  ? std::string("the others wait")
                                  : fmt::format("{} wait{}", flight::rank_list(hang.waiting),
                                                hang.waiting.size() == 1 ? "s" : "");
  if (!hang.suspects.empty()) {
    blame.index = hang.suspects.front();
    const RankRecord& r = ranks.at(blame.index);
    const std::string state =
        r.wait_status ? fmt::format("exited ({}) {:.1f} s ago", describe_status(*r.wait_status),
                                    seconds(now - r.exit_time))
                      : std::string("is named by the diagnosis");
    blame.what = fmt::format("rank {} (pid {}) {} while {} for it in a collective; {}", r.rank,
                             r.pid, state, waiting, silent);
    return blame;
  }
  blame.index = hang.waiting_index.empty() ? 0 : hang.waiting_index.front();
  const RankRecord& r = ranks.at(blame.index);
  blame.what = fmt::format(
      "{}, and the diagnosis names no rank of this node: rank {} (pid {}), the first that "
      "waits, stands for the hang",
      silent, r.rank, r.pid);
  return blame;
}

}  // namespace ddp::launcher
