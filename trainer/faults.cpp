#include "trainer/faults.h"

#include "runtime/error.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace ddp::train {

int64_t TestFaults::step_for(const char* name, int rank, const char* unit) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return -1;
  int64_t mine = -1;
  const std::string text = value;
  for (size_t at = 0; at <= text.size();) {  // RANK:STEP[,RANK:STEP...]
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string entry = text.substr(at, comma - at);
    int r = -1;
    long long step = -1;
    char tail = 0;
    const bool any = !entry.empty() && entry[0] == '*';
    if (any) r = rank;
    DDP_CHECK((any ? std::sscanf(entry.c_str(), "*:%lld%c", &step, &tail) == 1
                   : std::sscanf(entry.c_str(), "%d:%lld%c", &r, &step, &tail) == 2) &&
                  step >= 1,
              "{}='{}': expected RANK:{} or *:{} with {} >= 1, e.g. 1:7, or several separated by "
              "commas, e.g. 2:5,3:9 (a testing aid)",
              name, value, unit, unit, unit);
    if (r == rank && mine < 0) mine = step;
    at = comma + 1;
  }
  return mine;
}

TestFaults TestFaults::from_env(int rank) {
  const char* restart = std::getenv("DDPRUN_RESTART_COUNT");
  if (restart != nullptr && std::string(restart) != "0") return {};
  const char* join = std::getenv("DDPRUN_JOIN");  // a replacement (trainer/elastic.h)
  if (join != nullptr && std::string(join) == "1") return {};
  TestFaults f;
  f.kill_step = step_for("DDP_TEST_KILL_AT", rank);
  f.nan_step = step_for("DDP_TEST_NAN_AT", rank);
  f.nan_weight_step = step_for("DDP_TEST_NAN_WEIGHT_AT", rank);
  f.kill_in_update_step = step_for("DDP_TEST_KILL_IN_UPDATE", rank);
  f.kill_in_eval_step = step_for("DDP_TEST_KILL_IN_EVAL", rank);
  f.kill_in_report_step = step_for("DDP_TEST_KILL_IN_REPORT", rank);
  f.kill_in_save_step = step_for("DDP_TEST_KILL_IN_SAVE", rank);
  f.slow_ms = step_for("DDP_TEST_SLOW_RANK", rank, "MS");
  f.skip_allreduce_step = step_for("DDP_TEST_SKIP_ALLREDUCE", rank);
  return f;
}

CommHookFn skip_allreduce_hook(int64_t step, CommHook builtin) {
  auto calls = std::make_shared<int64_t>(0);
  return [step, calls, hook = builtin_comm_hook(builtin)](Communicator& comm, GradBucket& bucket) {
    if (bucket.index == 0) ++*calls;  // every synchronized backward starts with bucket 0
    if (bucket.index == 0 && *calls == step) return BucketFuture::ready(bucket.buffer);
    return hook(comm, bucket);
  };
}

}  // namespace ddp::train
