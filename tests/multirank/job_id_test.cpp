// Note [job id]: the ranks of a job no launcher names (RANK, WORLD_SIZE and
// MASTER_ADDR/MASTER_PORT set by hand) share rank 0's job id in their flight
// recorders, and two such jobs differ, so `ddprun analyze` tells their dumps apart.
#include "collectives/bootstrap.h"
#include "collectives/flight/flight_recorder.h"
#include "tests/multirank/spawn.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <set>

namespace ddp::test {
namespace {

// Each rank prints "job id <ID>" to its stderr; the ids of one job's ranks.
std::set<std::string> job_ids_of_a_hand_started_job() {
  const auto results = spawn_ranks(2, [](int, int) -> int {
    for (const char* v :
         {"DDPRUN_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid"})
      unsetenv(v);
    ProcessGroupOptions o;
    o.backend = "gloo";
    o.device = "cpu";
    ProcessGroup pg = init_process_group(o);
    const flight::FlightRecorder* r = flight::recorder();
    if (r == nullptr) return 3;
    std::fprintf(stderr, "job id %s\n", r->snapshot().job.c_str());
    pg.comm->barrier()->wait();
    return 0;
  });
  std::set<std::string> ids;
  for (const RankResult& r : results) {
    EXPECT_TRUE(r.ok()) << r.describe();
    std::smatch m;
    static const std::regex kLine("job id (\\S*)\n");
    if (std::regex_search(r.stderr_text, m, kLine)) ids.insert(m[1].str());
  }
  return ids;
}

TEST(JobId, AHandStartedJobsRanksShareRankZerosId) {
  const std::set<std::string> first = job_ids_of_a_hand_started_job();
  ASSERT_EQ(first.size(), 1u) << "the ranks' job ids differ or are missing";
  EXPECT_FALSE(first.begin()->empty()) << "no job id";
  const std::set<std::string> second = job_ids_of_a_hand_started_job();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_NE(*first.begin(), *second.begin()) << "two jobs have one id";
}

}  // namespace
}  // namespace ddp::test
