// Hang diagnosis: one pure function over the ranks' flight recorder snapshots
// that says, in the user's words, which rank holds the job back and in which
// collective. ddprun prints it when it tears down a failed or hung group and
// `ddprun analyze DIR` prints it from saved dumps.
//
// Note [hang diagnosis]
// Collectives of one communicator match across ranks by sequence number (each
// rank numbers its collectives 0, 1, ... in issue order), so for every
// communicator (comm id; ranks make theirs in the same order):
//   1. mismatch: the first sequence number that two ranks used for different
//      collectives (kind, reduce op, root, dtype, count or label): "collective
//      mismatch at #57: rank 1 called broadcast(root 0) of 10 i64 ('ddp bucket
//      order'), ranks 0,2,3 all_reduce(sum) of 1024 f32 ('ddp bucket 3')". The
//      ranks of a strict minority are suspects.
//   2. the stuck collective: the lowest sequence number that some rank issued
//      and did not complete. Ranks that never issued it are named first ("rank
//      2 never entered all_reduce #1234 (ddp bucket 3, 1.2 MB); ranks 0,1,3 have
//      waited 300 s in it") and are the suspects; when every rank entered it,
//      the ranks that did not complete it are ("... ranks 0,1,3 completed it,
//      rank 2 did not"; in one node's view of a larger world, not those that
//      wait in it: they wait for ranks elsewhere); when none completed it, the
//      stopped or dead ones are.
// A rank's process state (stopped, exited), known to ddprun, is said with its
// name. Durations are measured on each rank's own clock, up to its snapshot's
// taken_ns, so dumps from several nodes combine. Ranks expected but without a
// snapshot (another node, no dump) are named as unseen; where the ranks wrote
// their own dumps on a timeout (mpirun), a rank without one never timed out in
// a collective, which makes it the suspect when every other entered it.
#pragma once

#include "collectives/flight/flight_layout.h"

#include <string>
#include <string_view>
#include <vector>

namespace ddp::flight {

// The recorder's nanoseconds as seconds.
inline double seconds(int64_t ns) {
  return static_cast<double>(ns) / 1e9;
}

struct DiagnosisOptions {
  // The ranks this view should cover; empty: 0 .. world size - 1. ddprun passes
  // its local ranks, so other nodes' ranks are not reported missing.
  std::vector<int> expected_ranks;
  // What an expected rank without a snapshot lacks: "no dump", "no flight
  // recorder (...)"; said as "rank 1: no dump; ...".
  std::string missing_reason = "no dump";
  // Missing ranks would have dumped had a collective timed out on them (dumps
  // the ranks wrote themselves, as under mpirun): when every rank in view
  // entered the stuck collective, the missing ones are the suspects.
  bool missing_would_have_dumped = true;
  // The view is one node's of a larger world (ddprun with --nnodes > 1): the
  // ranks outside expected_ranks are on other nodes, said once.
  bool other_ranks_elsewhere = false;
  // The snapshots were taken because the job hung (ddprun's hang detector, or
  // another node's hang answered here: Note [hang on several nodes] in
  // launcher/group.cpp). A view with nothing pending then says which ranks are
  // stalled outside any collective (and names them as suspects) instead of
  // calling the job healthy or the snapshot a running job's.
  bool hang = false;
};

struct Diagnosis {
  std::vector<std::string> lines;  // most important first; never empty
  std::vector<int> suspects;       // global ranks it points at; empty: none in view
};

Diagnosis diagnose(const std::vector<RankSnapshot>& ranks, const DiagnosisOptions& options = {});

// One line per rank: pid, process state, the collective it waits in and for
// how long, its last completed collective (`ddprun analyze` prints these).
std::vector<std::string> rank_lines(const std::vector<RankSnapshot>& ranks);

// "all_reduce(sum) of 1024 f32", "broadcast(root 0) of 10 i64", "barrier"
std::string describe_shape(const CollectiveRecord& r);
// "1.2 MB", "4.1 KB", "12 B" (decimal units)
std::string human_bytes(int64_t bytes);
// "rank 2", "ranks 0,1,3", "ranks 0-5,7"
std::string rank_list(std::vector<int> ranks);
// The same with other nouns ("node 3", "nodes 1-63,65"); past 12 runs it ends
// ",... (N in all)".
std::string id_list(std::vector<int> ids, std::string_view one, std::string_view many);

}  // namespace ddp::flight
