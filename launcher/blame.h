// Which local rank ends the job, and why: one pure function over what the
// agent knows of each rank, so the failure summary, the exit status and the
// message published to the other nodes all come from one decision.
//
// Note [blame]
// The rank to blame is the one whose trouble began first:
//   - a rank that exited non-zero or died of a signal on its own (not from a
//     signal ddprun sent it): its trouble began when it exited;
//   - a rank stopped by a signal (SIGSTOP, SIGTSTP, ...) and not continued:
//     its trouble began when it stopped;
//   - a rank that made no progress (a hang detector's report): its trouble
//     began at its last progress.
// A stopped or stalled rank counts once it passed its limit (--stopped-timeout,
// the progress timeout), or as soon as another rank fails after it stopped or
// stalled: in a group that runs collectives in lockstep, the others'
// collectives time out waiting for it, and blaming the first of them (the
// rank whose collective timed out first) would send the user to the wrong
// process. Which ranks stalled is the hang diagnosis's word: ddprun sets
// `last_progress` only for its suspects, when the job hangs, or when a rank
// fails in a collective (it timed out or failed there) and the diagnosis
// names other ranks, still running, as the ones that held it back
// (launcher/group.cpp). Ties go to the lower local rank.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher {

using Clock = std::chrono::steady_clock;

// What the agent knows of one local rank.
struct RankRecord {
  int rank = 0;  // global
  pid_t pid = -1;
  Clock::time_point start;
  std::optional<int> wait_status;  // once it exited (waitpid's status)
  Clock::time_point exit_time;     // when the exit was seen
  bool signalled = false;          // ddprun sent it a signal (it did not fail on its own)
  std::optional<Clock::time_point> stopped_since;  // stopped and not continued
  int stop_signal = 0;                             // what stopped it, with stopped_since
  // When --stopped-timeout last started counting again for this stop (Note
  // [stop clocks]); unset: it counts from stopped_since.
  std::optional<Clock::time_point> stop_clock_restart;
  // The last time the rank was seen to make progress; unset: no such report.
  // Set by ddprun for the hang diagnosis's suspects only (Note [blame]).
  std::optional<Clock::time_point> last_progress;
};

struct BlamePolicy {
  std::chrono::milliseconds stopped_timeout{30000};  // 0: a stopped rank alone never ends the job
  // 0: a progress report alone never ends the job (it still counts before a failure)
  std::chrono::milliseconds progress_timeout{0};
  // Other nodes run ranks too: this node's ranks all stopped is not a pause of
  // the job, since the other nodes' ranks wait for them (Note [stop clocks]).
  bool across_nodes = false;
};

enum class BlameReason { failed, stopped, no_progress };

struct Blame {
  size_t index = 0;  // into the records
  BlameReason reason = BlameReason::failed;
  int exit_code = 1;  // ddprun's exit status: the rank's; 128 + the stop signal; 124
  std::string what;   // "rank 1 (pid 42) has been stopped by SIGSTOP for 30.0 s (...)"
};

// Exit status for a rank blamed for making no progress (timeout(1)'s).
inline constexpr int kNoProgressExitCode = 124;

// Note [stop clocks]
// --stopped-timeout is for one rank stopped while the others wait for it in a
// collective that will time out. Two kinds of stop are not that:
//   - every running rank of a one-node job is stopped (`pkill -STOP train`, a
//     whole-job pause, or the last rank left running stopped): nothing waits, no
//     collective can time out, and the pause is the user's; the job is not ended
//     for it, and ddprun says so when the stop begins. The clocks restart while
//     it lasts, so a rank left stopped when the others continue gets a full
//     --stopped-timeout from then. Across nodes this is no pause: the other
//     nodes' ranks wait for this node's (one rank per node is common), so the
//     deadline applies (BlamePolicy::across_nodes).
//   - ddprun itself was stopped: SLURM suspends a job with SIGSTOP to all its
//     processes in no set order, and on resume ddprun may run before its
//     ranks are continued. A gap between two monitor iterations far longer
//     than their interval (kStopClockGap) means ddprun did not run; the clocks
//     restart then, so the suspension is not counted against a rank.
// With another node still running, its collectives do time out and that node
// fails; this node then stops on the failure it publishes (Note [two stores]).

// A gap between monitor iterations (their interval is 250 ms) that means
// ddprun itself was not running.
inline constexpr std::chrono::milliseconds kStopClockGap{2000};

// Every rank still running is stopped (and at least one runs).
bool every_running_rank_stopped(const std::vector<RankRecord>& ranks);
// A whole-job pause by Note [stop clocks]: every running rank stopped, one node.
bool job_paused(const std::vector<RankRecord>& ranks, const BlamePolicy& policy);

// Whether the stopped ranks' clocks restart at `now`, the previous monitor
// iteration having been at `previous` (Note [stop clocks]).
bool stop_clocks_restart(const std::vector<RankRecord>& ranks, Clock::time_point previous,
                         Clock::time_point now, const BlamePolicy& policy);

// The rank to blame at `now`, or nullopt while nothing is wrong (Note [blame]).
std::optional<Blame> find_blame(const std::vector<RankRecord>& ranks, Clock::time_point now,
                                const BlamePolicy& policy);

// Note [hang blame]
// When the hang detector fires, find_blame() decides over records in which
// the diagnosis's suspects carry their last progress (a suspect that never
// issued a collective: its start). When that blames nobody, a hung job must
// still end as a failure (exit 124, a summary, the failure published to the
// other nodes), never as a success: the first suspect is blamed (one that
// exited with status 0 while the others wait for it, an uneven last batch),
// else the first rank that waits (no rank of this node is suspect).
struct HangVerdict {
  double silent_s = 0;
  std::vector<int> waiting;           // global ranks that wait in a collective
  std::vector<size_t> suspects;       // indices into the records, the diagnosis's order
  std::vector<size_t> waiting_index;  // `waiting` as indices into the records
};
Blame blame_hang(const std::vector<RankRecord>& ranks, Clock::time_point now,
                 const BlamePolicy& policy, const HangVerdict& hang);

}  // namespace ddp::launcher
