// Flight recorder dumps: one JSON file per rank, flight_rank_<R>.json, written
// by the rank (on a timeout, on SIGUSR1) or by ddprun from the rank's region;
// read back by `ddprun analyze DIR`. The format (docs/flight_recorder.md) holds
// only objects, arrays, strings and integers: times are steady-clock
// nanoseconds of the rank's node, with `taken_ns` the moment of the dump, so
// every duration is computed within one rank and clocks of different nodes
// never meet.
#pragma once

#include "collectives/flight/flight_layout.h"

#include <string>
#include <string_view>
#include <vector>

namespace ddp::flight {

inline constexpr std::string_view kDumpFormat = "ddp flight recorder";
inline constexpr int64_t kDumpVersion = 1;

std::string to_json(const RankSnapshot& snapshot);
// Throws ValueError naming `origin` (a path) and what is wrong.
RankSnapshot from_json(std::string_view text, std::string_view origin = "dump");

// Note [dump directories]
// Dumps go where the user says (DDP_FLIGHT_DIR, ddprun's --log-dir), else
// below a directory of the user's own in the shared temporary directory,
// $TMPDIR/ddp_flight-<uid> (/tmp when TMPDIR is unset), made with mode 0700 and
// refused when it exists but is a link, another user's, or writable by
// others: nobody else can read the dumps, plant files among them or make a
// dump write through a link. Each dump is written to a temporary of its own
// (mkostemp) and renamed into place.

// $TMPDIR/ddp_flight-<uid>.
std::string private_dump_base();
// Makes `dir` (and, below private_dump_base(), checks that base as above).
// Throws Error naming the directory and the fix.
void make_dump_dir(const std::string& dir);

// Writes <dir>/flight_rank_<R>.json through a temporary and a rename, making
// `dir` first. Returns the path; throws Error naming the path when it fails.
std::string write_dump(const std::string& dir, const RankSnapshot& snapshot);

// Every flight_rank_*.json in `dir`, by rank. Throws ValueError when `dir` is
// not a readable directory, holds no dump, or a dump does not parse.
std::vector<RankSnapshot> read_dumps(const std::string& dir);

}  // namespace ddp::flight
