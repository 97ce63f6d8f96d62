// Command-line options of `ddprun`. Every flag is documented in kDdprunUsage
// (printed by --help) and docs/ddprun.md. Parsing is pure: no environment, no
// devices, no files, so it is unit-tested alone.
#pragma once

#include "runtime/error.h"

#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher {

struct LaunchOptions {
  std::string nproc_per_node = "1";  // N | gpu | auto, resolved by resolve_nproc()
  int nnodes = 1;
  int node_rank = 0;
  // MASTER_ADDR/MASTER_PORT of the ranks: where global rank 0 (of a PyTorch
  // program) hosts its store; nothing of ddprun listens there (Note [two stores]
  // in launcher/rendezvous.h).
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // The agents' store with --nnodes > 1: rdzv_host (empty: master_addr) and
  // rdzv_port (0: master_port + 1), bound on node 0 to rdzv_bind (empty: the
  // address rdzv_host resolves to). Unused with one node (a free loopback port).
  std::string rdzv_host;
  int rdzv_port = 0;
  bool rdzv_free_port = false;  // --rdzv-endpoint HOST:0 (torchrun's): --standalone's ports
  std::string rdzv_bind;
  // --rdzv-backup HOST:PORT (Note [store backup] in collectives/store/tcp_store.h):
  // node 1 hosts a backup of the agents' store there, which takes over, with
  // the membership, when node 0 is lost (--on-failure continue). Empty: none.
  std::string rdzv_backup_host;
  int rdzv_backup_port = 0;
  bool standalone = false;        // one node, MASTER_PORT a free port
  std::string backend;            // empty: leave DDP_BACKEND as the user set it
  std::string store_secret_file;  // DDP_STORE_SECRET from a file of mode 0600 (or 0400)
  double stopped_timeout_s = 30;  // a rank stopped this long ends the job; 0: never
  // No progress of any rank this long while one waits in a collective ends the
  // job (Note [hang detector]); 0: never; unset: Note [default hang timeout]
  // (launcher/flight_watch.h).
  std::optional<double> hang_timeout_s;
  int max_restarts = 0;
  // What a failed rank does to the group (Note [elastic membership] in
  // collectives/elastic.h): restart (the whole group, up to max_restarts), stop
  // (end the job), continue (the ranks left regroup and go on, while at least
  // min_ranks live; 0: unset, i.e. 1).
  std::string on_failure = "restart";
  int min_ranks = 0;
  // --on-failure continue across nodes: node 0 takes a node whose ddprun sent no
  // heartbeat this long out of the group (Note [nodes lost]; launcher/rendezvous.h).
  double node_timeout_s = 15;
  bool node_timeout_given = false;  // --node-timeout: refused where it has no effect
  std::string log_dir;              // per-rank stdout and stderr files; empty: the console only
  bool tee = false;                 // with log_dir: the console too
  bool quiet = false;               // only global rank 0 on the console
  double grace_period_s = 10;       // SIGTERM to SIGKILL
  double rdzv_timeout_s = 300;      // agents waiting for each other
  bool prefix = true;               // "[rank N] " before every line
  std::string trace_dir;            // --trace: the ranks' DDP_TRACE, merged at the end; empty: none
  bool module = false;     // -m/--module: PROGRAM is a Python module (python3 -u -m PROGRAM)
  bool no_python = false;  // --no-python: a .py PROGRAM is executed itself, not by python3
  std::string program;
  std::vector<std::string> program_args;
};

enum class ParseAction { run, help, version };

struct ParseResult {
  ParseAction action = ParseAction::run;
  LaunchOptions options;
};

// Options end at the first non-option argument (PROGRAM) or at "--"; the rest
// belongs to PROGRAM. Accepts "--flag value", "--flag=value", "-n 4", "-n4" and
// torchrun's underscore spellings ("--nproc_per_node"). Throws ValueError with
// the flag, the value and what is valid (the caller prints it with the usage
// and exits 2).
//
// --rdzv-endpoint HOST:PORT sets rdzv_host/rdzv_port (torchrun's c10d meaning:
// the agents' store), and master_addr too unless --master-addr was given.
ParseResult parse_ddprun_args(int argc, const char* const* argv);

// The number of local ranks for `spec` (N, "gpu" or "auto") given the visible
// GPUs. Throws ValueError for "gpu" without GPUs; `why_no_gpu` goes into that
// message.
int resolve_nproc(const std::string& spec, int gpu_count, const std::string& why_no_gpu = "");

// OMP_NUM_THREADS for each of `local_ranks` ranks on `cores` cores: at least 1.
int threads_per_rank(int cores, int local_ranks);

// The agents' store endpoint with --nnodes > 1 (see LaunchOptions).
std::string rdzv_store_host(const LaunchOptions& o);
int rdzv_store_port(const LaunchOptions& o);

// A usage error found after parsing (a missing secret, a secret file others can
// read): ddprun prints it and exits 2, like a bad flag.
class UsageError : public Error {
  using Error::Error;
};

extern const char* const kDdprunUsage;

}  // namespace ddp::launcher
