// Clock alignment of the ranks' timelines (pure; unit-tested).
//
// Note [trace clocks]
// A rank records in its steady_clock (CLOCK_MONOTONIC), which counts from the
// node's boot: the ranks of one node share it, other nodes' clocks differ by
// anything from seconds to days and drift apart by up to tens of microseconds a
// second. Each rank measures the offset of its clock to one reference clock when
// its process group is made, and again when train ends the run; the merge maps
// every record through the offset interpolated between the samples (constant
// outside them).
//
// Each measurement bounds the offset (reference = local + offset). Asking a
// server for its time: the server read its clock between our send and our
// receive, so
//     remote - receive <= offset <= remote - send.
// The estimate is the middle of the intersection of all bounds, its error the
// half width. The tightest bounds decide, as the minimum-round-trip sample does in
// NTP, and the intersection is never wider than the best single round trip. When
// the bounds do not intersect (a clock was stepped meanwhile), the middle of the
// narrowest bound is taken instead.
//   Under ddprun the server is the store in ddprun on node 0 (its TIME request,
//   docs/store.md): every rank of every node is aligned to that one clock.
//   Without ddprun's store (mpirun, srun) rank 0's clock is the reference and
//   the bounds come from all_gather rounds: every rank reads its clock before it
//   enters (enter) and after it leaves (exit); a rank leaves only after every rank
//   entered, so rank 0's enter precedes our exit and our enter precedes rank 0's
//   exit:
//     ref_enter - my_exit <= offset <= ref_exit - my_enter.
//   Rank 0's exit of a round travels in the next round.
#pragma once

#include "runtime/trace.h"

#include <cstdint>
#include <vector>

namespace ddp::trace {

// reference = local + offset with low_ns <= offset <= high_ns, measured around local_ns.
struct OffsetBound {
  int64_t local_ns = 0;
  int64_t low_ns = 0;
  int64_t high_ns = 0;
};

// A time request: our clock at send and receive, the server's in between.
OffsetBound bound_from_request(int64_t send_ns, int64_t remote_ns, int64_t receive_ns);
// One all_gather round: our clock before and after it, the reference rank's too.
OffsetBound bound_from_round(int64_t my_enter_ns, int64_t my_exit_ns, int64_t ref_enter_ns,
                             int64_t ref_exit_ns);

struct OffsetEstimate {
  int64_t local_ns = 0;
  int64_t offset_ns = 0;
  int64_t error_ns = 0;
  bool intersected = true;  // false: the bounds disagreed, the narrowest one was used
};
// Throws ValueError for no bounds or a bound with low > high.
OffsetEstimate estimate_offset(const std::vector<OffsetBound>& bounds);

// The offset at local time `local_ns`: interpolated between the samples around it,
// the nearest sample's outside them, 0 without samples. The samples are sorted
// once (the merge maps every record twice).
class ClockMap {
 public:
  explicit ClockMap(std::vector<ClockSample> samples);
  int64_t offset_at(int64_t local_ns) const;

 private:
  std::vector<ClockSample> samples_;  // by local_ns
};
int64_t offset_at(const std::vector<ClockSample>& samples, int64_t local_ns);

}  // namespace ddp::trace
