// The straggler report: per rank, time computing versus time waiting in
// collectives, and the ranks whose compute time is more than 10% above the
// median. ddprun prints it at the end of every multi-rank run (from the
// ranks' flight recorder regions); `train --metrics` rows carry it (rank 0
// gathers every rank's figures).
//
// Note [straggler report]
// An all_reduce equalises step times: every rank leaves it when the slowest
// arrives, so step time cannot tell which rank is slow. Waiting time can: the
// fast ranks wait in the collective for the slow one, which hardly waits. So
// a rank's time is split into waiting (some thread blocked in Work::wait, from
// the flight recorder's wait_begin/wait_end) and computing (the rest), and a
// rank whose computing time is more than 10% above the median of the ranks is
// named. Two sources of computing time:
//   - the trainer's step marks (mark_step_begin/end around each training
//     step): the steps' wall time minus the time blocked inside them, so that
//     evaluation and checkpoints (rank 0 saves alone) are not counted;
//   - without step marks (a program of the user's): the span from the rank's
//     first collective to its latest, minus its time blocked.
// A rank's first marked step is left out when it marked more than one: it pays the
// process's warm-up (first allocations, library plans and kernels compiled on first
// use), which a rank that joined late (a replacement under --on-failure continue)
// spreads over fewer steps, so it looked like a straggler.
// When the ranks marked different numbers of steps (uneven shares of the data
// under Join: a rank out of data shadows the others' all-reduces in steps
// that train does not mark), a rank with more steps computes longer without
// being slow; the report then compares compute per marked step, and says so
// ("uneven shares").
#pragma once

#include "collectives/flight/flight_layout.h"

#include <string>
#include <vector>

namespace ddp::flight {

struct RankActivity {
  int rank = 0;
  double compute_s = 0;  // Note [straggler report]
  double wait_s = 0;     // blocked in collectives
  int64_t steps = 0;     // step marks; 0: span-based figures
  // compute_s and wait_s leave out the first of several steps (its warm-up).
  bool first_step_left_out = false;
  // The steps compute_s and wait_s cover.
  int64_t counted_steps() const { return steps - (first_step_left_out ? 1 : 0); }
};

RankActivity activity_of(int rank, const RankStatus& status);

inline constexpr double kStragglerThreshold = 0.10;
// A rank is named only when its compute time also exceeds the median by this
// much in total: short runs differ by noise of a few milliseconds.
inline constexpr double kMinExcessS = 0.05;

struct StragglerReport {
  std::vector<RankActivity> ranks;  // by rank
  double median_compute_s = 0;      // per step when per_step
  bool per_step = false;            // the ranks' step counts differ (Note [straggler report])
  std::vector<int> stragglers;      // compute > (1 + threshold) x the median
  std::string text;                 // one line; "" with fewer than two ranks
};

// Note [straggler report after a failure]
// When the run ended in a failure or a hang, each rank's figures end where its
// records did: a rank stalled outside any collective has its stall in no figure
// (the span ends at its last collective; its open step is not marked), while a rank
// that waited for it computed one more forward/backward first, so that one looked
// like the straggler, against the blame. And the teardown cuts one rank's step
// short, so step counts that differ by one are no uneven shares. So after a
// failure the report says its figures end before it, names as the one the others
// wait for only a rank the failure's blame names, and calls step counts uneven
// only when they differ by more than one. ddprun sets it where its node blamed a
// rank; an interrupted job, or one another node's failure ended, keeps the plain
// report (nothing was blamed here to contradict).
struct StragglerOptions {
  double threshold = kStragglerThreshold;
  bool after_failure = false;  // the run ended in a failure or a hang
  std::vector<int> blamed;     // with after_failure: the ranks the blame names
};

// Ranks with no figures at all (compute and wait 0: no collective yet) are left
// out. A straggler computes more than (1 + threshold) x the median, and at
// least kMinExcessS more.
StragglerReport straggler_report(std::vector<RankActivity> ranks,
                                 const StragglerOptions& options = {});

}  // namespace ddp::flight
