// The ddprun agent of one node: meets the other nodes' agents, runs this
// node's ranks (launcher/group.h), and restarts the whole group after a
// failure up to --max-restarts times. See docs/ddprun.md.
#pragma once

#include "launcher/options.h"

#include <string>

namespace ddp::launcher {

// Runs to the end and returns ddprun's exit status: 0 when every rank of every
// node succeeded, else the first failing rank's exit code (128 + signal when it
// died of one), or 128 + the signal that stopped ddprun. Throws ddp::Error
// (LaunchError) for its own failures: port in use, rendezvous, secrets, logs.
int run_agent(const LaunchOptions& options, const std::string& program_path);

}  // namespace ddp::launcher
