// Command-line options of `ddprun`. Every flag is documented in kDdprunUsage
// (printed by --help) and docs/ddprun.md. Parsing is pure: no environment, no
// devices, no files, so it is unit-tested alone.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher {

struct LaunchOptions {
  std::string nproc_per_node = "1";  // N | gpu | auto, resolved by resolve_nproc()
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool standalone = false;  // one node, a free port chosen by the store server
  std::string backend;      // empty: leave DDP_BACKEND as the user set it
  int max_restarts = 0;
  std::string log_dir;          // per-rank stdout and stderr files; empty: the console only
  bool tee = false;             // with log_dir: the console too
  bool quiet = false;           // only global rank 0 on the console
  double grace_period_s = 10;   // SIGTERM to SIGKILL
  double rdzv_timeout_s = 300;  // agents waiting for each other
  bool prefix = true;           // "[rank N] " before every line
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
ParseResult parse_ddprun_args(int argc, const char* const* argv);

// The number of local ranks for `spec` (N, "gpu" or "auto") given the visible
// GPUs. Throws ValueError for "gpu" without GPUs; `why_no_gpu` goes into that
// message.
int resolve_nproc(const std::string& spec, int gpu_count, const std::string& why_no_gpu = "");

// OMP_NUM_THREADS for each of `local_ranks` ranks on `cores` cores: at least 1.
int threads_per_rank(int cores, int local_ranks);

extern const char* const kDdprunUsage;

}  // namespace ddp::launcher
