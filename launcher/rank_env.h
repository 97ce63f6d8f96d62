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
  int group_rank = 0;  // the node rank
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  std::string run_id;
  std::string store_secret;
  std::string backend;  // empty: DDP_BACKEND is left as inherited
  int threads = 1;      // OMP_NUM_THREADS and OPENBLAS_NUM_THREADS, when the user set neither
};

// `base` is "KEY=VALUE" (the agent's environ). Contract variables replace any
// inherited value; OMP_NUM_THREADS and OPENBLAS_NUM_THREADS are added only when
// absent, each on its own. DDPRUN_STORE=agent tells rank 0 not to host the store.
std::vector<std::string> rank_environment(const std::vector<std::string>& base,
                                          const RankEnvInputs& in);

// The process's environment as "KEY=VALUE" strings.
std::vector<std::string> current_environment();

}  // namespace ddp::launcher
