// The per-rank trace file, DIR/rank_<R>.json (Note [timeline] in runtime/trace.h),
// and the merge of a run's files into one Chrome trace, DIR/trace.json.
//
// Note [trace files]
// A rank's file holds integers and strings only (so runtime/checkpoint/json.h
// reads it back exactly): times are nanoseconds of the rank's steady clock, and
// the clock samples say how to map them to the reference clock (Note [trace
// clocks]). Strings are valid UTF-8 (invalid bytes become U+FFFD). Format
// "ddp-trace", version 2:
//   {"format": "ddp-trace", "version": 2, "rank": R, "world_size": W,
//    "run_id": "...", "restart": K, "launcher": "ddprun", "backend": "shm",
//    "pid": P, "host": "...", "taken_ns": T, "dropped": N,
//    "clock": [{"local_ns": .., "offset_ns": .., "error_ns": .., "reference": ".."}],
//    "tracks": [{"id": 1, "name": "main", "os_tid": P}, ...],
//    "events": [{"ph": "X", "track": 1, "ts": .., "dur": .., "name": "forward",
//                "cat": "train", "args": {"step": 3}}, ...]}
// ph: X (a span; "unfinished": 1 when it was still open; "flow_out": ID and/or
// "flow_in": ID when it starts or ends a flow arrow), i (an instant).
// Version 1 (flow arrows as s/t/f events of their own) is no longer read.
// The merged file is the Chrome trace event format (JSON object form) that
// Perfetto and chrome://tracing open: a process per rank ("rank R", pid R + 1:
// Perfetto treats pid 0 as the idle process), a thread per track, times in
// microseconds from the first event of the run, all ranks on the reference
// clock. Flow arrows are bound to their slices ("bind_id" with "flow_out" /
// "flow_in": true, numbered anew across the ranks), so Perfetto and
// chrome://tracing draw them between the same slices.
#pragma once

#include "runtime/trace.h"

#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::trace {

// "rank_3.json"; a restarted group's files are kept apart: "rank_3_restart2.json".
std::string rank_file_name(int rank, int restart = 0);

// Writes `path` atomically: `write` fills a temporary file next to it, which is
// then renamed. Throws Error naming the path and the system's reason (the
// temporary is removed).
void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);

// `text` with every byte that is not part of valid UTF-8 replaced by U+FFFD.
std::string valid_utf8(std::string_view text);
// A JSON string of `text` as valid UTF-8 (Note [trace files]).
std::string json_string(std::string_view text);

void write_rank_file(std::ostream& out, const Snapshot& s);
// Throws ValueError naming `source` and what is wrong.
Snapshot parse_rank_file(std::string_view text, const std::string& source);

// The Chrome trace of these ranks (each rank's records mapped to the reference
// clock, Note [trace clocks]).
void write_chrome_trace(std::ostream& out, const std::vector<Snapshot>& ranks);

struct MergeOptions {
  std::string run_id;      // empty: the run of the newest file in DIR
  int restart = -1;        // -1: that run's latest restart (ddprun --max-restarts)
  int expected_ranks = 0;  // > 0: ranks 0..expected-1 should be there (missing ones are named)
  std::string output;      // empty: DIR/trace.json
};
struct MergeReport {
  std::string output;
  std::string run_id;
  int restart = 0;
  std::vector<int> ranks;            // merged
  std::vector<int> missing;          // expected, but no file
  std::vector<int> unreadable;       // expected, its file unreadable (skipped says why)
  std::vector<std::string> skipped;  // files of other runs or restarts, or unreadable ones (why)
  int64_t events = 0;
};
// Reads DIR/rank_*.json, keeps one run's files and writes the merge. Throws
// ValueError when DIR holds none.
MergeReport merge_trace_dir(const std::string& dir, const MergeOptions& options = {});
// "merged 2 ranks (1234 events) into DIR/trace.json; ..." for the launcher.
std::string describe(const MergeReport& report);

}  // namespace ddp::trace
