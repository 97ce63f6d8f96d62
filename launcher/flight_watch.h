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
// a collective, or finished a training step) for --hang-timeout seconds while
// at least one running rank waits in a collective. Ranks that exited count
// (they make no more progress: the others wait for them in vain). Then ddprun
// dumps every rank, prints the diagnosis (Note [hang diagnosis]) and ends the
// job through launcher/blame.h: the diagnosis's suspects get their last
// progress as `last_progress`, so the blame is "made no progress" and the exit
// status is kNoProgressExitCode (124). The clock restarts when every running
// rank is stopped or ddprun itself was (Note [stop clocks]). A rank that
// computes longer than the timeout while the others wait (rank 0 saving a
// large checkpoint) is indistinguishable from a hung one: the default timeout
// is long (docs/flight_recorder.md).
//
// Note [dumps from the regions]
// When the group is torn down, ddprun writes every local rank's dump itself,
// from the rank's region, before it signals any rank: a running, stopped,
// deadlocked or already dead rank all leave the same dump, taken at the same
// moment, with no signal to handle and no grace period to wait for. (Asking a
// live rank to dump, as the issue puts it, would add nothing the region does
// not hold, and a stopped or dead rank could not answer.)
#pragma once

#include "collectives/flight/diagnosis.h"
#include "collectives/flight/flight_layout.h"
#include "launcher/blame.h"

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher {

struct FlightOptions {
  std::string shm_dir;   // where the ranks map their regions; empty: no watch at all
  std::string dump_dir;  // where dumps go (the ranks' DDP_FLIGHT_DIR too)
  std::chrono::milliseconds hang_timeout{0};  // 0: no hang detector
};

// The directories of one attempt: the regions in /dev/shm (else $TMPDIR, /tmp)
// under a name with ddprun's pid; the dumps in DDP_FLIGHT_DIR as ddprun got
// it, else --log-dir, else $TMPDIR/ddp_flight/<run id>; restart K > 0 adds
// restart_<K>/.
FlightOptions flight_options(const std::string& run_id, int restart, const std::string& log_dir,
                             std::chrono::milliseconds hang_timeout);
// Sets DDPRUN_FLIGHT_SHM and DDP_FLIGHT_DIR in a rank's environment ("KEY=VALUE").
void set_flight_environment(std::vector<std::string>& env, const FlightOptions& options);
// Removes region directories of ddprun processes that are gone (SIGKILLed).
void remove_stale_region_dirs();

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

class FlightWatch {
 public:
  // ranks: the global rank of each local rank. Makes options.shm_dir.
  FlightWatch(FlightOptions options, std::vector<int> ranks);
  ~FlightWatch();  // unmaps and removes the regions
  FlightWatch(const FlightWatch&) = delete;
  FlightWatch& operator=(const FlightWatch&) = delete;

  bool enabled() const { return !options_.shm_dir.empty(); }
  // Maps the regions that appeared since the last call.
  void refresh();
  void restart_clock(Clock::time_point now);
  std::optional<Hang> check_hang(const std::vector<RankRecord>& records, Clock::time_point now);
  // The last progress of local rank `index` (its region's), if known.
  std::optional<Clock::time_point> last_progress(size_t index) const;

  // Snapshots every mapped rank, writes the dumps and diagnoses, once (Note
  // [dumps from the regions]); later calls do nothing.
  void capture(const std::vector<RankRecord>& records, const std::string& why);
  const flight::Diagnosis& diagnosis() const { return diagnosis_; }
  // The diagnosis and where the dumps are, for the failure summary.
  std::vector<std::string> summary_lines() const;
  // Note [straggler report]; "" with fewer than two ranks to compare.
  std::string straggler_line() const;

 private:
  struct Region {
    const void* base = nullptr;
    size_t bytes = 0;
  };
  std::vector<flight::RankSnapshot> snapshots(const std::vector<RankRecord>& records) const;

  FlightOptions options_;
  std::vector<int> ranks_;
  std::vector<Region> regions_;  // by local rank; base null until mapped
  int64_t clock_restart_ns_ = 0;
  bool captured_ = false;
  int dumps_written_ = 0;
  std::string dump_error_;
  flight::Diagnosis diagnosis_;
};

}  // namespace ddp::launcher
