// One attempt of this node's ranks: spawned together, watched together (their
// exits, their output, ddprun's signals, the other nodes' failures) and
// stopped together.
//
//   rank fails (exit != 0 or a signal)  -> SIGTERM to every other rank's group,
//                                          SIGKILL after the grace period, summary
//   ddprun gets SIGINT/SIGTERM/SIGHUP   -> that signal to every rank's group,
//                                          SIGKILL after the grace period; a
//                                          second one: SIGKILL at once
//   another node's rank fails           -> as a local failure, without restarting here alone
//   a rank is stopped (SIGSTOP, ...)    -> reported at once; past --stopped-timeout it is
//                                          SIGKILLed and the others stopped as above
//   no rank progresses past --hang-timeout while one waits in a collective
//                                       -> diagnosed, blamed, stopped as above (Note
//                                          [hang detector] in launcher/flight_watch.h)
//   --on-failure continue               -> the rank to blame leaves instead (SIGKILLed if it
//                                          still runs), the next membership goes to the
//                                          store, the others go on; below --min-ranks the
//                                          job ends as above. Across nodes node 0 keeps the
//                                          membership and the others tell it what they see
//                                          (Note [nodes lost] in launcher/rendezvous.h)
// Which rank is to blame is launcher/blame.h's decision (Note [blame]).
#pragma once

#include "launcher/blame.h"
#include "launcher/flight_watch.h"
#include "launcher/process.h"
#include "launcher/rendezvous.h"

#include <chrono>
#include <string>
#include <vector>

namespace ddp::launcher {

struct OutputOptions {
  std::string log_dir;  // DIR/rank_<R>.out and .err; empty: none
  bool tee = false;     // with log_dir: the console as well
  bool quiet = false;   // only global rank 0 on the console
  bool prefix = true;   // "[rank N] "
};

struct GroupSpec {
  std::string program_path;                    // resolved
  std::vector<std::string> argv;               // argv[0] as typed
  std::vector<std::vector<std::string>> envs;  // the environment of each local rank
  std::vector<int> ranks;                      // the global rank of each local rank
  int node_rank = 0;
  int world_size = 1;  // every node's ranks
  int restart = 0;
  OutputOptions output;
  std::chrono::milliseconds grace{10000};
  BlamePolicy blame;
  FlightOptions flight;  // the ranks' flight recorders (launcher/flight_watch.h)
  // --on-failure continue: a failed rank leaves the group, which goes on while
  // min_ranks ranks live (Note [elastic membership] in collectives/elastic.h).
  bool elastic = false;
  int min_ranks = 1;
  int replacements = 0;  // --max-restarts under continue: processes started for ranks that left
};

enum class Outcome { success, rank_failed, remote_failed, interrupted };

struct GroupResult {
  Outcome outcome = Outcome::success;
  int exit_code = 0;  // ddprun's exit status for this outcome
  // Note [group stop] in collectives/elastic.h: the group stopped below --min-ranks,
  // its ranks left saving (other nodes' ranks too, through this node's store).
  bool group_stopped = false;
  // --on-failure continue: ranks of this node left the group (failed, and the group
  // went on without them); a success then means only that this node's part ended.
  bool ranks_left = false;
};

// Runs one attempt to the end: returns when every local rank is gone (and its
// process group is empty). Throws LaunchError when the log directory cannot be
// written or a rank cannot be started (the ranks already started are killed).
GroupResult run_local_group(const GroupSpec& spec, SignalPipe& signals, Rendezvous& rendezvous);

}  // namespace ddp::launcher
