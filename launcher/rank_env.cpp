#include "launcher/rank_env.h"

#include "collectives/store/tcp_store.h"
#include "runtime/env.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <utility>

extern char** environ;

namespace ddp::launcher {
namespace {

std::string key_of(const std::string& entry) {
  return entry.substr(0, entry.find('='));
}

void set_var(std::vector<std::string>& env, const std::string& key, const std::string& value) {
  std::erase_if(env, [&](const std::string& e) { return key_of(e) == key; });
  env.push_back(key + "=" + value);
}

void set_default(std::vector<std::string>& env, const std::string& key, const std::string& value) {
  const bool present =
      std::any_of(env.begin(), env.end(), [&](const std::string& e) { return key_of(e) == key; });
  if (!present) env.push_back(key + "=" + value);
}

}  // namespace

std::vector<std::string> rank_environment(const std::vector<std::string>& base,
                                          const RankEnvInputs& in) {
  std::vector<std::string> env = base;
  const std::pair<const char*, std::string> contract[] = {
      {env::kRank, std::to_string(in.rank)},
      {env::kLocalRank, std::to_string(in.local_rank)},
      {env::kWorldSize, std::to_string(in.world_size)},
      {env::kLocalWorldSize, std::to_string(in.local_world_size)},
      {env::kGroupRank, std::to_string(in.group_rank)},
      {env::kMasterAddr, in.master_addr},
      {env::kMasterPort, std::to_string(in.master_port)},
      {env::kRestartCount, std::to_string(in.restart_count)},
      {env::kOnFailure, in.on_failure},
      {env::kRunId, in.run_id},
      {env::kStore, "agent"},
      {env::kStoreAddr, in.store_addr},
      {env::kStoreBackup, in.store_backup},
      {kStoreSecretEnv, in.store_secret},
      // torchrun's (torch/distributed/elastic/agent/server/local_elastic_agent.py), one role.
      {"GROUP_WORLD_SIZE", std::to_string(in.group_world_size)},
      {"ROLE_NAME", "default"},
      {"ROLE_RANK", std::to_string(in.rank)},
      {"ROLE_WORLD_SIZE", std::to_string(in.world_size)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(in.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(in.max_restarts)},
      {"TORCHELASTIC_RUN_ID", in.run_id},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
  };
  for (const auto& [key, value] : contract) set_var(env, key, value);
  if (!in.backend.empty()) set_var(env, env::kBackend, in.backend);
  if (!in.hang_timeout_s.empty()) set_var(env, env::kHangTimeoutS, in.hang_timeout_s);
  if (!in.trace_dir.empty()) set_var(env, env::kTrace, in.trace_dir);
  set_default(env, "OMP_NUM_THREADS", std::to_string(in.threads));
  set_default(env, "OPENBLAS_NUM_THREADS", std::to_string(in.threads));
  set_default(env, "NCCL_ASYNC_ERROR_HANDLING", "1");  // torchrun's default too
  return env;
}

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

}  // namespace ddp::launcher
