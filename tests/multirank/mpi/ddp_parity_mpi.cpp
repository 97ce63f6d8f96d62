// Golden parity of DistributedDataParallel over the mpi backend (ranks from
// mpirun, so a program rather than a gtest suite; the checks are the shared ones
// of ddp_parity.h):
//
//   mpirun -np 3 ddp_parity_mpi    default buckets, many buckets (one per
//                                  parameter) and no_sync accumulation; prints
//                                  "N passed, M failed" on rank 0 and exits
//                                  non-zero when a check failed on any rank
#include "collectives/backends.h"
#include "tests/multirank/conformance.h"
#include "tests/multirank/ddp_parity.h"
#include "tests/multirank/mpi/sum_results.h"

#include <cstdio>
#include <string>
#include <vector>

namespace ddp::test {
namespace {

using namespace std::chrono_literals;

struct Case {
  std::string name;
  ParityOptions options;
};

std::vector<Case> cases() {
  ParityOptions many_buckets;
  many_buckets.ddp.bucket_cap_mb = 1e-6;
  ParityOptions no_sync{.micro_batches = 2};
  ParityOptions no_sync_many_buckets = many_buckets;
  no_sync_many_buckets.micro_batches = 2;
  return {{"default buckets", {}},
          {"many buckets", many_buckets},
          {"no_sync accumulation", no_sync},
          {"no_sync accumulation, many buckets", no_sync_many_buckets}};
}

int run() {
  // The cases run one after another on one communicator: a failed comparison
  // (expect_close, local to a rank) comes after the case's last collective, so
  // the ranks stay in step for the next case.
  auto comm = make_mpi_communicator({.timeout = 60s});
  const int rank = comm->rank();
  int64_t passed = 0, failed = 0;
  for (const Case& c : cases()) {
    try {
      check_parity(comm, c.options);
      ++passed;
    } catch (const std::exception& e) {
      ++failed;
      std::fprintf(stderr, "[rank %d] FAILED %s: %s\n", rank, c.name.c_str(), e.what());
    }
  }
  return sum_results(*comm, rank, "ddp parity over mpi", passed, failed);
}

}  // namespace
}  // namespace ddp::test

int main() {
  try {
    return ddp::test::run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_parity_mpi: %s\n", e.what());
    return 1;
  }
}
