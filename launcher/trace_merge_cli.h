// ddprun's part of the timeline (docs/observability.md): the directory of
// --trace (or an inherited DDP_TRACE), the merge at the end of a run, and the
// `ddprun trace-merge DIR` subcommand.
#pragma once

#include "launcher/options.h"

#include <string>

namespace ddp::launcher {

// The absolute trace directory of this run (--trace DIR, else DDP_TRACE from
// ddprun's environment; "" for none), created now. Throws UsageError when it
// cannot be created.
std::string prepare_trace_dir(const LaunchOptions& o);
// `dir` created now, and absolute; UsageError naming `flag` when it cannot be
// created or written (--trace, --log-dir: exit status 2 before any rank starts).
std::string prepare_output_dir(const std::string& flag, const std::string& dir);

// Merges the rank files of run `run_id`, restart `restart`, into DIR/trace.json
// and says what it did; a failure is said, never thrown (the run's exit status
// stands).
void merge_run_trace(const std::string& dir, const std::string& run_id, int restart,
                     int world_size);

// `ddprun trace-merge DIR [--output FILE] [--run-id ID]`; argv[1] is "trace-merge".
// Returns the exit status: 0 merged, 1 nothing to merge, 2 bad usage.
int trace_merge_main(int argc, const char* const* argv);

extern const char* const kTraceMergeUsage;

}  // namespace ddp::launcher
