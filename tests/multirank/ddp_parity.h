// The golden parity check of DistributedDataParallel, shared by the forked-rank
// suite (ddp_parity_test.cpp, shm and gloo) and the mpirun program
// (mpi/ddp_parity_mpi.cpp): N ranks with kRowsPerRank rows each train to the same
// parameters as one process on the N * kRowsPerRank rows, SGD with momentum.
//
// Note [parity tolerance]: per tensor, max |ddp - reference| <= rel_tol * max
// |reference|. Without compression the two differ only in float32 summation
// order (per-rank means averaged versus one mean), about 1e-7 relative per
// step: kRelTol = 1e-5 leaves two orders of magnitude.
#pragma once

#include "collectives/communicator.h"
#include "collectives/ddp/distributed_data_parallel.h"
#include "runtime/nn/layers.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace ddp::test {

inline constexpr int64_t kRowsPerRank = 4;
inline constexpr int kSteps = 5;
inline constexpr double kRelTol = 1e-5;

// The MLP of models/ with small hidden layers; the same seed gives the same weights.
std::shared_ptr<nn::Sequential> tiny_mlp(uint64_t seed, std::vector<int64_t> hidden = {16, 8});

struct Batch {
  Tensor x, labels;
  Batch rows(int64_t begin, int64_t end) const {
    return {x.slice(begin, end), labels.slice(begin, end)};
  }
};

// The global batch of micro-batch `micro` of step `step`: world * kRowsPerRank rows.
Batch global_batch(int world, int step, int micro);
// Rank `rank`'s shard of it: rows [rank, rank + 1) * kRowsPerRank.
Batch rank_batch(int world, int rank, int step, int micro);

// One process on the whole batch for kSteps steps of SGD (lr 0.1, momentum 0.9),
// starting from tiny_mlp(1); micro-batches accumulate into .grad before a step.
std::shared_ptr<nn::Sequential> train_reference(int world, int micro_batches);

// The same steps through ddp on this rank's shards; all micro-batches but the
// last of a step run under ddp.no_sync().
void train_ddp(DistributedDataParallel& ddp, int rank, int world, int micro_batches);

// Throws std::runtime_error naming the rank and the parameter unless every
// parameter of `got` is within rel_tol of `want` (Note [parity tolerance]).
void expect_close(const nn::Module& got, const nn::Module& want, int rank,
                  double rel_tol = kRelTol);

struct ParityOptions {
  DdpOptions ddp{};  // first_bucket_mb is capped at bucket_cap_mb
  int micro_batches = 1;
  double rel_tol = kRelTol;
  // When set, registered with ddp.register_comm_hook before training (Note
  // [comm hooks]); wire_bytes_per_element: what it sends per element (0: unchecked).
  CommHookFn comm_hook{};
  int wire_bytes_per_element = 0;
};

// On every rank of comm (collective): wraps tiny_mlp(1 + rank), moved to
// comm->device() and trained on batches there (rank-dependent
// initial values, so only the broadcast from rank 0 makes them agree), trains
// with train_ddp and compares against train_reference. A bucket cap below 1e-3
// MB must give one bucket per parameter; a comm hook must send 2 bytes per
// element. Throws on the first difference.
void check_parity(const std::shared_ptr<Communicator>& comm, const ParityOptions& options);

}  // namespace ddp::test
