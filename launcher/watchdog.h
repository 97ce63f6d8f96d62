// The watchdog: a small process forked by ddprun at start that outlives it by
// a moment. ddprun tells it (through a pipe) every rank process group it
// creates and reaps; when the pipe reaches end of file (ddprun exited or was
// SIGKILLed) it SIGKILLs every group still on its list, then exits. This covers
// what PR_SET_PDEATHSIG cannot: what the ranks started (Note [no orphans] in
// launcher/process.h).
#pragma once

#include <sys/types.h>

namespace ddp::launcher {

// Forks the watchdog. Call once, before any thread exists. Failure is not
// fatal (ddprun then relies on PR_SET_PDEATHSIG alone).
void start_watchdog();
// Record / forget a rank's process group; no-ops without a watchdog.
void watchdog_track(pid_t pgid);
void watchdog_untrack(pid_t pgid);

}  // namespace ddp::launcher
