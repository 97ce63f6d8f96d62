// init_process_group: reads the environment contract (runtime/env.h), connects
// the rendezvous store, picks the backend and binds the device, so the same
// program works under ddprun, mpirun, srun and alone.
//
// Ranks come from, in order: RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE (ddprun,
// torchrun), OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} (Open MPI),
// PMI_RANK/PMI_SIZE, SLURM_{PROCID,NTASKS,LOCALID}; none of them: a single
// process (world size 1, the local backend).
#pragma once

#include "collectives/backends.h"

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddp {

struct ProcessGroupOptions {
  std::string backend;  // auto|local|shm|gloo|mpi|nccl; empty: DDP_BACKEND, else auto
  std::optional<std::chrono::milliseconds> timeout;  // default DDP_TIMEOUT_S, else 300 s
  std::string device;  // empty: cuda:LOCAL_RANK when GPUs exist, else cpu
};

struct LaunchEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string launcher = "none";  // ddprun|mpirun|pmi|slurm|none
  std::string master_addr;
  int master_port = 0;
  std::string run_id;
  bool agent_store = false;  // the launcher hosts the store (DDPRUN_STORE=agent)
  // Where the store is: DDPRUN_STORE_ADDR (host:port) under ddprun, else
  // MASTER_ADDR/MASTER_PORT (rank 0 hosts it there when no agent does).
  std::string store_host;
  int store_port = 0;
  // DDPRUN_STORE_BACKUP: its backup (ddprun --rdzv-backup; Note [store failover] in
  // collectives/store/tcp_store.h); empty: none.
  std::string store_backup_host;
  int store_backup_port = 0;
  // DDPRUN_ON_FAILURE: what ddprun does when a rank fails (restart|continue|stop);
  // "continue": the ranks regroup (Note [elastic membership] in collectives/elastic.h).
  std::string on_failure;
  bool elastic() const { return on_failure == "continue"; }
  // DDPRUN_JOIN=1: a replacement started by ddprun for a rank that left; it has no
  // communicator until it joins the group (ProcessGroup::comm null; trainer/elastic.h).
  bool joining = false;
};
// Reads the variables; ValueError lists what it saw when they are inconsistent.
LaunchEnv read_launch_env();

class TcpStoreServer;

struct ProcessGroup {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<Store> store;            // null for world size 1 and for mpi without MASTER_ADDR
  std::shared_ptr<TcpStoreServer> server;  // set on the rank that hosts the store
  LaunchEnv env;  // env.rank/world_size: this rank's place now (an elastic regroup changes them)
  Device device;
  // What an elastic regroup needs to form the next communicator (collectives/elastic.h).
  int launch_rank = 0;  // env.rank as the launcher started the process
  // env.local_world_size at the start: launch rank r runs on node r / this
  // (ddprun starts as many ranks on every node), for the local numbers after a regroup.
  int launch_local_world_size = 1;
  int64_t membership = 0;    // the membership epoch of `comm` (Note [elastic membership])
  std::vector<int> members;  // its launch ranks, in rank order (0..W-1 at the start)
  std::string backend;       // of `comm`
  std::string shm_run_id;    // shm: the run id that names the segment
  CommOptions comm_options;
};

// The shm, gloo or nccl communicator of `rank` of `size` that rendezvous through
// `store` (gloo, nccl) or share the segment named by `shm_run_id` (shm).
// `abandon`: shm and gloo give up forming it once it returns true; nccl's
// watchdog fails the collectives in flight then (Note [nccl regroup]).
// `nccl_instance`: the store keys' instance of an nccl communicator; -1: the
// n-th made in this process (a fresh store namespace, as a regroup's, uses 0).
std::shared_ptr<Communicator> make_store_communicator(
    const std::string& backend, const std::shared_ptr<Store>& store, const LaunchEnv& env, int rank,
    int size, const std::string& shm_run_id, const CommOptions& options,
    const std::string& gloo_prefix = "", const std::function<bool()>& abandon = {},
    int nccl_instance = -1);

ProcessGroup init_process_group(const ProcessGroupOptions& options = {});

}  // namespace ddp
