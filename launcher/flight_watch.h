// ddprun's side of the flight recorder (collectives/flight/): per attempt, a
// directory where each local rank maps its region (Note [flight region]),
// read by ddprun without the rank's cooperation, for
//   - the hang detector (Note [hang detector]),
//   - the dumps and the diagnosis when the group is torn down (a failure, a
//     hang, a signal to ddprun, another node's failure),
//   - the straggler report at the end of every multi-rank run.
//
// Note [hang detector]
// The job hangs when no rank of this node made progress (issued or completed
// a collective, or finished a training step) for the hang timeout while at
// least one running rank waits in a collective. Ranks that exited count (they
// make no more progress: the others wait for them in vain). Then ddprun dumps
// every rank, prints the diagnosis (Note [hang diagnosis]) and ends the job
// through launcher/blame.h (Note [hang blame]): the diagnosis's suspects get
// their last progress as `last_progress`, so the blame is "made no progress"
// and the exit status is kNoProgressExitCode (124). The clock restarts when
// every running rank is stopped or ddprun itself was (Note [stop clocks]). A
// rank that computes longer than the timeout while the others wait (rank 0
// saving a large checkpoint) is indistinguishable from a hung one.
//
// Note [default hang timeout]
// Without --hang-timeout, the timeout is the longest collective timeout the
// ranks' communicators have (CommOptions::timeout, from DDP_TIMEOUT_S or
// ProcessGroupOptions::timeout in code; each rank writes it into its region)
// plus 60 s, so the detector never ends what the ranks' own timeouts would
// let run: a wait in a collective times out first, the rank fails, and the
// blame goes to the rank the diagnosis names (Note [blame], the stalled rank
// counts as soon as another fails after it stalled). The detector is the
// backstop for what no timeout catches; --hang-timeout S makes it fire
// sooner. Until some rank's region says its timeout, nothing is detected
// (nothing can wait in a collective before a communicator exists).
//
// Note [dumps from the regions]
// When the group is torn down, ddprun writes every local rank's dump itself,
// from the rank's region, before it signals any rank (the blamed one
// included): a running, stopped, deadlocked or already dead rank all leave
// the same dump, taken at the same moment, with no signal to handle and no
// grace period to wait for. (Asking a live rank to dump, as the issue puts it,
// would add nothing the region does not hold, and a stopped or dead rank
// could not answer.)
//
// Note [region directory]
// Each attempt's regions live in a directory ddprun makes with mkdtemp (mode
// 0700, a name nobody could have made before: ddprun-flight-<pid>-<restart>-
// XXXXXX in /dev/shm) and holds an flock on while it runs. ddprun maps each
// rank_<R> that appears (Note [region file]) and unlinks it, moving to the
// newer region when a rank's program is followed by another, and removes the
// directory at the end. A ddprun that was SIGKILLed leaves its directory; the
// next ddprun removes every such directory of the user's whose pid is gone
// and whose lock nobody holds (a pid alone could be another pid namespace's
// live ddprun that shares /dev/shm; the lock is the same across namespaces).
#pragma once

#include "collectives/flight/diagnosis.h"
#include "collectives/flight/flight_layout.h"
#include "collectives/flight/straggler.h"
#include "launcher/blame.h"

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher {

struct FlightOptions {
  // Where the attempt's region directory goes (Note [region directory]);
  // empty: no watch at all.
  std::string shm_parent;
  int restart = 0;
  std::string dump_dir;  // where dumps go (the ranks' DDP_FLIGHT_DIR too)
  // --hang-timeout; 0: no hang detector; nullopt: Note [default hang timeout].
  std::optional<std::chrono::milliseconds> hang_timeout;
};

inline constexpr std::chrono::milliseconds kHangTimeoutMargin{60000};

// The options of one attempt: the regions in /dev/shm (else $TMPDIR, /tmp);
// the dumps in DDP_FLIGHT_DIR as ddprun got it, else --log-dir, else
// $TMPDIR/ddp_flight-<uid>/<run id> (Note [dump directories]); restart K > 0
// adds restart_<K>/.
FlightOptions flight_options(const std::string& run_id, int restart, const std::string& log_dir,
                             std::optional<std::chrono::milliseconds> hang_timeout);
// Sets DDPRUN_FLIGHT_SHM and DDP_FLIGHT_DIR in a rank's environment ("KEY=VALUE").
void set_flight_environment(std::vector<std::string>& env, const std::string& shm_dir,
                            const std::string& dump_dir);
// Removes the region directories of ddprun processes that are gone (Note
// [region directory]) from `parent` (default: where they go).
void remove_stale_region_dirs(const std::string& parent = "");
// Note [default hang timeout]: 0 while no rank's timeout is known.
std::chrono::milliseconds default_hang_timeout(int64_t longest_collective_timeout_ns);

// What the hang detector knows of one rank (pure input of find_hang).
struct WatchedRank {
  int rank = 0;
  bool exited = false;
  flight::RankStatus status;
};

struct Hang {
  double silent_s = 0;       // since the last progress of any rank
  std::vector<int> waiting;  // running ranks blocked in a collective
};

// Note [hang detector]: nullopt while some rank progressed within `timeout`
// (counted from `clock_restart` at the earliest), or none waits.
std::optional<Hang> find_hang(const std::vector<WatchedRank>& ranks, int64_t now_ns,
                              int64_t timeout_ns, int64_t clock_restart_ns);

// Note [hang on several nodes] (launcher/group.cpp): another node's detector fired
// and its diagnosis named none of its ranks. The running ranks here that wait in no
// collective and made no progress for `timeout` (counted from `clock_restart` at the
// earliest; one that never made any, from `started`, the ranks' start) are the ones
// its ranks wait for.
std::vector<int> find_stalled(const std::vector<WatchedRank>& ranks, int64_t now_ns,
                              int64_t timeout_ns, int64_t clock_restart_ns, int64_t started_ns);

class FlightWatch {
 public:
  // ranks: the global rank of each local rank. Makes the region directory
  // (Note [region directory]).
  FlightWatch(FlightOptions options, std::vector<int> ranks);
  ~FlightWatch();  // unmaps the regions, removes the directory
  FlightWatch(const FlightWatch&) = delete;
  FlightWatch& operator=(const FlightWatch&) = delete;

  bool enabled() const { return !shm_dir_.empty(); }
  const std::string& shm_dir() const { return shm_dir_; }  // "" when not enabled
  // DDPRUN_FLIGHT_SHM and DDP_FLIGHT_DIR for a rank (nothing when not enabled).
  void set_environment(std::vector<std::string>& env) const;
  // Maps the regions that appeared since the last call (Note [region file]).
  void refresh();
  void restart_clock(Clock::time_point now);
  // The hang timeout in force: --hang-timeout, else Note [default hang
  // timeout] from the regions mapped so far; 0: no detection.
  std::chrono::milliseconds hang_timeout() const;
  std::optional<Hang> check_hang(const std::vector<RankRecord>& records, Clock::time_point now);
  // find_stalled over the mapped regions, with the hang timeout in force.
  std::vector<int> stalled_ranks(const std::vector<RankRecord>& records, Clock::time_point now,
                                 Clock::time_point started);
  // The last progress of local rank `index` (its region's), if known.
  std::optional<Clock::time_point> last_progress(size_t index) const;
  // The pid of the process whose recorder writes local rank `index`'s region (the
  // rank's, or one it started); nullopt while no region is mapped (no recorder yet).
  std::optional<int64_t> recorder_pid(size_t index) const;
  // Where the ranks write their dumps (their DDP_FLIGHT_DIR).
  const std::string& dump_dir() const { return options_.dump_dir; }

  // What a capture is for: its diagnosis's wording (DiagnosisOptions::hang) and
  // the straggler report's (Note [straggler report after a failure]) follow it.
  enum class Occasion { failure, hang };
  // Snapshots every mapped rank, writes the dumps and diagnoses, once (Note
  // [dumps from the regions]); later calls do nothing.
  void capture(const std::vector<RankRecord>& records, const std::string& why,
               Occasion occasion = Occasion::failure);
  bool captured() const { return captured_; }
  // --on-failure continue: the group went on after a capture, so the next
  // trouble gets a capture (dumps, diagnosis) of its own.
  void allow_next_capture() { captured_ = false; }
  const flight::Diagnosis& diagnosis() const { return diagnosis_; }
  // The diagnosis covers only this node's ranks of a larger world.
  bool partial_view() const { return partial_view_; }
  // Whether global rank `rank`'s captured records show a collective that
  // failed or timed out on it.
  bool failed_in_collective(int rank) const;
  // The diagnosis and where the dumps are, for the failure summary.
  std::vector<std::string> summary_lines() const;
  // Note [straggler report]; "" with fewer than two ranks to compare. The ranks in
  // `left_out` are not compared: under --on-failure continue a rank that left the
  // group ran only the first steps (the slowest: warm-up), so its average says
  // nothing about the others.
  // `options`: Note [straggler report after a failure].
  std::string straggler_line(const std::vector<int>& left_out = {},
                             const flight::StragglerOptions& options = {}) const;

 private:
  struct Region {
    const void* base = nullptr;
    size_t bytes = 0;
  };
  // The status of a mapped region; nullopt when unmapped or unreadable (a
  // rank's memory never takes ddprun down).
  std::optional<flight::RankStatus> status(size_t index) const;
  std::vector<WatchedRank> watched(const std::vector<RankRecord>& records) const;
  std::vector<flight::RankSnapshot> snapshots(const std::vector<RankRecord>& records) const;
  void unmap(Region& region);

  FlightOptions options_;
  std::vector<int> ranks_;
  std::string shm_dir_;          // Note [region directory]
  int lock_fd_ = -1;             // its flock
  std::vector<Region> regions_;  // by local rank; base null until mapped
  int64_t clock_restart_ns_ = 0;
  bool captured_ = false;
  bool partial_view_ = false;
  int dumps_written_ = 0;
  std::string dump_error_;
  flight::Diagnosis diagnosis_;
  std::vector<flight::RankSnapshot> captured_snapshots_;
};

}  // namespace ddp::launcher
