#include "launcher/agent.h"

#include "collectives/store/socket.h"
#include "collectives/store/tcp_store.h"
#include "launcher/flight_watch.h"
#include "launcher/group.h"
#include "launcher/node_address.h"
#include "launcher/rank_env.h"
#include "launcher/rendezvous.h"
#include "launcher/secret_file.h"
#include "launcher/trace_merge_cli.h"
#include "launcher/watchdog.h"
#include "runtime/device.h"
#include "runtime/env.h"

#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <random>
#include <thread>

namespace ddp::launcher {
namespace {

using std::chrono::milliseconds;

// Rounded up: a positive duration under 1 ms is 1 ms, not 0 ("never").
milliseconds to_ms(double seconds) {
  return milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000)));
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
}

// `-n gpu` on a machine without one is a usage error (exit 2), like a bad flag.
int local_ranks(const LaunchOptions& o) {
  const std::string& spec = o.nproc_per_node;
  if (spec != "gpu" && spec != "auto") return resolve_nproc(spec, 0);
  const int gpus = device_count(DeviceType::cuda);
  try {
    return resolve_nproc(spec, gpus, gpus > 0 ? "" : unavailable_reason(DeviceType::cuda));
  } catch (const ValueError& e) {
    throw UsageError(e.what());
  }
}

// Note [store secret]: never printed. One node makes one up when none was
// given (the ranks get it in their environment, nothing else needs it);
// several nodes must share one, from the environment or a private file.
std::string store_secret(const LaunchOptions& o) {
  if (!o.store_secret_file.empty()) return read_secret_file(o.store_secret_file);
  std::string secret = store_secret_from_env();
  if (!secret.empty()) return secret;
  DDP_CHECK_T(UsageError, o.nnodes == 1,
              "--nnodes {} needs the store's secret, the same on every node: export "
              "DDP_STORE_SECRET (e.g. DDP_STORE_SECRET=$(openssl rand -hex 16)) or pass "
              "--store-secret-file FILE (mode 0600) on every node",
              o.nnodes);
  std::random_device rd;
  for (int i = 0; i < 16; ++i) secret += fmt::format("{:02x}", rd() & 0xff);
  return secret;
}

// --standalone: MASTER_PORT is a port that is free now, on the loopback
// interface (rank 0 binds it a moment later; torchrun has the same window).
int free_master_port(const std::string& addr) {
  return store_detail::local_port(store_detail::listen_on(addr, 0, 1).get());
}

// A PyTorch program's rank 0 hosts its store on MASTER_PORT (env://). Two jobs on
// one machine with the same port met there: the second's ranks joined the first's
// group and both could exit 0 with each other's sums. So, for a Python program on
// one node without --standalone, a port already in use is a usage error before any
// rank starts (torchrun's static rendezvous binds it in its agent). ddp's own ranks
// never bind MASTER_PORT (Note [two stores]): other programs are not checked.
void check_master_port_free(const LaunchOptions& o, const std::string& program_path) {
  const std::string name = std::filesystem::path(program_path).filename().string();
  if (o.standalone || o.nnodes > 1 || !name.starts_with("python")) return;
  // The wildcard, as torch's TCPStore binds it (a dual-stack IPv6 listener holds the
  // IPv4 port too); only "in use" refuses: any other failure is the program's to meet.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(o.master_port));
  const bool in_use =
      ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 && errno == EADDRINUSE;
  ::close(fd);
  DDP_CHECK_T(UsageError, !in_use,
              "MASTER_PORT {} is in use on this machine: rank 0 of the Python program hosts its "
              "store there, and another job's ranks would meet this one's. Pass --master-port "
              "with a free port, or --standalone (a free one chosen for you)",
              o.master_port);
}

RendezvousOptions rendezvous_options(const LaunchOptions& o, int nproc, const std::string& secret) {
  RendezvousOptions r{.nnodes = o.nnodes,
                      .node_rank = o.node_rank,
                      .local_ranks = nproc,
                      .timeout = to_ms(o.rdzv_timeout_s),
                      .secret = secret,
                      .elastic = o.on_failure == "continue",
                      .node_timeout = to_ms(o.node_timeout_s)};
  if (o.nnodes > 1) {  // Note [two stores]
    r.host = rdzv_store_host(o);
    r.port = rdzv_store_port(o);
    r.bind = o.rdzv_bind.empty() ? r.host : o.rdzv_bind;
    r.backup_host = o.rdzv_backup_host;  // Note [node 0 lost]
    r.backup_port = o.rdzv_backup_port;
  }
  return r;
}

GroupSpec make_spec(const LaunchOptions& o, const std::string& program_path, int nproc, int restart,
                    const std::string& secret, const Rendezvous& rendezvous) {
  GroupSpec spec;
  spec.program_path = program_path;
  spec.node_rank = o.node_rank;
  spec.world_size = o.nnodes * nproc;
  spec.restart = restart;
  spec.output = {.log_dir = o.log_dir, .tee = o.tee, .quiet = o.quiet, .prefix = o.prefix};
  spec.grace = to_ms(o.grace_period_s);
  spec.blame.stopped_timeout = to_ms(o.stopped_timeout_s);
  spec.elastic = o.on_failure == "continue";
  spec.min_ranks = std::max(1, o.min_ranks);
  spec.replacements = spec.elastic ? o.max_restarts : 0;
  std::optional<std::chrono::milliseconds> hang;  // Note [default hang timeout]
  if (o.hang_timeout_s) hang = to_ms(*o.hang_timeout_s);
  spec.flight = flight_options(rendezvous.run_id(), restart, o.log_dir, hang);
  spec.argv.push_back(o.program);
  spec.argv.insert(spec.argv.end(), o.program_args.begin(), o.program_args.end());
  const auto base = current_environment();
  const int threads = threads_per_rank(usable_cores(), nproc);
  const int master_port = o.standalone ? free_master_port(o.master_addr) : o.master_port;
  for (int i = 0; i < nproc; ++i) {
    const int rank = o.node_rank * nproc + i;
    spec.ranks.push_back(rank);
    spec.envs.push_back(rank_environment(
        base, {.rank = rank,
               .local_rank = i,
               .world_size = o.nnodes * nproc,
               .local_world_size = nproc,
               .group_rank = o.node_rank,
               .group_world_size = o.nnodes,
               .master_addr = o.master_addr,
               .master_port = master_port,
               .store_addr = rendezvous.endpoint(),
               .store_backup = rendezvous.backup_endpoint(),
               .restart_count = restart,
               .max_restarts = o.max_restarts,
               .on_failure = o.on_failure,
               .hang_timeout_s = o.hang_timeout_s ? fmt::format("{:g}", *o.hang_timeout_s) : "",
               .run_id = rendezvous.run_id(),
               .store_secret = secret,
               .backend = o.backend,
               .threads = threads,
               .trace_dir = o.trace_dir}));
  }
  return spec;
}

// After this node's ranks succeeded: the others' (node 0 keeps the store up
// for them until then).
GroupResult wait_for_other_nodes(Rendezvous& rendezvous, bool ranks_left) {
  rendezvous.publish_done();
  while (!rendezvous.all_done()) {
    if (const int sig = SignalPipe::stop_signal()) {
      // Note [a node interrupted]: this node's ranks succeeded, but node 0's store
      // goes with node 0's ddprun.
      if (!rendezvous.authority()) throw Interrupted(sig);
      say(Interrupted(sig).what());
      rendezvous.publish_interrupt(sig);
      return {Outcome::interrupted, 128 + sig};
    }
    if (auto failure = rendezvous.remote_failure()) {
      say(fmt::format("this node's {}, but the group failed: {}",
                      ranks_left ? "ranks are done (some left the group)" : "ranks succeeded",
                      failure->what));
      return {Outcome::remote_failed, failure->exit_code};
    }
    rendezvous.heartbeat();  // Note [a node gone]: node 0 waits for this node's ranks too
    std::this_thread::sleep_for(milliseconds(100));
  }
  return {Outcome::success, 0};
}

GroupResult run_attempt(const LaunchOptions& o, const std::string& program_path, int nproc,
                        int restart, const std::string& secret, Rendezvous& rendezvous,
                        SignalPipe& signals) {
  rendezvous.begin_attempt(restart);
  const GroupSpec spec = make_spec(o, program_path, nproc, restart, secret, rendezvous);
  GroupResult result = run_local_group(spec, signals, rendezvous);
  if (result.outcome == Outcome::success) {
    result = wait_for_other_nodes(rendezvous, result.ranks_left);
    // Note [exit barrier]: the authority keeps its store until the other agents
    // have read the end there -- a store gone under them is a failure to them (or,
    // under --rdzv-backup, a lost node 0: Note [node 0 lost]).
    if (result.outcome == Outcome::success)
      rendezvous.wait_for_others_to_leave(std::chrono::seconds(5));
  } else if (result.outcome != Outcome::interrupted && spec.elastic) {
    // Node 0 under continue: the other nodes read the failure from its store; after
    // a group stop their ranks may still regroup and save through it (Note [group
    // stop]), as long as ddprun waits for its own.
    rendezvous.wait_for_others_to_leave(spec.grace + std::chrono::seconds(5) +
                                        (result.group_stopped
                                             ? std::chrono::seconds(elastic::kGroupStopWait)
                                             : std::chrono::seconds(0)));
  }
  return result;
}

// Every attempt until one succeeds or none is left; `restart` ends as the last one's.
int run_attempts(const LaunchOptions& o, const std::string& program_path, int nproc,
                 const std::string& secret, Rendezvous& rendezvous, SignalPipe& signals,
                 int& restart) {
  for (restart = 0;; ++restart) {
    GroupResult result;
    try {
      result = run_attempt(o, program_path, nproc, restart, secret, rendezvous, signals);
    } catch (const Interrupted& e) {
      say(e.what());
      return 128 + e.signal();
    }
    // Note [exit barrier]: after a failed attempt the other nodes read the failure
    // here, then stop their ranks (the grace period); a store gone before they read
    // it was a lost store to them (exit 1 after the last attempt, the summary's
    // "lost the rendezvous store" before a restart), not the failing rank's code.
    // Before a restart this costs nothing: the next rendezvous waits for them anyway.
    // Signalled, node 0 waits too (Note [a node interrupted]): a second signal ends it.
    const bool failed = result.outcome != Outcome::success && o.on_failure != "continue";
    if (failed) {
      std::function<bool()> stop;  // by default, ddprun's signal ends the wait
      if (SignalPipe::stop_signal() != 0) {
        signals.drain();  // the signal that ended the attempt; a second one ends the wait
        // Once seen, for every node still waited for (the pipe is drained here).
        stop = [&signals, seen = false]() mutable {
          for (const int sig : signals.drain()) {
            if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) seen = true;
          }
          return seen;
        };
      }
      rendezvous.wait_for_others_to_leave(
          std::chrono::milliseconds(static_cast<int64_t>(o.grace_period_s * 1000)) +
              std::chrono::seconds(5),
          stop);
    }
    const bool interrupted_elsewhere = failed && rendezvous.interrupted_elsewhere();
    rendezvous.end_attempt();
    if (result.outcome == Outcome::success) return 0;
    if (SignalPipe::stop_signal() != 0) return result.exit_code;  // never restart then
    if (interrupted_elsewhere) {
      if (restart < o.max_restarts)
        say("no restart: another node's ddprun was stopped by a signal, and it never restarts");
      return result.exit_code;
    }
    // Under continue, --max-restarts counts replacements; a group that ended is not restarted.
    if (o.on_failure == "continue") return result.exit_code;
    if (restart >= o.max_restarts) {
      if (o.max_restarts > 0)
        say(fmt::format("no restarts left (--max-restarts {})", o.max_restarts));
      return result.exit_code;
    }
    say(fmt::format("restarting the group: restart {} of {}", restart + 1, o.max_restarts));
  }
}

}  // namespace

int run_agent(const LaunchOptions& options, const std::string& program_path) {
  start_watchdog();  // before the store server's thread exists
  remove_stale_region_dirs();
  LaunchOptions o = options;
  o.trace_dir = prepare_trace_dir(o);  // docs/observability.md
  if (!o.log_dir.empty()) prepare_output_dir("--log-dir", o.log_dir);
  check_master_port_free(o, program_path);
  const int nproc = local_ranks(o);
  // -n gpu|auto: the count is known only now (validate() checks a number at once).
  DDP_CHECK_T(UsageError, o.on_failure != "continue" || o.min_ranks <= int64_t{o.nnodes} * nproc,
              "--min-ranks {} is more than the {} ranks started (-n {} gives {} here{}): the job "
              "could never go on after a failure",
              o.min_ranks, int64_t{o.nnodes} * nproc, o.nproc_per_node, nproc,
              o.nnodes > 1 ? fmt::format(", x --nnodes {}", o.nnodes) : "");
  SignalPipe signals;
  const std::string secret = store_secret(o);
  try {
    check_node0_address(o, to_ms(o.rdzv_timeout_s));  // Note [node 0's address]
  } catch (const Interrupted& e) {
    say(e.what());
    return 128 + e.signal();
  }
  Rendezvous rendezvous(rendezvous_options(o, nproc, secret));
  int restart = 0;
  const int code = run_attempts(o, program_path, nproc, secret, rendezvous, signals, restart);
  // Node 0 merges what it sees: every rank's file when DIR is shared by the nodes.
  if (!o.trace_dir.empty() && o.node_rank == 0)
    merge_run_trace(o.trace_dir, rendezvous.run_id(), restart, o.nnodes * nproc);
  return code;
}

}  // namespace ddp::launcher
