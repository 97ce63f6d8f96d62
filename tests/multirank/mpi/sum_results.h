// The verdict of an mpirun test program: every rank's passed/failed counts are
// summed over the communicator (a broken communicator: this rank's own), rank 0
// prints "<title>, world size N: P passed, F failed", and the exit code is 0
// only when nothing failed anywhere.
#pragma once

#include "collectives/communicator.h"

#include <cstdint>
#include <cstdio>

namespace ddp::test {

inline int sum_results(Communicator& comm, int rank, const char* title, int64_t passed,
                       int64_t failed) {
  Tensor counts = from_vector<int64_t>({passed, failed}, {2});
  try {
    comm.all_reduce(counts)->wait();
  } catch (const CommError& e) {
    std::fprintf(stderr, "[rank %d] cannot sum the results: %s\n", rank, e.what());
  }
  const auto total = counts.to_vector<int64_t>();
  if (rank == 0) {
    std::printf("%s, world size %d: %lld passed, %lld failed\n", title, comm.size(),
                static_cast<long long>(total[0]), static_cast<long long>(total[1]));
  }
  return total[1] == 0 && failed == 0 ? 0 : 1;
}

}  // namespace ddp::test
