// The straggler report in `train --metrics` rows (Note [straggler report] in
// collectives/flight/straggler.h): every rank's compute and wait time per step
// since the row's epoch began, gathered at each row (an all_gather every rank
// runs, as the evaluation after it), and the ranks whose compute time is more
// than 10% above the median.
#pragma once

#include "collectives/communicator.h"
#include "collectives/flight/flight_layout.h"

#include <vector>

namespace ddp::train {

struct StragglerStats {
  std::vector<double> compute_ms, wait_ms;  // per step, by rank; empty: not measured
  std::vector<int> stragglers;
};

class StragglerMeter {
 public:
  // From now (an epoch's start).
  void start();
  // Every rank's figures since start(); a collective over `comm` (world size >
  // 1, every rank calls it at the same point). Empty without a flight recorder
  // (DDP_FLIGHT_RECORDER_SIZE=0) on this rank.
  StragglerStats measure(Communicator& comm) const;

 private:
  flight::RankStatus start_{};
};

}  // namespace ddp::train
