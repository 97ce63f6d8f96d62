// Node 0's address for the agents' store with --nnodes > 1: resolved with
// retries, and refused when it is a name that resolves to loopback (Note
// [node 0's address]).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace ddp::launcher {

struct LaunchOptions;

// Note [node 0's address]
// Without --rdzv-bind, node 0 binds the agents' store to the address
// --master-addr (or --rdzv-endpoint's HOST) resolves to:
//   - In Kubernetes, pod 0's DNS name may appear only after pod 0 started:
//     resolution is retried until --rdzv-timeout, saying so once, rather than
//     failing on the first try.
//   - On Debian, /etc/hosts maps the machine's own name to 127.0.1.1: bound
//     there, the store is unreachable from the other nodes, which would wait
//     --rdzv-timeout (300 s) for nothing. A *name* that resolves to loopback is
//     refused at once (a usage error, exit 2) naming the address and the fix,
//     --rdzv-bind 0.0.0.0. A loopback literal (127.0.0.1, ::1) or "localhost"
//     is taken as meant: several agents on one machine (the tests, a trial).

// The numeric addresses `host` resolves to, in getaddrinfo's order (the first
// is the one a listener binds); empty, with `error` set, when it does not.
std::vector<std::string> resolve_host(const std::string& host, std::string& error);

// 127.0.0.0/8, ::1 or an IPv4-mapped 127.x address.
bool is_loopback_address(const std::string& numeric);

// A numeric address or "localhost": loopback there is meant.
bool names_loopback_on_purpose(const std::string& host);

// On node 0 with --nnodes > 1: waits (up to `timeout`) for the store's host
// (which node 0 connects to as well) to resolve, then refuses a name resolving to loopback without
// --rdzv-bind. Throws LaunchError (exit 1) when it never resolves, UsageError (exit 2) for
// loopback, Interrupted on SIGINT/SIGTERM.
void check_node0_address(const LaunchOptions& o, std::chrono::milliseconds timeout);

}  // namespace ddp::launcher
