// The environment of one rank: the agent's own, plus the contract of
// runtime/env.h (what torchrun sets) and the agent's store.
#pragma once

#include <string>
#include <vector>

namespace ddp::launcher {

struct RankEnvInputs {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int group_rank = 0;        // the node rank
  int group_world_size = 1;  // the number of nodes
  std::string master_addr;
  int master_port = 0;
  std::string store_addr;      // "host:port" of ddprun's store (Note [two stores])
  std::string store_backup{};  // "host:port" of its backup (--rdzv-backup); empty: none
  int restart_count = 0;
  int max_restarts = 0;
  std::string on_failure = "restart";  // DDPRUN_ON_FAILURE (Note [elastic membership])
  std::string hang_timeout_s;  // --hang-timeout as given (DDPRUN_HANG_TIMEOUT_S); empty: unset
  std::string run_id;
  std::string store_secret;
  std::string backend;    // empty: DDP_BACKEND is left as inherited
  int threads = 1;        // OMP_NUM_THREADS and OPENBLAS_NUM_THREADS, when the user set neither
  std::string trace_dir;  // --trace: DDP_TRACE; empty: left as inherited
};

// `base` is "KEY=VALUE" (the agent's environ). Contract variables replace any
// inherited value; OMP_NUM_THREADS and OPENBLAS_NUM_THREADS are added only when
// absent, each on its own. DDPRUN_STORE=agent and DDPRUN_STORE_ADDR tell our
// ranks where ddprun's store is (rank 0 hosts none); the TORCHELASTIC_* and
// ROLE_* variables are torchrun's, for PyTorch programs (TORCHELASTIC_USE_AGENT_STORE
// is False: their rank 0 hosts its store on MASTER_PORT).
std::vector<std::string> rank_environment(const std::vector<std::string>& base,
                                          const RankEnvInputs& in);

// The process's environment as "KEY=VALUE" strings.
std::vector<std::string> current_environment();

}  // namespace ddp::launcher
