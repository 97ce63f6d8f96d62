// Factories of the backends. Each backend lives in its own file; CMake compiles
// a stub that says how to enable it where it is not built.
#pragma once

#include "collectives/communicator.h"
#include "collectives/store/store.h"

#include <functional>
#include <memory>
#include <string>

namespace ddp {

// All ranks on one node, CPU tensors, POSIX shared memory (collectives/shm_communicator.cpp).
struct ShmOptions {
  int rank = 0;  // local rank == rank: every rank of the group is on this node
  int size = 1;
  std::string run_id;  // names the segment: /ddp-shm-<run_id>; the same on every rank
  CommOptions comm;
  // Polled while the ranks attach; true gives up at once with a CommError (an
  // elastic regroup whose membership lost a member meanwhile). Empty: never.
  std::function<bool()> abandon;
};
std::shared_ptr<Communicator> make_shm_communicator(const ShmOptions& options);

// CPU tensors over TCP with Debian's gloo; rendezvous through `store`.
struct GlooOptions {
  int rank = 0;
  int size = 1;
  std::string hostname;  // address other ranks reach this one at ("" = this host's name)
  CommOptions comm;
  // The store keys' prefix; empty: "gloo/<n>/" for the n-th gloo communicator of
  // the process (a counter in gloo_communicator.cpp). An elastic regroup names its own: a
  // replacement has made fewer communicators than the members it joins.
  std::string store_prefix;
  std::function<bool()> abandon;  // as ShmOptions::abandon, while the ranks connect
};
std::shared_ptr<Communicator> make_gloo_communicator(std::shared_ptr<Store> store,
                                                     const GlooOptions& options);

// Under mpirun/srun: MPI_COMM_WORLD (MPI is initialised on first use). CPU tensors,
// CUDA tensors staged through pinned host memory.
std::shared_ptr<Communicator> make_mpi_communicator(CommOptions options);
bool mpi_built();

// CUDA tensors on `device`; the unique id through `store` (rank 0 sets it).
struct NcclOptions {
  int rank = 0;
  int size = 1;
  int device = 0;
  CommOptions comm;
  // --on-failure continue: true once the group went on without a member of this
  // communicator; its watchdog then fails what is in flight (Note [nccl regroup]).
  std::function<bool()> abandon = nullptr;
  // The store keys' instance ("nccl/uid/<n>"); -1: the n-th communicator made in
  // this process (every rank makes them in the same order).
  int instance = -1;
};
std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Store> store,
                                                     const NcclOptions& options);

}  // namespace ddp
