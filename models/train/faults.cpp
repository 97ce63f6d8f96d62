#include "models/train/faults.h"

#include "runtime/error.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace ddp::train {

int64_t TestFaults::step_for(const char* name, int rank) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return -1;
  int r = -1;
  long long step = -1;
  char tail = 0;
  const bool any = value[0] == '*';
  if (any) r = rank;
  DDP_CHECK((any ? std::sscanf(value, "*:%lld%c", &step, &tail) == 1
                 : std::sscanf(value, "%d:%lld%c", &r, &step, &tail) == 2) &&
                step >= 1,
            "{}='{}': expected RANK:STEP or *:STEP, e.g. 1:7 (a testing aid)", name, value);
  return r == rank ? step : -1;
}

TestFaults TestFaults::from_env(int rank) {
  const char* restart = std::getenv("DDPRUN_RESTART_COUNT");
  if (restart != nullptr && std::string(restart) != "0") return {};
  return {step_for("DDP_TEST_KILL_AT", rank), step_for("DDP_TEST_NAN_AT", rank),
          step_for("DDP_TEST_NAN_WEIGHT_AT", rank)};
}

}  // namespace ddp::train
